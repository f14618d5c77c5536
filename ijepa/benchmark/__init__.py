"""The benchmark: ``python -m ijepa.benchmark --config configs/quickstart.yaml [--data.batch_size=64 ...]``.

For one config it measures, on synthetic images of the config's size and masks from its own
sampler (no dataset needed):

* training-step throughput in images/s: forward, backward, AdamW step and EMA update, median
  over ``--steps`` steps after ``--warmup``; the same for the seed-style baseline
  (:mod:`ijepa.benchmark.baseline`) with the same weights, after checking both give the same
  loss on one batch. The variants are timed in interleaved rounds (``--rounds``), so a change
  in the machine's speed during the run hits all of them alike;
* model FLOPs per step (``torch.utils.flop_counter``) and, on a GPU, model FLOP utilisation
  against ``--peak-tflops``;
* peak memory (CUDA allocator, or the process's peak RSS on CPU);
* the same step with the one-pass predictor (``model.predictor_mode=one_pass``), an option that
  changes the math, reported on its own line;
* with ``--static-compiled``, the step on static-shape masks (``data.masks.init_args.context_policy=static``)
  under ``torch.compile(dynamic=False)`` (``--compile-mode reduce-overhead``: CUDA graphs), timed
  in the same rounds as the eager step;
* mask sampling in masks/s on one process, ours and per-sample Python;
* what one DataLoader worker delivers in images/s (augmentation under per-sample seeding, then
  collation with masks), against the training step's images/s;
* the k-NN probe's time (encode bank + queries, vote) at the dataset's sizes.

It prints a table and one JSON line (``BENCHMARK {...}``). Figures are for comparison within one
run; machines are noisy, so report ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import resource
import statistics
import time
from contextlib import nullcontext

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from ijepa.benchmark.baseline import SeedIJEPA, python_masks
from ijepa.callbacks.ema import EMATargetUpdate, ema_update_
from ijepa.callbacks.throughput import step_flops  # what ThroughputLogger logs during fit
from ijepa.classifiers import knn_scores
from ijepa.cli import instantiate
from ijepa.data.batch import GridBatch
from ijepa.data.collate import MaskCollator, masked_batch
from ijepa.data.sampling import SeededSamples
from ijepa.data.sources import DataSource, ShapesSource, STL10Source
from ijepa.masks import MultiBlockMaskSampler


def probe_sizes(source: DataSource) -> tuple[int, int]:
    """The probes' bank and query counts for ``source``: generated shapes know theirs, STL-10's
    are 5,000 and 8,000, anything else is timed at an assumed 5,000 and 1,000."""
    if isinstance(source, ShapesSource):
        return source.train_size, source.val_size
    if isinstance(source, STL10Source):
        return 5000, 8000
    return 5000, 1000


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
    return instantiate(config, overrides)


def synthetic_batches(
    datamodule, count: int, device: torch.device, seed: int = 0, sampler: MultiBlockMaskSampler | None = None
) -> list[GridBatch]:
    """``count`` masked batches of random images at the config's size and batch size, masks from
    ``sampler`` (default: the data's own) with the entries its context policy adds."""
    hp = datamodule.hparams
    sampler = sampler or datamodule.mask_sampler
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        images = torch.randn(hp.batch_size, 3, hp.image_size, hp.image_size, generator=generator)
        batch = masked_batch(images, sampler, *sampler(hp.batch_size, generator))
        batches.append(move_data_to_device(batch, device))
    return batches


class _RandomImages(torch.utils.data.Dataset):
    """``count`` random uint8 images ``[3, size, size]`` through ``transform``, label 0."""

    def __init__(self, count: int, size: int, transform):
        self.images = torch.randint(
            0, 256, (count, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
        )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        from torchvision import tv_tensors

        return self.transform(tv_tensors.Image(self.images[index])), 0


def worker_images_per_s(datamodule, repeats: int = 3) -> float:
    """Images/s one DataLoader worker delivers: the config's training augmentation under per-sample
    seeding, then collation with mask sampling, for whole batches, on one thread (as a worker
    runs). Source images are uint8 at the model's image size (STL-10's own 96 px); decoding
    files, as an image folder would, is not included."""
    hp = datamodule.hparams
    dataset = SeededSamples(_RandomImages(hp.batch_size, hp.image_size, datamodule.train_transform()), seed=0)
    collate = MaskCollator(datamodule.mask_sampler)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = time_calls(
            lambda epoch: collate([dataset[(i, epoch)] for i in range(hp.batch_size)]), 1, repeats, torch.device("cpu")
        )
    finally:
        torch.set_num_threads(threads)
    return hp.batch_size / statistics.median(times)


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
    result = {
        "config": args.config,
        "overrides": args.override,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
        "precision": args.precision,
        "batch_size": hp.batch_size,
        "image_size": hp.image_size,
        "torch": torch.__version__,
    }

    # --- same math: both losses on one batch, same weights --------------------------------------
    baseline = SeedIJEPA(model).to(device).train() if args.baseline else None
    if baseline is not None:
        # The baseline has no regulariser: compare the JEPA part of the loss. The timed step below
        # is the config's own, regularisers included (result["sigreg_weight"] and
        # result["varcov_weight"] say whether they were on).
        with torch.no_grad(), model.regularisers_off():
            result["loss"] = float(model.jepa_loss(batches[0]))
            result["baseline_loss"] = float(baseline.loss(batches[0]))
    weights = {name: float(member.weight) for member, name in zip(model.regularizers, model.regularizer_log_names)}
    result["sigreg_weight"] = weights.get("sigreg", 0.0)
    result["varcov_weight"] = weights.get("varcov", 0.0)

    # --- training steps --------------------------------------------------------------------------
    optimizer = model.build_optimizer()
    ours = training_step(model, optimizer, batches, autocast)

    def with_flops(loss_fn):
        with autocast:
            return step_flops(loss_fn, batches[0])

    model.setup("fit")  # what Lightning does before training (CPU: flush denormals)
    result["flops_per_step"] = with_flops(model.jepa_loss)  # eager: the counter does not see compiled kernels
    model.configure_model()  # model.compile=true compiles here, as under Lightning
    result["compiled"] = bool(model.hparams.compile)
    optimizer.zero_grad(set_to_none=True)

    # Each variant: (step function, flush denormals, predictor mode). The one-pass predictor is an
    # option that changes the math and is reported on its own line.
    variants = {"ours": (ours, True, "per_block")}
    # the one-pass predictor refuses encodings that mix tokens after a block (peg)
    if args.one_pass and model.predictor.mode == "per_block" and "after_block" not in model.predictor.position.hooks():
        variants["one_pass"] = (ours, True, "one_pass")
    if args.static_compiled:
        compile_options = {"mode": args.compile_mode, "backend": args.compile_backend}
        static_step, static_model = static_compiled_step(model, datamodule, device, autocast, compile_options)
        variants["static_compiled"] = (static_step, True, None)
    if baseline is not None:
        base_optimizer = torch.optim.AdamW(
            [p for p in baseline.parameters() if p.requires_grad], lr=1e-4, foreach=False
        )

        def seed_style(i: int) -> None:
            with autocast:
                loss = baseline.loss(batches[i % len(batches)])
            base_optimizer.zero_grad()
            loss.backward()
            base_optimizer.step()
            baseline.ema_update(0.996)

        variants["baseline"] = (seed_style, False, None)  # the seed-style code leaves torch's default

    def timed(name: str, warmup: int, steps: int) -> list[float]:
        step, flush, mode = variants[name]
        torch.set_flush_denormal(flush)
        model.predictor.mode = mode or "per_block"
        try:
            return time_calls(step, warmup, steps, device)
        finally:
            model.predictor.mode = "per_block"
            torch.set_flush_denormal(True)

    # Warm-up (ours first, so the peak memory is ours alone), then interleaved rounds, so that
    # drift in the machine's speed hits every variant alike.
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = {"ours": timed("ours", args.warmup, 0)}
    result["peak_memory_mb"] = peak_memory_mb(device)
    for name in variants:
        times[name] = timed(name, args.warmup if name != "ours" else 0, 0)
    per_round = max(1, -(-args.steps // args.rounds))
    for _ in range(args.rounds):
        for name in variants:
            times[name] += timed(name, 0, per_round)
    median = {name: statistics.median(values) for name, values in times.items()}
    result["steps_timed"] = len(times["ours"])
    result["images_per_s"] = hp.batch_size / median["ours"]
    achieved = result["flops_per_step"] / median["ours"]
    result["achieved_tflops"] = achieved / 1e12
    if args.peak_tflops:
        result["mfu"] = achieved / (args.peak_tflops * 1e12)
    if "one_pass" in median:
        result["one_pass_images_per_s"] = hp.batch_size / median["one_pass"]
    if "static_compiled" in median:
        result["static_compiled_images_per_s"] = hp.batch_size / median["static_compiled"]
        result["static_compiled_over_eager"] = median["ours"] / median["static_compiled"]
        result["static_shapes"] = static_model.static_shapes
        if args.peak_tflops:
            result["static_compiled_mfu"] = (
                result["flops_per_step"] / median["static_compiled"] / (args.peak_tflops * 1e12)
            )
        del static_model
    if "baseline" in median:
        result["baseline_images_per_s"] = hp.batch_size / median["baseline"]
        result["speedup"] = median["baseline"] / median["ours"]
        if "one_pass" in median:
            result["one_pass_speedup"] = median["baseline"] / median["one_pass"]
        del baseline, base_optimizer, variants

    # --- data loading: what one DataLoader worker delivers ---------------------------------------
    if args.data:
        result["worker_images_per_s"] = worker_images_per_s(datamodule, args.data_repeats)
        result["worker_per_training_image"] = result["worker_images_per_s"] / result["images_per_s"]

    # --- mask sampling (one process) --------------------------------------------------------------
    sampler, generator = datamodule.mask_sampler, torch.Generator().manual_seed(0)
    mask_times = time_calls(lambda i: sampler(hp.batch_size, generator), 2, args.mask_repeats, torch.device("cpu"))
    result["masks_per_s"] = hp.batch_size / statistics.median(mask_times)
    if args.baseline:
        settings = dict(
            num_blocks=sampler.num_target_blocks,
            target_scale=sampler.target_scale,
            target_aspect_ratio=sampler.target_aspect_ratio,
            context_scale=sampler.context_scale,
            min_keep=sampler.min_keep,
            generator=torch.Generator().manual_seed(0),
        )
        py_times = time_calls(
            lambda i: python_masks(hp.batch_size, sampler.grid_size, **settings),
            1,
            max(3, args.mask_repeats // 10),
            torch.device("cpu"),
        )
        result["baseline_masks_per_s"] = hp.batch_size / statistics.median(py_times)
        result["mask_speedup"] = result["masks_per_s"] / result["baseline_masks_per_s"]
    result["masks_per_training_image"] = result["masks_per_s"] / result["images_per_s"]

    # --- k-NN probe -------------------------------------------------------------------------------
    if args.knn:
        bank, queries = probe_sizes(datamodule.source)
        if args.knn_limit:
            bank, queries = min(bank, args.knn_limit), min(queries, args.knn_limit)
        model.eval()
        eval_batch = torch.randn(hp.probe_batch_size, 3, hp.image_size, hp.image_size, device=device)

        def probe(_: int) -> None:
            features = []
            with autocast:
                for start in range(0, bank + queries, hp.probe_batch_size):
                    features.append(
                        model.features(eval_batch[: min(hp.probe_batch_size, bank + queries - start)]).float()
                    )
            features = torch.cat(features)
            labels = torch.randint(0, 10, (bank,), device=device)
            knn_scores(features[:bank], labels, features[bank:], 10)

        result["knn_seconds"] = statistics.median(time_calls(probe, 0, 1, device))
        result["knn_bank"], result["knn_queries"] = bank, queries
    return result


def training_step(model, optimizer, batches: list[GridBatch], autocast):
    """``step(i)``: forward, backward and optimizer step of ``model`` on ``batches[i % len]``,
    then the EMA update of its target encoder."""
    target_params, online_params = EMATargetUpdate(0.996).parameter_pairs(model)

    def step(i: int) -> None:
        with autocast:
            loss = model.jepa_loss(batches[i % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            ema_update_(target_params, online_params, 0.996)

    return step


def static_compiled_step(model, datamodule, device: torch.device, autocast, options: dict):
    """A copy of ``model`` compiled for static shapes (``dynamic=False``, plus the non-None
    ``options`` of ``torch.compile``: ``mode="reduce-overhead"`` for CUDA graphs) and its training
    step on synthetic batches whose masks follow the config's settings under
    ``context_policy="static"``: ``(step, model)``, the model carrying ``static_shapes`` (context
    count, target block size)."""
    sampler = datamodule.image_sampler(datamodule.grid_size, context_policy="static")
    batches = synthetic_batches(datamodule, 4, device, sampler=sampler)
    compiled = copy.deepcopy(model)
    compiled.hparams.compile = True
    compiled.hparams.compile_options = {"dynamic": False, **{k: v for k, v in options.items() if v is not None}}
    compiled._compiled = False
    compiled.configure_model()
    compiled.static_shapes = (sampler.static_context, sampler.static_targets)
    return training_step(compiled, compiled.build_optimizer(), batches, autocast), compiled


def format_table(result: dict) -> str:
    rows = [("training step (images/s)", f"{result['images_per_s']:.1f}")]
    if "baseline_images_per_s" in result:
        rows += [
            ("  seed-style baseline (images/s)", f"{result['baseline_images_per_s']:.1f}"),
            ("  speedup", f"{result['speedup']:.2f}x"),
            (
                "  JEPA loss, ours / baseline (same weights, one batch)",
                f"{result['loss']:.6f} / {result['baseline_loss']:.6f}",
            ),
        ]
        if result.get("sigreg_weight"):
            rows.append(("  our step adds SIGReg, the baseline's does not (weight)", f"{result['sigreg_weight']:g}"))
        if result.get("varcov_weight"):
            rows.append(
                (
                    "  our step adds VICReg's variance-covariance terms, the baseline's does not (weight)",
                    f"{result['varcov_weight']:g}",
                )
            )
    if "one_pass_images_per_s" in result:
        rows.append(("one-pass predictor, different math (images/s)", f"{result['one_pass_images_per_s']:.1f}"))
        if "one_pass_speedup" in result:
            rows.append(("  speedup over the baseline", f"{result['one_pass_speedup']:.2f}x"))
    if "static_compiled_images_per_s" in result:
        context, targets = result["static_shapes"]
        rows += [
            (
                f"static shapes + torch.compile (context {context}, blocks of {targets}) (images/s)",
                f"{result['static_compiled_images_per_s']:.1f}",
            ),
            ("  over the eager step", f"{result['static_compiled_over_eager']:.2f}x"),
        ]
        if "static_compiled_mfu" in result:
            rows.append(("  model FLOP utilisation", f"{100 * result['static_compiled_mfu']:.1f}%"))
    rows += [
        ("model GFLOPs per step (fwd + bwd)", f"{result['flops_per_step'] / 1e9:.1f}"),
        ("achieved TFLOP/s", f"{result['achieved_tflops']:.3f}"),
    ]
    if "mfu" in result:
        rows.append(("model FLOP utilisation", f"{100 * result['mfu']:.1f}%"))
    rows += [
        ("peak memory (MiB)", f"{result['peak_memory_mb']:.0f}"),
        ("mask sampling (masks/s, one process)", f"{result['masks_per_s']:.0f}"),
    ]
    if "baseline_masks_per_s" in result:
        rows += [
            ("  per-sample Python (masks/s)", f"{result['baseline_masks_per_s']:.0f}"),
            ("  speedup", f"{result['mask_speedup']:.1f}x"),
        ]
    rows.append(("masks/s per training image/s", f"{result['masks_per_training_image']:.1f}x"))
    if "worker_images_per_s" in result:
        rows += [
            ("data loading, one worker (images/s: augment + masks)", f"{result['worker_images_per_s']:.0f}"),
            ("  per training image/s", f"{result['worker_per_training_image']:.2f}x"),
        ]
    if "knn_seconds" in result:
        rows.append(
            (
                f"k-NN probe ({result['knn_bank']} bank + {result['knn_queries']} queries, s)",
                f"{result['knn_seconds']:.2f}",
            )
        )
    width = max(len(name) for name, _ in rows)
    header = f"{result['config']} {' '.join(result['overrides'])} on {result['device']}, {result['precision']}, batch {result['batch_size']}"
    return "\n".join([header] + [f"  {name:<{width}}  {value}" for name, value in rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ijepa.benchmark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant, over --rounds rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of ours / one-pass / baseline")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--mask-repeats", type=int, default=50)
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    parser.add_argument(
        "--static-compiled",
        action="store_true",
        help="also time the step with static shapes (context_policy=static) under torch.compile(dynamic=False)",
    )
    parser.add_argument(
        "--compile-mode", default=None, help="torch.compile mode of --static-compiled (GPU: reduce-overhead)"
    )
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend of --static-compiled (inductor)")
    parser.add_argument("--no-knn", dest="knn", action="store_false")
    parser.add_argument("--no-data", dest="data", action="store_false", help="skip timing one DataLoader worker")
    parser.add_argument("--data-repeats", type=int, default=3)
    parser.add_argument(
        "--no-one-pass",
        dest="one_pass",
        action="store_false",
        help="skip timing the one-pass predictor option (model.predictor_mode=one_pass)",
    )
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
