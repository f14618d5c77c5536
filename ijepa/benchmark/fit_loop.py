"""The whole training loop: ``python -m ijepa.benchmark.fit_loop --config CONFIG [--steps 200] [overrides]``.

Where :mod:`ijepa.benchmark` times the step on batches already in memory, this runs the real
``ijepa fit`` (DataLoader workers, augmentations, mask collation, host-to-device copies, Lightning's
loop, the EMA callback, checkpointing) with validation and the evaluation callbacks off, and splits each step's wall time into

* **data wait**: from the end of one step to the start of the next, which is the time Lightning
  waits for the DataLoader to hand over the next batch (plus moving it to the device); the
  first batch of each epoch is counted apart, since the workers start that epoch from empty
  (on a small dataset this is most of the wait);
* **step**: from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward,
  optimizer, EMA).

If the data wait is a small fraction of the total, data loading and mask sampling are not the
bottleneck. The same process times the bare training step of
:mod:`ijepa.benchmark` (forward, backward, AdamW, EMA on batches already in memory) on the
config's model before and after the fit (their mean), so the loop's share of the step's speed is a ratio
measured in one run (``loop_over_step``). Prints one line and ``FITLOOP {json}``. Any ``--model.*``, ``--data.*`` or
``--trainer.*`` override goes to the CLI (e.g. ``--data.source=ijepa.data.ShapesSource`` where STL-10 is absent).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from unittest import mock

from ijepa.benchmark import build, synthetic_batches, time_calls, training_step
from ijepa.callbacks import (
    CollapseMonitor,
    JEPAImages,
    KNNProbe,
    LinearProbe,
    PositionSimilarityImages,
)
from ijepa.callbacks.throughput import StepTimes
from ijepa.cli import build_cli

EVALUATION = (CollapseMonitor, JEPAImages, KNNProbe, LinearProbe, PositionSimilarityImages)


class StepTimer(StepTimes):
    """Records per-step compute time and the DataLoader wait before each step, after ``warmup``
    steps, with the clock ``ThroughputLogger`` logs from. Synchronises the GPU at both ends of a
    step (a small cost, for honest timings)."""

    def __init__(self, warmup: int = 20):
        super().__init__(sync_at_start=True)
        self.warmup = warmup
        self.step_seconds: list[float] = []
        self.wait_seconds: list[float] = []
        self.epoch_start_wait_seconds: list[float] = []

    def timed(self, trainer, pl_module, batch, batch_idx: int, wait: float | None, step: float) -> None:
        if trainer.global_step <= self.warmup:
            return
        self.step_seconds.append(step)
        if wait is not None:
            # A new epoch's first batch waits for the workers to refill from empty.
            (self.epoch_start_wait_seconds if batch_idx == 0 else self.wait_seconds).append(wait)


def bare_step_images_per_s(config: str, overrides: list[str], steps: int) -> float:
    """Images/s of :mod:`ijepa.benchmark`'s training step (no DataLoader, no Lightning) on the
    model ``config`` builds: median of ``steps`` steps after 3 warm-up steps, on 4 synthetic
    batches. A model of its own: the fitted one is attached to its trainer."""
    model, datamodule = build(config, overrides)
    model.setup("fit")  # what Lightning does before training (CPU: flush denormals)
    batches = synthetic_batches(datamodule, 4, model.device)
    step = training_step(model, model.build_optimizer(), batches, contextlib.nullcontext())
    return datamodule.hparams.batch_size / statistics.median(time_calls(step, 3, steps, model.device))


def run(config: str, overrides: list[str], steps: int, warmup: int, bare_steps: int = 30) -> dict:
    """Fit ``steps`` steps of ``config`` and return images/s, step and data-wait times, and the
    bare step's images/s on the same model (``bare_steps`` timed steps; 0: not timed)."""
    # The bare step before and after the fit, so that a drift of the machine's speed during the
    # fit hits both sides of the ratio alike.
    bare = [bare_step_images_per_s(config, overrides, bare_steps)] if bare_steps else []
    with tempfile.TemporaryDirectory() as root, mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(
            [
                "--config",
                config,
                *overrides,
                f"--trainer.max_steps={steps}",
                "--trainer.max_epochs=-1",
                "--trainer.limit_val_batches=0",
                "--trainer.logger=false",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
                f"--trainer.default_root_dir={root}",
            ],
            run=False,
        )
        timer = StepTimer(warmup)
        # Probes and pictures act around validation (and at the first and last step); they are not
        # part of the training loop's throughput.
        cli.trainer.callbacks = [cb for cb in cli.trainer.callbacks if not isinstance(cb, EVALUATION)] + [timer]
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if bare_steps:
        bare.append(bare_step_images_per_s(config, overrides, bare_steps))
    bare = statistics.mean(bare) if bare else None
    batch_size = cli.datamodule.hparams.batch_size
    step, wait = statistics.median(timer.step_seconds), statistics.median(timer.wait_seconds)
    epoch_waits = timer.epoch_start_wait_seconds
    total = sum(timer.step_seconds) + sum(timer.wait_seconds) + sum(epoch_waits)
    images_per_s = batch_size * len(timer.step_seconds) / total
    return {
        "config": config,
        "overrides": overrides,
        "steps_timed": len(timer.step_seconds),
        "batch_size": batch_size,
        "num_workers": cli.datamodule.hparams.num_workers,
        "images_per_s": images_per_s,
        "bare_step_images_per_s": bare,
        "loop_over_step": images_per_s / bare if bare else None,
        "step_ms": 1e3 * step,
        "data_wait_ms": 1e3 * wait,
        "data_wait_fraction": sum(timer.wait_seconds) / total,
        "epoch_starts": len(epoch_waits),
        "epoch_start_wait_ms": 1e3 * statistics.mean(epoch_waits) if epoch_waits else 0.0,
        "epoch_start_wait_fraction": sum(epoch_waits) / total,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m ijepa.benchmark.fit_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--bare-steps", type=int, default=30, help="timed bare steps after the fit (0: none)")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if not o.startswith(("--model.", "--data.", "--trainer."))]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides must be --model.*, --data.* or --trainer.*)")
    if args.steps <= args.warmup + 1:
        parser.error(f"--steps must be > --warmup + 1 = {args.warmup + 1}, got {args.steps}")
    result = run(args.config, overrides, args.steps, args.warmup, args.bare_steps)
    print(
        f"{args.config} {' '.join(overrides)}: {result['images_per_s']:.1f} images/s through the whole loop; "
        f"step {result['step_ms']:.1f} ms, data wait {result['data_wait_ms']:.2f} ms (median), "
        f"{100 * result['data_wait_fraction']:.1f}% of the time waiting for data within epochs, "
        f"{100 * result['epoch_start_wait_fraction']:.1f}% at {result['epoch_starts']} epoch starts "
        f"({result['epoch_start_wait_ms']:.0f} ms each); {result['num_workers']} workers"
        + (
            f"; the bare step: {result['bare_step_images_per_s']:.1f} images/s, "
            f"the loop at {result['loop_over_step']:.2f}x"
            if result["bare_step_images_per_s"]
            else ""
        )
    )
    print("FITLOOP " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
