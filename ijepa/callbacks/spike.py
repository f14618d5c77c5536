"""Skip the optimizer step of a batch whose loss spikes (V-JEPA 2.1's answer to loss spikes).

Lightning lets no callback veto a step, and a ``training_step`` that returns None still runs
the optimizer hook, advances ``global_step`` and the LR scheduler (so the EMA target moves, the
schedules drift), and is refused under DDP. So the module asks its ``step_guards`` (callables
``guard(module, loss) -> bool`` that a callback registers in ``setup``) after the loss is
computed; on a veto it returns a loss that reaches no weight. Lightning then zeroes the
gradients, backpropagates nothing and calls ``optimizer.step``, which passes over parameters
without a gradient: weights and AdamW's moments and step counts stay as they were. This
callback winds back the step counter and the LR scheduler before Lightning advances them, so
``global_step``, the schedules and every callback that acts on a new step (the EMA update,
checkpoints) see no step.
"""

from __future__ import annotations

import math
from collections import deque

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from ijepa.checkpoint import resume_advice, saved_checkpoints
from ijepa.nn.checks import check_range


class SpikeTracker:
    """The last ``window`` accepted losses and the threshold they set: ``mean + num_std * std``
    (population standard deviation); None until two losses are in."""

    def __init__(self, window: int = 100, num_std: float = 6.0):
        self.window, self.num_std = window, num_std
        self.losses: deque[float] = deque(maxlen=window)

    def accept(self, loss: float) -> None:
        self.losses.append(float(loss))

    def stats(self) -> tuple[float, float] | None:
        """``(mean, std)`` of the window, None with fewer than two losses."""
        if len(self.losses) < 2:
            return None
        mean = math.fsum(self.losses) / len(self.losses)
        return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in self.losses) / len(self.losses))

    def threshold(self) -> float | None:
        stats = self.stats()
        return None if stats is None else stats[0] + self.num_std * stats[1]

    def is_spike(self, loss: float) -> bool:
        threshold = self.threshold()
        return threshold is not None and loss > threshold

    def state_dict(self) -> dict:
        return {"losses": list(self.losses)}

    def load_state_dict(self, state: dict) -> None:
        self.losses = deque((float(x) for x in state["losses"]), maxlen=self.window)


class LossSpikeSkip(Callback):
    """Skip the update of a batch whose training loss spikes.

    From optimizer step ``warmup_steps`` on, a batch whose loss (averaged over the ranks, so every
    rank decides alike) exceeds ``mean + num_std * std`` of the last ``window`` accepted losses is
    skipped: no backward, weights, optimizer state and target encoder untouched, ``global_step``
    and the LR and weight-decay schedules not advanced; its batch is used up. Only accepted losses
    join the window. ``max_in_a_row`` spikes in a row stop the run with a ``FloatingPointError``
    that names the checkpoint to resume from. Logs ``train/skipped_steps`` (skips so far) every
    step and ``train/spike_loss`` at a skip. The window and the counts are saved in checkpoints,
    so a resumed run decides as the uninterrupted one would.

    Args:
        warmup_steps: optimizer steps before any step may be skipped (the early loss falls fast);
            one not below the run's length is warned at fit start: the guard would never act.
        window: accepted losses the mean and standard deviation are taken over (at least 2).
        num_std: how many standard deviations above the mean a loss must be to count as a spike.
        max_in_a_row: spikes in a row that stop the run (1: the first spike stops it).
    """

    def __init__(self, warmup_steps: int = 100, window: int = 100, num_std: float = 6.0, max_in_a_row: int = 10):
        check_range(warmup_steps, "warmup_steps", 0)
        check_range(window, "window", 2)
        check_range(num_std, "num_std", 0, low_open=True)
        check_range(max_in_a_row, "max_in_a_row", 1)
        self.warmup_steps, self.max_in_a_row = warmup_steps, max_in_a_row
        self.tracker = SpikeTracker(window, num_std)
        self.skipped = 0
        self.in_a_row = 0
        self._spike: float | None = None  # the loss of the batch being skipped

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.accumulate_grad_batches != 1:
            # one micro-batch's spike cannot take back the others' gradients
            raise ValueError(
                f"LossSpikeSkip needs trainer.accumulate_grad_batches 1, got {trainer.accumulate_grad_batches}."
            )
        pl_module.step_guards = [*getattr(pl_module, "step_guards", ()), self.skip_step]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if warning := self.warmup_warning(trainer):
            rank_zero_warn(warning)

    def warmup_warning(self, trainer: L.Trainer) -> str | None:
        """One line when no step of the run comes after ``warmup_steps`` (the guard would never
        act), else None. A step may be skipped from ``global_step == warmup_steps`` on, and the
        run's last step is ``total - 1``."""
        total = trainer.estimated_stepping_batches  # max_steps, or the steps of max_epochs; inf or -1: unbounded
        if math.isinf(total) or total < 0 or self.warmup_steps < total:
            return None
        if trainer.max_steps >= 0 and trainer.max_steps == total:
            run = f"trainer.max_steps={trainer.max_steps}"
        else:
            run = (
                f"{int(total)} optimizer steps (trainer.max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs})"
            )
        return (
            f"LossSpikeSkip.warmup_steps={self.warmup_steps} is not below the run's {run}: no step comes after the "
            "warm-up, so it will never act (no loss spike is skipped). Set warmup_steps below the run's length, or "
            "remove the callback."
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        guards = getattr(pl_module, "step_guards", [])
        if self.skip_step in guards:
            guards.remove(self.skip_step)

    def skip_step(self, pl_module: L.LightningModule, loss: torch.Tensor) -> bool:
        """The guard the module asks each training step: True to skip it."""
        trainer = pl_module.trainer
        # a clone: DDP's all-reduce works in place, and the detached tensor shares the loss's storage
        value = float(trainer.strategy.reduce(loss.detach().clone(), reduce_op="mean"))
        if trainer.global_step < self.warmup_steps or not self.tracker.is_spike(value):
            self.tracker.accept(value)
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        mean, std = self.tracker.stats()
        what = (
            f"train/loss {value:.6g} > {self.tracker.threshold():.6g} (mean {mean:.6g} + {self.tracker.num_std:g} "
            f"x std {std:.6g} of the last {len(self.tracker.losses)} accepted losses)"
        )
        if self.in_a_row >= self.max_in_a_row:
            raise FloatingPointError(
                f"{self.in_a_row} loss spikes in a row (LossSpikeSkip.max_in_a_row={self.max_in_a_row}), the last "
                f"{what}, at step {trainer.global_step} (epoch {trainer.current_epoch}); stopping without saving. "
                + resume_advice(saved_checkpoints(trainer), trainer.global_step)
            )
        self.skipped += 1
        self._spike = value
        rank_zero_info(f"LossSpikeSkip: step {trainer.global_step} skipped, {what}; {self.skipped} skipped so far.")
        return True

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self._spike is None:
            return
        # Lightning counts this optimizer step once the hook returns and then steps the
        # schedulers: winding both back by one here makes the skipped step leave no trace before
        # any callback's on_train_batch_end (EMA, checkpoints) looks at global_step.
        progress = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step
        for tracker in (progress.total, progress.current):
            tracker.ready -= 1
            tracker.completed -= 1
        for config in trainer.lr_scheduler_configs:
            if config.interval == "step" and not config.reduce_on_plateau:
                # the module's LambdaLR sets the lr from last_epoch alone, so its next step repeats this one's
                config.scheduler.last_epoch -= 1
                config.scheduler._step_count -= 1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._spike is not None:
            pl_module.log("train/spike_loss", self._spike)
            self._spike = None
        pl_module.log("train/skipped_steps", float(self.skipped))

    def state_dict(self) -> dict:
        return {**self.tracker.state_dict(), "skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state_dict: dict) -> None:
        self.tracker.load_state_dict(state_dict)
        self.skipped, self.in_a_row = int(state_dict["skipped"]), int(state_dict["in_a_row"])
