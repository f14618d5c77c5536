"""The state a ``fit`` ends in is saved, wherever ``max_steps`` or ``max_time`` stops it.

On in every ``ijepa`` CLI run (``final_checkpoint`` in the config).
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer


class FinalCheckpoint(Callback):
    """The step at which ``max_steps`` stops ``fit`` is saved, as every ``ModelCheckpoint``'s
    ``last.ckpt`` (when ``save_last``) and, for those that monitor nothing, their top-k file.

    ``ModelCheckpoint`` saves on its triggers (after validation, by default), and at the end of
    ``fit`` only if it never saved ``last.ckpt`` before: a run whose ``max_steps`` fell between
    two validations kept a ``last.ckpt`` up to a validation interval behind.

    The save is at the end of the last batch, the state a resume continues from exactly. Later,
    Lightning counts the epoch as completed whether or not all its batches ran, without resetting
    its batch count, and a checkpoint written then resumed an epoch ahead. A callback that
    monitors a metric keeps its own trigger at an epoch's end, where a validation may follow and
    rank the step. The file holds the updates other callbacks make in ``on_train_batch_end``
    (``EMATargetUpdate``) when this callback comes after them in ``trainer.callbacks``, as the
    CLI places it.

    A ``Trainer(max_time=...)`` stop is saved the same way: its ``Timer`` decides at the end of a
    batch, so this callback moves it ahead of itself (Lightning appends it after the user's
    callbacks) and saves the batch at which the timer stopped the run.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        callbacks = trainer.callbacks
        timers = [cb for cb in callbacks[callbacks.index(self) + 1 :] if isinstance(cb, Timer)]
        for timer in timers:
            callbacks.remove(timer)
            callbacks.insert(callbacks.index(self), timer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        timed_out = trainer.should_stop and any(
            isinstance(cb, Timer) and (left := cb.time_remaining()) is not None and left <= 0
            for cb in trainer.callbacks
        )
        if not (0 <= trainer.max_steps <= trainer.global_step or timed_out):
            return
        epoch_end = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        for callback in trainer.checkpoint_callbacks:
            # ModelCheckpoint's own saving steps keep its bookkeeping (the latest step saved, the
            # last and top-k paths) right, so its end-of-fit save does not overwrite this one.
            if not isinstance(callback, ModelCheckpoint) or callback._should_skip_saving_checkpoint(trainer):
                continue
            candidates = callback._monitor_candidates(trainer)
            if callback.monitor is None:
                callback._save_topk_checkpoint(trainer, candidates)
            elif epoch_end:
                continue
            callback._save_last_checkpoint(trainer, candidates)
