"""EMA update of the target encoder from the online encoder."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from ijepa.nn.checks import check_range
from ijepa.nn.sharding import check_sharded_alike, local_shards
from ijepa.schedules import linear_schedule


def ema_update_(target: list[torch.Tensor], online: list[torch.Tensor], momentum: float) -> None:
    """In place, for every pair: ``target <- momentum * target + (1 - momentum) * online``.

    One foreach lerp over all tensors (a handful of fused kernels instead of one per tensor).
    Sharded parameters (FSDP2 ``DTensor`` s, sharded alike) are updated shard by shard: each rank
    lerps its own slices, with no communication.
    """
    torch._foreach_lerp_(local_shards(target), local_shards(online), 1.0 - momentum)


class EMATargetUpdate(Callback):
    """Move ``pl_module.target_encoder`` towards ``pl_module.encoder`` after every optimizer step.

    The momentum rises linearly from ``momentum`` to ``final_momentum`` over the run (I-JEPA:
    0.996 -> 1.0) and is computed from ``global_step``, so a resumed run continues the schedule
    exactly. It runs once per optimizer step, not per batch, so gradient accumulation is safe.
    Logs ``train/ema_momentum``. ``updates_target_encoder`` tells the module that the target
    moves (without it the module warns at the start of ``fit``). With another
    ``model.teacher_policy`` (:mod:`ijepa.teachers`: frozen, stepwise) it leaves the target alone
    and says so once.
    """

    updates_target_encoder = True

    def __init__(self, momentum: float = 0.996, final_momentum: float = 1.0):
        for name, value in (("momentum", momentum), ("final_momentum", final_momentum)):
            check_range(value, name, 0, 1)
        self.momentum = momentum
        self.final_momentum = final_momentum
        self._last_step: int | None = None

    def momentum_at(self, step: int, total_steps: int) -> float:
        """EMA momentum used for optimizer step ``step`` (0-based) of ``total_steps``."""
        return linear_schedule(step, total_steps, self.momentum, self.final_momentum)

    @staticmethod
    def parameter_pairs(pl_module: L.LightningModule) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Matching ``(target, online)`` parameter lists; ValueError if the two encoders differ."""
        target = dict(pl_module.target_encoder.named_parameters())
        online = dict(pl_module.encoder.named_parameters())
        if target.keys() != online.keys():
            raise ValueError(
                f"target and online encoders differ in parameters: {sorted(target.keys() ^ online.keys())}"
            )
        names = list(target)
        pairs = [target[n].data for n in names], [online[n].data for n in names]
        check_sharded_alike(*pairs, names)
        return pairs

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step
        if not getattr(pl_module, "target_by_ema", True):
            rank_zero_info(
                f"EMATargetUpdate: model.teacher_policy is {pl_module.teacher_policy!r}, which moves the target encoder "
                "itself; the EMA update is off for this run."
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if not getattr(pl_module, "target_by_ema", True):  # a frozen or stepwise teacher (ijepa.teachers)
            return
        if step == self._last_step:  # gradients are still accumulating: no optimizer step yet
            return
        self._last_step = step
        momentum = self.momentum_at(step - 1, max(int(trainer.estimated_stepping_batches), 1))
        with torch.no_grad():
            ema_update_(*self.parameter_pairs(pl_module), momentum)
        pl_module.log("train/ema_momentum", momentum)
