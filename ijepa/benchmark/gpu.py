"""The GPU suite: ``python -m ijepa.benchmark.gpu`` on a machine with one GPU.

Runs the benchmark in bf16-mixed for the STL-10 ViT-Tiny/8 and ViT-Small/8 configs (96 px) and a
ViT-B/16 at 224 px (the STL-10 ViT-Small config with a ViT-B encoder and a 384-wide, 6-deep
predictor), and prints images/s and model FLOP utilisation for each (with the seed-style baseline, the
one-pass predictor, the static-shape step compiled with CUDA graphs (``--no-static`` skips it)
and the k-NN probe time), plus one JSON line each. Synthetic images: no
dataset needed. Well under a minute per model on an H100-class GPU. Extra ``--model.*`` /
``--data.*`` arguments go to every model, e.g. ``--model.compile=true``.
"""

from __future__ import annotations

import argparse
import json

import torch

from ijepa.benchmark import format_table, parse_args, run

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}

SUITE = {
    "vit_tiny_96": ("configs/stl10_vit_tiny.yaml", []),
    "vit_small_96": ("configs/stl10_vit_small.yaml", []),
    "vit_base16_224": (
        "configs/stl10_vit_small.yaml",
        [
            "--data.image_size=224",
            "--model.patch_size=16",
            "--model.embed_dim=768",
            "--model.depth=12",
            "--model.num_heads=12",
            "--model.predictor_embed_dim=384",
            "--model.predictor_depth=6",
            "--model.predictor_num_heads=12",
            "--data.batch_size=128",
        ],
    ),
}


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of a known GPU, from its name."""
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(SUITE), choices=list(SUITE))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16-mixed", choices=("32-true", "bf16-mixed"))
    parser.add_argument("--peak-tflops", type=float, default=None, help="default: looked up from the GPU's name")
    parser.add_argument("--output", default=None, help="also append each result as a JSON line to this file")
    parser.add_argument("--no-knn", dest="knn", action="store_false")
    parser.add_argument(
        "--no-static", dest="static", action="store_false", help="skip the static-shape compiled step (CUDA graphs)"
    )
    parser.add_argument(
        "--compile-backend", default=None, help="torch.compile backend of the static step (default inductor)"
    )
    args, extra = parser.parse_known_args(argv)  # e.g. --model.compile=true, passed to every model
    args.extra = extra
    peak = args.peak_tflops
    if peak is None and args.device.startswith("cuda") and torch.cuda.is_available():
        peak = peak_tflops(torch.cuda.get_device_name())
    results = []
    for name in args.models:
        config, overrides = SUITE[name]
        bench_args = parse_args(
            [
                "--config",
                config,
                *overrides,
                *args.extra,
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--precision",
                args.precision,
                "--device",
                args.device,
                *([] if args.knn else ["--no-knn"]),
                *(["--static-compiled", "--compile-mode", "reduce-overhead"] if args.static else []),
                *(["--compile-backend", args.compile_backend] if args.static and args.compile_backend else []),
                *(["--peak-tflops", str(peak)] if peak else []),
            ]
        )
        result = {"model": name, **run(bench_args)}
        print(format_table(result))
        print("BENCHMARK " + json.dumps(result), flush=True)
        results.append(result)
        if args.output:
            with open(args.output, "a") as file:
                file.write(json.dumps(result) + "\n")
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return results


if __name__ == "__main__":
    main()
