"""A whole fit logs the throughput scalars, with the benchmark's FLOPs and an exact MFU."""

import copy
from unittest import mock

import lightning as L
import numpy as np
import pytest
from conftest import TINY_CONFIG
from lightning.pytorch.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ijepa.benchmark
from ijepa.callbacks import EMATargetUpdate, ThroughputLogger, throughput
from ijepa.callbacks.throughput import images_and_tokens
from ijepa.cli import build_cli
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

WAIT, STEP = 0.0625, 0.25  # exact in binary: sums and differences of the stubbed clock are exact


def stubbed_clock():
    """Batch starts at k * (WAIT + STEP), ends STEP later: the clock's n-th reading."""
    readings = iter(range(10_000))

    def perf_counter():
        n = next(readings)
        return (n // 2) * (WAIT + STEP) + (n % 2) * STEP

    return perf_counter


class FirstBatch(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 0:
            self.batch = copy.deepcopy(batch)


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_fit_logs_the_throughput_scalars_with_the_benchmarks_flops_and_exact_mfu(tmp_path, monkeypatch):
    monkeypatch.setattr(throughput, "perf_counter", stubbed_clock())
    args = [
        "--config",
        str(TINY_CONFIG),
        "--trainer.max_steps=3",
        "--data.source.train_size=96",
        "--data.source.val_size=32",
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=ijepa.callbacks.ThroughputLogger",
        "--trainer.callbacks.peak_tflops=2.5",
    ]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(args, run=False)
    first = FirstBatch()
    # the probes and pictures are not what is measured here
    keep = (EMATargetUpdate, ThroughputLogger, ModelCheckpoint)
    cli.trainer.callbacks = [cb for cb in cli.trainer.callbacks if isinstance(cb, keep)] + [first]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    logger = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ThroughputLogger))

    # FLOPs of the first step as it ran, equal to the benchmark's count of the same batch
    model = IJEPA(**{k: v for k, v in cli.model.hparams.items() if not k.startswith("_")})
    assert logger.flops_per_step == ijepa.benchmark.step_flops(model.jepa_loss, first.batch) > 0

    logged = scalars(cli.trainer.logger.log_dir)
    # steps 2 and 3 (the first is the warm-up), on train/loss's step axis, each over one step
    # (the default window is the logging interval, tiny.yaml's 1)
    assert [step for step, _ in logged["throughput/mfu"]] == [step for step, _ in logged["train/loss"]][1:]
    images, tokens = images_and_tokens(first.batch, 8, 2)
    expected = {
        "throughput/images_per_s": images / (WAIT + STEP),
        "throughput/tokens_per_s": tokens / (WAIT + STEP),
        "throughput/data_wait_share": WAIT / (WAIT + STEP),
        "throughput/flops_per_step": logger.flops_per_step,
        "throughput/tflops_per_s": logger.flops_per_step / STEP / 1e12,
        "throughput/mfu": logger.flops_per_step / STEP / (2.5 * 1e12),
    }
    for tag, value in expected.items():  # TensorBoard stores float32
        assert [v for _, v in logged[tag]] == [np.float32(value)] * 2, tag
    assert 0 <= expected["throughput/data_wait_share"] <= 1
