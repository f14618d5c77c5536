"""The benchmark: ``python -m ijepa.benchmark --config configs/quickstart.yaml [--data.batch_size=64 ...]``.

For one config it measures, on synthetic images of the config's size and masks from its own
sampler (no dataset needed):

* training-step throughput in images/s: forward, backward, AdamW step and EMA update, median
  over ``--steps`` steps after ``--warmup``; the same for the seed-style baseline
  (:mod:`ijepa.benchmark.baseline`) with the same weights, after checking both give the same
  loss on one batch;
* model FLOPs per step (``torch.utils.flop_counter``) and, on a GPU, model FLOP utilisation
  against ``--peak-tflops``;
* peak memory (CUDA allocator, or the process's peak RSS on CPU);
* mask sampling in masks/s on one process, ours and per-sample Python;
* the k-NN probe's time (encode bank + queries, vote) at the dataset's sizes.

It prints a table and one JSON line (``BENCHMARK {...}``). Figures are for comparison within one
run; machines are noisy, so report ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import time
from contextlib import nullcontext
from unittest import mock

import torch

from ijepa.benchmark.baseline import SeedIJEPA, python_masks
from ijepa.callbacks.ema import EMATargetUpdate, ema_update_
from ijepa.callbacks.knn import knn_scores

KNN_SIZES = {"stl10": (5000, 8000), "imagefolder": (5000, 1000)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, warmup: int, repeats: int, device: torch.device) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn(i)`` after ``warmup`` calls."""
    for i in range(warmup):
        fn(i)
    _sync(device)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(warmup + i)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def build(config: str, overrides: list[str]):
    """Model and datamodule exactly as ``ijepa fit --config config ...`` would build them."""
    from ijepa.cli import build_cli

    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["--config", config, *overrides, "--trainer.logger=false"], run=False)
    return cli.model, cli.datamodule


def synthetic_batches(datamodule, count: int, device: torch.device, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``count`` masked batches of random images at the config's size and batch size."""
    hp = datamodule.hparams
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        images = torch.randn(hp.batch_size, 3, hp.image_size, hp.image_size, generator=generator)
        context, targets = datamodule.mask_sampler(hp.batch_size, generator)
        batches.append({"images": images.to(device), "context_indices": context.to(device),
                        "target_indices": targets.to(device)})
    return batches


def step_flops(loss_fn, batch) -> int:
    """Model FLOPs of one forward + backward (``torch.utils.flop_counter``)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(batch).backward()
    return counter.get_total_flops()


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, datamodule = build(args.config, args.override)
    hp = datamodule.hparams
    model.to(device).train()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16-mixed" else nullcontext()
    batches = synthetic_batches(datamodule, 4, device)
    result = {"config": args.config, "overrides": args.override, "device": torch.cuda.get_device_name(device)
              if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
              "precision": args.precision, "batch_size": hp.batch_size, "image_size": hp.image_size,
              "torch": torch.__version__}

    # --- same math: both losses on one batch, same weights --------------------------------------
    baseline = SeedIJEPA(model).to(device).train() if args.baseline else None
    if baseline is not None:
        with torch.no_grad():
            result["loss"] = float(model.jepa_loss(batches[0]))
            result["baseline_loss"] = float(baseline.loss(batches[0]))

    # --- training steps --------------------------------------------------------------------------
    optimizer = model.build_optimizer()
    ema = EMATargetUpdate(0.996)
    target_params, online_params = ema.parameter_pairs(model)

    def ours(i: int) -> None:
        with autocast:
            loss = model.jepa_loss(batches[i % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            ema_update_(target_params, online_params, 0.996)

    def with_flops(loss_fn):
        with autocast:
            return step_flops(loss_fn, batches[0])

    model.setup("fit")  # what Lightning does before training (CPU: flush denormals)
    result["flops_per_step"] = with_flops(model.jepa_loss)
    optimizer.zero_grad(set_to_none=True)
    times = time_calls(ours, args.warmup, args.steps, device)
    result["images_per_s"] = hp.batch_size / statistics.median(times)
    result["peak_memory_mb"] = peak_memory_mb(device)
    achieved = result["flops_per_step"] / statistics.median(times)
    result["achieved_tflops"] = achieved / 1e12
    if args.peak_tflops:
        result["mfu"] = achieved / (args.peak_tflops * 1e12)

    if baseline is not None:
        base_optimizer = torch.optim.AdamW([p for p in baseline.parameters() if p.requires_grad], lr=1e-4, foreach=False)

        def seed_style(i: int) -> None:
            with autocast:
                loss = baseline.loss(batches[i % len(batches)])
            base_optimizer.zero_grad()
            loss.backward()
            base_optimizer.step()
            baseline.ema_update(0.996)

        torch.set_flush_denormal(False)  # the seed-style code leaves torch's default
        base_times = time_calls(seed_style, args.warmup, args.steps, device)
        torch.set_flush_denormal(True)
        result["baseline_images_per_s"] = hp.batch_size / statistics.median(base_times)
        result["speedup"] = result["images_per_s"] / result["baseline_images_per_s"]
        del baseline, base_optimizer

    # --- mask sampling (one process) --------------------------------------------------------------
    sampler, generator = datamodule.mask_sampler, torch.Generator().manual_seed(0)
    mask_times = time_calls(lambda i: sampler(hp.batch_size, generator), 2, args.mask_repeats, torch.device("cpu"))
    result["masks_per_s"] = hp.batch_size / statistics.median(mask_times)
    if args.baseline:
        settings = dict(num_blocks=sampler.num_target_blocks, target_scale=sampler.target_scale,
                        target_aspect_ratio=sampler.target_aspect_ratio, context_scale=sampler.context_scale,
                        min_keep=sampler.min_keep, generator=torch.Generator().manual_seed(0))
        py_times = time_calls(lambda i: python_masks(hp.batch_size, sampler.grid_size, **settings), 1,
                              max(3, args.mask_repeats // 10), torch.device("cpu"))
        result["baseline_masks_per_s"] = hp.batch_size / statistics.median(py_times)
        result["mask_speedup"] = result["masks_per_s"] / result["baseline_masks_per_s"]
    result["masks_per_training_image"] = result["masks_per_s"] / result["images_per_s"]

    # --- k-NN probe -------------------------------------------------------------------------------
    if args.knn:
        bank, queries = (hp.shapes_train_size, hp.shapes_val_size) if hp.dataset == "shapes" else KNN_SIZES[hp.dataset]
        if args.knn_limit:
            bank, queries = min(bank, args.knn_limit), min(queries, args.knn_limit)
        model.eval()
        eval_batch = torch.randn(hp.knn_batch_size, 3, hp.image_size, hp.image_size, device=device)

        def probe(_: int) -> None:
            features = []
            with autocast:
                for start in range(0, bank + queries, hp.knn_batch_size):
                    features.append(model.features(eval_batch[: min(hp.knn_batch_size, bank + queries - start)]).float())
            features = torch.cat(features)
            labels = torch.randint(0, 10, (bank,), device=device)
            knn_scores(features[:bank], labels, features[bank:], 10)

        result["knn_seconds"] = statistics.median(time_calls(probe, 0, 1, device))
        result["knn_bank"], result["knn_queries"] = bank, queries
    return result


def format_table(result: dict) -> str:
    rows = [("training step (images/s)", f"{result['images_per_s']:.1f}")]
    if "baseline_images_per_s" in result:
        rows += [("  seed-style baseline (images/s)", f"{result['baseline_images_per_s']:.1f}"),
                 ("  speedup", f"{result['speedup']:.2f}x"),
                 ("  loss, ours / baseline (same weights, one batch)", f"{result['loss']:.6f} / {result['baseline_loss']:.6f}")]
    rows += [("model GFLOPs per step (fwd + bwd)", f"{result['flops_per_step'] / 1e9:.1f}"),
             ("achieved TFLOP/s", f"{result['achieved_tflops']:.3f}")]
    if "mfu" in result:
        rows.append(("model FLOP utilisation", f"{100 * result['mfu']:.1f}%"))
    rows += [("peak memory (MiB)", f"{result['peak_memory_mb']:.0f}"),
             ("mask sampling (masks/s, one process)", f"{result['masks_per_s']:.0f}")]
    if "baseline_masks_per_s" in result:
        rows += [("  per-sample Python (masks/s)", f"{result['baseline_masks_per_s']:.0f}"),
                 ("  speedup", f"{result['mask_speedup']:.1f}x")]
    rows.append(("masks/s per training image/s", f"{result['masks_per_training_image']:.1f}x"))
    if "knn_seconds" in result:
        rows.append((f"k-NN probe ({result['knn_bank']} bank + {result['knn_queries']} queries, s)", f"{result['knn_seconds']:.2f}"))
    width = max(len(name) for name, _ in rows)
    header = f"{result['config']} {' '.join(result['overrides'])} on {result['device']}, {result['precision']}, batch {result['batch_size']}"
    return "\n".join([header] + [f"  {name:<{width}}  {value}" for name, value in rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ijepa.benchmark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--mask-repeats", type=int, default=50)
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    parser.add_argument("--no-knn", dest="knn", action="store_false")
    parser.add_argument("--knn-limit", type=int, default=None, help="cap bank and queries (quick runs)")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if not o.startswith(("--model.", "--data.", "--trainer."))]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides must be --model.*, --data.* or --trainer.*)")
    args.override = overrides
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(format_table(result))
    print("BENCHMARK " + json.dumps(result))
    return result
