"""Which position encodings keep their accuracy when the test-time resolution changes: checkpoints
trained at one image size, each evaluated by ``ijepa eval`` at several sizes.

Each checkpoint goes through ``ijepa eval``'s own adaptation at every size (learned tables
interpolated, sin-cos and RoPE rebuilt, as ``ijepa validate --data.image_size`` does) and the
protocols of ``--config`` (default ``configs/eval/resolution.yaml``: k-NN and logistic regression,
each selected on validation). The data of one size is rendered once and shared by every checkpoint.

    python -m ijepa.studies.resolution_eval runs/resolution/*/lightning_logs/version_0/checkpoints/last.ckpt \\
        --scales 0.5 0.75 1 1.5 2 --figure docs/images/resolution_eval.png

prints a Markdown table per protocol (mean ± standard deviation over the checkpoints of each
position encoding, in %, and the change from the training size), writes every score to
``--output`` (JSON) and the figure (PNG).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from ijepa.evaluation.runner import Evaluation, build_parser
from ijepa.pictures import line_chart, to_png

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "eval" / "resolution.yaml"


def trained_at(path: str) -> tuple[str, int]:
    """``(pos_embed, image_size)`` a checkpoint was trained with."""
    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return saved["hyper_parameters"]["pos_embed"], int(saved["datamodule_hyper_parameters"]["image_size"])


def sizes_for(train_size: int, patch_size: int, scales: list[float]) -> list[int]:
    """``scale * train_size`` rounded to a multiple of the patch size (the grid must be whole)."""
    return [max(patch_size, round(scale * train_size / patch_size) * patch_size) for scale in scales]


def summarise(scores: dict, sizes: list[int], train_size: int) -> str:
    """Markdown tables: one row per encoding, one column per size, mean ± std over seeds (in %),
    and the change of the mean at the smallest and largest size from the training size."""
    lines = []
    for protocol, by_encoding in scores.items():
        lines += [f"\n{protocol} (test top-1, %):\n"]
        header = " | ".join(f"{s} px ({s / train_size:.2g}x)" for s in sizes)
        lines += [f"| `pos_embed` | seeds | {header} | change at {sizes[0]} px | change at {sizes[-1]} px |"]
        lines += ["|---|---|" + "---|" * (len(sizes) + 2)]
        for encoding, by_size in by_encoding.items():
            means = {s: statistics.mean(by_size[s]) * 100 for s in sizes}
            cells = [
                f"{means[s]:.1f} ± {statistics.stdev([100 * v for v in by_size[s]]) if len(by_size[s]) > 1 else 0:.1f}"
                for s in sizes
            ]
            base = means[train_size]
            lines += [
                f"| `{encoding}` | {len(by_size[train_size])} | "
                + " | ".join(cells)
                + f" | {means[sizes[0]] - base:+.1f} | {means[sizes[-1]] - base:+.1f} |"
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="*", help="checkpoints trained at one image size")
    parser.add_argument(
        "--merge", nargs="+", default=None, help="instead of evaluating: the --output files of earlier runs, combined"
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="an ijepa eval config (data and protocols)")
    parser.add_argument("--scales", nargs="+", type=float, default=[0.5, 0.75, 1.0, 1.5, 2.0])
    parser.add_argument("--output-dir", default="runs/resolution_eval", help="the results files of each evaluation")
    parser.add_argument("--output", default="resolution_eval.json")
    parser.add_argument("--figure", default=None, help="PNG of the table (one panel per protocol)")
    args = parser.parse_args(argv)
    if args.merge:
        return report(*merged(args.merge), args)
    if not args.checkpoints:
        parser.error("give checkpoints to evaluate, or --merge the results of earlier runs")

    trained = {path: trained_at(path) for path in args.checkpoints}
    train_sizes = {size for _, size in trained.values()}
    if len(train_sizes) != 1:
        raise ValueError(f"the checkpoints were trained at several image sizes {sorted(train_sizes)}; give one size.")
    train_size = train_sizes.pop()
    first = torch.load(args.checkpoints[0], map_location="cpu", weights_only=True, mmap=True)
    sizes = sizes_for(train_size, int(first["hyper_parameters"]["patch_size"]), args.scales)
    if train_size not in sizes:
        sizes = sorted({*sizes, train_size})

    eval_parser = build_parser()
    config = eval_parser.parse_args(["--config", args.config, "--checkpoint", args.checkpoints[0]])
    init = eval_parser.instantiate_classes(config)
    scores: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for size in sizes:
        data = copy.deepcopy(init.data)
        data.image_size = size  # one EvalData per size: its images are rendered once for every checkpoint
        for path, (encoding, _) in trained.items():
            run = Path(path).parents[3].name if len(Path(path).parents) > 3 else Path(path).stem
            evaluation = Evaluation(
                path,
                copy.deepcopy(init.protocols),
                data=data,
                output_dir=str(Path(args.output_dir) / run / f"{size}px"),
                cache=False,
                accelerator="cpu",
            )
            for result in evaluation.run():
                scores[result["name"]][encoding][size].append(result["test_top1"])
                print(
                    f"{encoding:14s} {size:4d} px {result['name']:8s} test top-1 = {result['test_top1']:.4f}  ({path})"
                )

    plain = {p: {e: {str(s): v for s, v in by_size.items()} for e, by_size in enc.items()} for p, enc in scores.items()}
    with open(args.output, "w") as f:
        json.dump(
            {"train_image_size": train_size, "sizes": sizes, "checkpoints": trained, "scores": plain}, f, indent=1
        )
    return report(scores, sizes, train_size, args)


def merged(paths: list[str]) -> tuple[dict, list[int], int]:
    """``(scores, sizes, train size)`` of several ``--output`` files of one study (their
    checkpoints' scores side by side, e.g. one file per seed)."""
    scores: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    found = [json.loads(Path(path).read_text()) for path in paths]
    if len({(f["train_image_size"], tuple(f["sizes"])) for f in found}) != 1:
        raise ValueError(f"--merge: {paths} were trained or evaluated at different sizes.")
    for f in found:
        for protocol, by_encoding in f["scores"].items():
            for encoding, by_size in by_encoding.items():
                for size, values in by_size.items():
                    scores[protocol][encoding][int(size)] += values
    return scores, found[0]["sizes"], found[0]["train_image_size"]


def report(scores: dict, sizes: list[int], train_size: int, args: argparse.Namespace) -> dict:
    """Print the tables and write the figure (``--figure``); returns the scores as plain data."""
    print(summarise(scores, sizes, train_size))
    plain = {p: {e: {str(s): v for s, v in by_size.items()} for e, by_size in enc.items()} for p, enc in scores.items()}
    if args.figure:
        panels = [
            (
                protocol,
                {
                    encoding: [
                        (
                            size / train_size,
                            100 * statistics.mean(values),
                            100 * statistics.stdev(values) if len(values) > 1 else 0.0,
                        )
                        for size, values in by_size.items()
                    ]
                    for encoding, by_size in by_encoding.items()
                },
            )
            for protocol, by_encoding in scores.items()
        ]
        chart = line_chart(panels, "image size / training size", "test top-1 %", [s / train_size for s in sizes])
        Path(args.figure).write_bytes(to_png(chart))
    return plain


if __name__ == "__main__":
    main()
