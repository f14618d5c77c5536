"""Small exports: file size, load time and feature error of a checkpoint's encoder exported as a
Hugging Face ``IJepaModel`` folder in fp32 and in bf16 (``ijepa convert ... hf --dtype bf16``).

    python -m ijepa.studies.export lightning_logs/version_0/checkpoints/last.ckpt --loads 5

writes both folders with :func:`ijepa.interop.save_hf` into a temporary folder and prints one
Markdown row per (dtype, loader): the ``model.safetensors`` size in bytes and MiB, the median
time of ``--loads`` loads (after one untimed load, which pays for imports and reads the file into
the page cache) with :func:`ijepa.interop.load_hf` (a float32 encoder) and, if transformers is
importable, ``IJepaModel.from_pretrained`` (in the stored dtype, computing in it), and the largest
absolute difference of their features from the checkpoint's float32 encoder on a fixed batch
(``--batch-size`` seeded Gaussian images at the checkpoint's size), also relative to the largest
feature magnitude. ``--output`` also writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ijepa.interop import load_encoder, load_hf, save_hf

DTYPES = ("fp32", "bf16")
MIB = 1 << 20


def timed_loads(load, loads: int) -> tuple[float, object]:
    """Median seconds of ``loads`` calls of ``load()`` after an untimed one, and the last result."""
    model = load()
    times = []
    for _ in range(loads):
        start = time.perf_counter()
        model = load()
        times.append(time.perf_counter() - start)
    return statistics.median(times), model


def loaders(folder: Path) -> dict:
    """``{name: (load, features)}``: how each library loads ``folder`` and computes the features."""
    found = {"load_hf": (lambda: load_hf(folder), lambda model, images: model(images))}
    if importlib.util.find_spec("transformers") is not None:
        from transformers import IJepaModel

        found["transformers"] = (
            lambda: IJepaModel.from_pretrained(folder),
            lambda model, images: model(pixel_values=images.to(model.dtype)).last_hidden_state,
        )
    return found


@torch.no_grad()
def measure(checkpoint: str, loads: int = 5, batch_size: int = 8, encoder: str = "target") -> list[dict]:
    """One row per (dtype, loader); see the module's docstring."""
    reference = load_encoder(checkpoint, encoder)
    size = reference.patch_embed.image_size
    images = torch.randn(batch_size, 3, size, size, generator=torch.Generator().manual_seed(0))
    expected = reference(images)
    scale = expected.abs().max().item()
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        for dtype in DTYPES:
            folder = save_hf(reference, Path(temporary) / dtype, dtype=dtype)
            nbytes = (folder / "model.safetensors").stat().st_size
            for name, (load, features) in loaders(folder).items():
                seconds, model = timed_loads(load, loads)
                model_dtype = next(model.parameters()).dtype
                error = (features(model, images).float() - expected).abs().max().item()
                rows.append(
                    {
                        "format": "hf",
                        "dtype": dtype,
                        "bytes": nbytes,
                        "mib": nbytes / MIB,
                        "loader": name,
                        "computes_in": str(model_dtype).removeprefix("torch."),
                        "load_seconds": seconds,
                        "max_abs_difference": error,
                        "relative_difference": error / scale if scale else float("nan"),
                    }
                )
    return rows


def table(rows: list[dict], loads: int) -> str:
    lines = [
        f"| format | dtype | file bytes | MiB | loader (computes in) | load, median of {loads} | max abs feature "
        "difference (relative) |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['format']} | {row['dtype']} | {row['bytes']:,} | {row['mib']:.2f} | {row['loader']} "
            f"({row['computes_in']}) | {1000 * row['load_seconds']:.1f} ms | {row['max_abs_difference']:.3g} "
            f"({row['relative_difference']:.2g}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="an ijepa fit checkpoint (or a weights-only conversion)")
    parser.add_argument("--loads", type=int, default=5, help="timed loads per (dtype, loader); the median is shown")
    parser.add_argument("--batch-size", type=int, default=8, help="images of the fixed batch the features compare on")
    parser.add_argument("--encoder", choices=("target", "online"), default="target")
    parser.add_argument("--output", help="also write the rows here (JSON)")
    args = parser.parse_args(argv)
    if args.loads < 1 or args.batch_size < 1:
        parser.error("--loads and --batch-size must be at least 1")
    rows = measure(args.checkpoint, args.loads, args.batch_size, args.encoder)
    print(f"{args.checkpoint} ({args.encoder} encoder):\n")
    print(table(rows, args.loads))
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
