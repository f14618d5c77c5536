"""Throughput of ``fit`` as TensorBoard scalars: images/s, tokens/s, model FLOPs per step, model
FLOP utilisation against a stated peak, and the share of the time spent waiting for data.

Lightning's ``ThroughputMonitor`` times the loop as a whole (data wait included), takes its
FLOPs from a ``flops_per_batch`` attribute of the module, also logs validation throughput
against the validation batch index as its step, and only knows a GPU its table can name (the
H200 that ``torch.cuda.get_device_name`` reports as ``NVIDIA H200`` is not among them). This
callback keeps what fits from it: one CUDA synchronisation per step, at the end of the batch,
for honest wall times; torch's FLOP counter (``FlopCounterMode``, which Lightning's
``measure_flops`` wraps); Lightning's ``get_available_flops`` for GPUs outside the small table
below; and it splits each step's time into the step itself and the wait before it.
"""

from __future__ import annotations

import math
import re
from collections import deque
from time import perf_counter

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.flop_counter import FlopCounterMode

from ijepa.data.batch import GridBatch, PackedBatch

# Dense (no 2:4 sparsity) peak TFLOP/s from NVIDIA's datasheets: (name, pattern searched in the
# lower-cased torch.cuda.get_device_name, bf16 and fp16, tf32, fp32). The first match wins;
# other GPUs (and TPUs) go to Lightning's table. Datasheets often print the sparse figure,
# twice these.
PEAK_TFLOPS = [
    ("H200 NVL", r"h200.*nvl", 835.5, 417.5, 60.0),
    ("H200 SXM", r"h200", 989.4, 494.7, 66.9),
    ("H100 NVL", r"h100.*nvl", 835.5, 417.5, 60.0),
    ("H100 PCIe", r"h100.*pcie", 756.0, 378.0, 51.2),
    ("H100 SXM", r"h100", 989.4, 494.7, 66.9),
    ("A100", r"a100", 312.0, 156.0, 19.5),
    ("L40S", r"l40s", 362.05, 183.0, 91.6),
    ("L4", r"\bl4\b", 121.0, 60.0, 30.3),
    ("A10", r"\ba10\b", 125.0, 62.5, 31.2),
]


def step_flops(loss_fn, batch) -> int:
    """Model FLOPs of one forward + backward of ``loss_fn(batch)`` (``torch.utils.flop_counter``).
    With activation checkpointing the recomputed forward is counted too."""
    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(batch).backward()
    return counter.get_total_flops()


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a ``trainer.precision`` setting (``bf16-mixed`` -> bfloat16, ...)."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float64 if precision.startswith("64") else torch.float32


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak FLOP/s at ``precision`` (``trainer.precision``): from
    :data:`PEAK_TFLOPS` for the GPUs it names (fp32 counts as tf32 unless
    ``torch.set_float32_matmul_precision("highest")``), else Lightning's ``get_available_flops``;
    None where neither knows (CPUs)."""
    dtype = compute_dtype(precision)
    if device.type == "cuda" and dtype != torch.float64:
        name = torch.cuda.get_device_name(device).lower()
        for _, pattern, half, tf32, fp32 in PEAK_TFLOPS:
            if re.search(pattern, name):
                if dtype == torch.float32:
                    return 1e12 * (fp32 if torch.get_float32_matmul_precision() == "highest" else tf32)
                return 1e12 * half
    return get_available_flops(device, dtype)


def images_and_tokens(batch: GridBatch | PackedBatch, patch_size: int, tubelet_size: int) -> tuple[int, int]:
    """``(images, tokens)`` of a training batch, tokens being every patch (tubelet, for clips) of
    every image: what the target encoder encodes, whatever share of it the context holds."""
    if isinstance(batch, PackedBatch):  # each image on its own grid
        return len(batch), int(batch.full.real.sum())
    images = batch.images  # [B, C, H, W] or clips [B, C, T, H, W]
    patch = batch.patch_size or patch_size  # FlexiViT batches are cut at their own size
    tokens = (images.size(-2) // patch) * (images.size(-1) // patch)
    if images.dim() == 5:
        tokens *= images.size(2) // tubelet_size
    return images.size(0), images.size(0) * tokens


class StepTimes(Callback):
    """Times every training batch: the *step*, from ``on_train_batch_start`` to
    ``on_train_batch_end`` (forward, backward, optimizer and what callbacks placed before this
    one do then, e.g. the EMA), and the *wait* before it, from the previous batch's end: the
    DataLoader handing over the batch, its copy to the device, and the loop's work between
    batches. The wait after a validation (which holds the validation, probes and checkpoints)
    is None. Subclasses receive both in :meth:`timed`.

    On CUDA the device is synchronised at the end of each batch, the one synchronisation
    Lightning's ``ThroughputMonitor`` also makes; ``sync_at_start`` adds one at the start (the
    fit-loop benchmark's choice)."""

    def __init__(self, sync_at_start: bool = False):
        super().__init__()
        self.sync_at_start = sync_at_start
        self._start: float | None = None
        self._end: float | None = None

    @staticmethod
    def clock(device: torch.device, sync: bool) -> float:
        if sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        return perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._start = self.clock(pl_module.device, self.sync_at_start)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        end = self.clock(pl_module.device, True)
        wait = None if self._end is None else self._start - self._end
        self._end = end
        self.timed(trainer, pl_module, batch, batch_idx, wait, end - self._start)

    def timed(self, trainer, pl_module, batch, batch_idx: int, wait: float | None, step: float) -> None:
        """Called at the end of every training batch with its wait and step seconds."""


class ThroughputLogger(StepTimes):
    """Logs the training loop's throughput as scalars, every ``log_every_n_steps`` steps (default:
    the trainer's), each a figure over the last ``window`` timed steps (default: the steps since
    the previous log):

    * ``throughput/images_per_s``: images over wall time (step + wait), times the number of
      processes (each takes a batch of ``data.batch_size``);
    * ``throughput/tokens_per_s``: the same for tokens, every patch of every image (for clips
      every tubelet; for native-resolution batches every real patch of the packed images), what
      the target encoder encodes; the context encoder sees a share of them, the predictor the
      context and the targets;
    * ``throughput/data_wait_share``: the share of the wall time spent between steps, waiting
      for the next batch (see :class:`StepTimes`);
    * ``throughput/flops_per_step``: model FLOPs of one step's forward and backward on this
      process, counted once by torch's FLOP counter during the first training step, as
      :func:`step_flops` counts them (batches whose contexts hold another number of tokens do
      somewhat other work);
    * ``throughput/tflops_per_s``: achieved TFLOP/s per device, over the step time alone (the
      benchmark's measure; over the whole loop it is this times ``1 - data_wait_share``);
    * ``throughput/mfu``: that over the device's peak, ``peak_tflops`` if set, else looked up
      (:func:`peak_flops`); a CPU has none, and without a peak no MFU is logged (said once).

    The first step of each ``fit`` (warm-up and FLOP counting) and the first after each
    validation are not timed. Nothing is measured when the trainer has no logger.
    """

    def __init__(
        self, log_every_n_steps: int | None = None, window: int | None = None, peak_tflops: float | None = None
    ):
        super().__init__()
        for name, value in (("log_every_n_steps", log_every_n_steps), ("window", window)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (steps) or null, got {value}.")
        if peak_tflops is not None and not 0 < peak_tflops < math.inf:
            raise ValueError(
                f"peak_tflops must be a finite number > 0 (TFLOP/s of one device) or null, got {peak_tflops}."
            )
        self.log_every_n_steps, self.window, self.peak_tflops = log_every_n_steps, window, peak_tflops
        self.flops_per_step: int | None = None
        self.peak: float | None = None
        self._active = self._first = False
        self._logged_step: int | None = None
        self._counter: FlopCounterMode | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._active = stage == "fit" and bool(trainer.loggers)
        if not self._active:
            return
        self.every = self.log_every_n_steps or max(trainer.log_every_n_steps, 1)
        self.steps: deque[tuple[int, int, float, float]] = deque(maxlen=self.window or self.every)
        device = trainer.strategy.root_device
        if self.peak_tflops is not None:
            self.peak = self.peak_tflops * 1e12
        else:
            self.peak = peak_flops(device, trainer.precision)
            if self.peak is None:
                rank_zero_info(
                    f"ThroughputLogger: no peak FLOP/s is known for {device} at precision {trainer.precision}, so "
                    "throughput/mfu is not logged; set the callback's peak_tflops to log it."
                )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._first = True
        self._logged_step = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if not self._active:
            return
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._first and self.flops_per_step is None:
            # The real step is counted, not a copy of it: no extra work, nothing else changes.
            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_counting()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop_counting()  # the counter must not outlive the step it counts

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop_counting()

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops_per_step, self._counter = self._counter.get_total_flops(), None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if self._active:
            self._stop_counting()  # a step without backward
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def timed(self, trainer, pl_module, batch, batch_idx: int, wait: float | None, step: float) -> None:
        if self._first:
            self._first = False
        elif wait is not None:
            hp = pl_module.hparams
            self.steps.append((*images_and_tokens(batch, hp.patch_size, hp.tubelet_size), wait, step))
        # once per optimizer step (gradient accumulation calls this for every batch)
        if trainer.global_step % self.every or trainer.global_step == self._logged_step or not self.steps:
            return
        self._logged_step = trainer.global_step
        for logger in trainer.loggers:
            # the step train/loss of this batch is logged at
            logger.log_metrics(self.metrics(trainer.world_size), step=trainer.global_step - 1)

    def metrics(self, world_size: int = 1) -> dict[str, float]:
        """The scalars over the steps in the window."""
        images, tokens, wait, step = (sum(column) for column in zip(*self.steps))
        metrics = {
            "throughput/images_per_s": world_size * images / (wait + step),
            "throughput/tokens_per_s": world_size * tokens / (wait + step),
            "throughput/data_wait_share": wait / (wait + step),
        }
        if self.flops_per_step:
            achieved = self.flops_per_step * len(self.steps) / step
            metrics["throughput/flops_per_step"] = float(self.flops_per_step)
            metrics["throughput/tflops_per_s"] = achieved / 1e12
            if self.peak:
                metrics["throughput/mfu"] = achieved / self.peak
        return metrics
