"""The optimiser room: AdamW's parameter groups, its construction, and the learning-rate and
weight-decay schedules as functions of ``(step, total_steps)``.

No Lightning here: :class:`ijepa.module.IJEPA` calls these from its optimiser hooks, and the
benchmarks call them on a bare model. The schedules are pure functions of the step, so a resumed
or multi-process run needs no schedule state beyond ``global_step``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from ijepa.nn.checks import check_range
from ijepa.schedules import cosine_schedule, warmup_cosine_schedule


@dataclass(frozen=True)
class OptimConfig:
    """The optimiser's options, ``model.optim`` (``--model.optim.lr 1e-3``; in YAML ``model:
    {optim: {lr: 1.0e-3, warmup_steps: 60}}``), and the I-JEPA recipe they set: AdamW with
    ``betas``; linear warm-up of the learning rate ``start_lr -> lr`` over ``warmup_steps``, then
    cosine decay to ``final_lr``; cosine weight decay ``weight_decay -> final_weight_decay`` (not
    on biases, norms, position tables, the mask token); both over the run's ``total_steps``.

    Args:
        lr: peak learning rate, reached after ``warmup_steps``.
        start_lr: learning rate at step 0 (linear warm-up from it; at most ``lr``).
        final_lr: learning rate at the last step (cosine decay to it; at most ``lr``).
        warmup_steps: optimizer steps of linear warm-up.
        weight_decay: AdamW weight decay at step 0.
        final_weight_decay: weight decay at the last step (cosine schedule).
        betas: AdamW betas, each in [0, 1).
    """

    lr: float = 1e-3
    start_lr: float = 2e-4
    final_lr: float = 1e-6
    warmup_steps: int = 1000
    weight_decay: float = 0.04
    final_weight_decay: float = 0.4
    betas: tuple[float, float] = (0.9, 0.999)

    def __post_init__(self):
        for name in ("lr", "start_lr", "final_lr", "warmup_steps", "weight_decay", "final_weight_decay"):
            check_range(getattr(self, name), f"model.optim.{name}", 0)
        if len(self.betas) != 2:
            raise ValueError(f"model.optim.betas must be two values, got {list(self.betas)}.")
        for index, beta in enumerate(self.betas):
            check_range(beta, f"model.optim.betas[{index}]", 0, 1, high_open=True)
        object.__setattr__(self, "betas", tuple(float(beta) for beta in self.betas))
        for name in ("start_lr", "final_lr"):
            if getattr(self, name) > self.lr:  # the "peak" would not be one: warm-up down, or decay up
                raise ValueError(
                    f"model.optim.{name} must be <= model.optim.lr (the peak of warm-up {self.start_lr} -> lr, then "
                    f"cosine to final_lr), got {name}={getattr(self, name)} above lr={self.lr}."
                )

    @classmethod
    def of(cls, value: OptimConfig | dict | None) -> OptimConfig:
        """``value`` as an :class:`OptimConfig`: a checkpoint's plain dict, or None for the defaults."""
        return cls() if value is None else value if isinstance(value, cls) else cls(**value)

    def record(self) -> dict:
        """Plain values that rebuild it (a checkpoint's ``hyper_parameters["optim"]``)."""
        return {**asdict(self), "betas": list(self.betas)}

    def warmup_warning(self, total_steps: int) -> str | None:
        """What to tell a run of ``total_steps`` whose warm-up never ends, or None."""
        if self.warmup_steps <= total_steps:
            return None
        return (
            f"model.optim.warmup_steps={self.warmup_steps} is longer than the run ({total_steps} optimizer steps): the "
            f"warm-up is squeezed into the whole run, so the learning rate only climbs ({self.start_lr} -> {self.lr}) "
            f"and never decays to final_lr={self.final_lr}. Set model.optim.warmup_steps below the run's length."
        )

    def lr_at(self, step: int, total_steps: int) -> float:
        """Learning rate at optimizer ``step``: linear warm-up, then cosine decay."""
        total = max(total_steps, 1)
        return warmup_cosine_schedule(step, total, min(self.warmup_steps, total), self.lr, self.final_lr, self.start_lr)

    def weight_decay_at(self, step: int, total_steps: int) -> float:
        """Cosine weight decay ``weight_decay -> final_weight_decay`` at optimizer ``step``."""
        return cosine_schedule(step, max(total_steps, 1), self.weight_decay, self.final_weight_decay)

    @property
    def base_lr(self) -> float:
        """The factor ``LambdaLR`` multiplies (``lr``; 1 when ``lr`` is 0, so 0 stays reachable)."""
        return self.lr if self.lr > 0 else 1.0


def parameter_groups(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of ``model``'s trainable parameters with and without weight decay, in optimizer order.

    No weight decay on biases and norms (every parameter under 2-D), nor on what a submodule
    lists in its ``no_weight_decay()`` (position tables, the mask token), as in I-JEPA and timm.
    """
    exempt = {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if callable(getattr(module, "no_weight_decay", None))
        for name in module.no_weight_decay()
    }
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or name in exempt else decay).append(name)
    return decay, no_decay


def parameter_order(model: nn.Module) -> list[str]:
    """The trainable parameters' names in the order the optimizer holds them (its state's keys)."""
    decay, no_decay = parameter_groups(model)
    return decay + no_decay


def build_adamw(model: nn.Module, optim: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups` with ``optim``'s lr, weight decay and betas (fused on
    CUDA, foreach elsewhere); the decayed group is marked ``scheduled_weight_decay`` for
    :func:`set_weight_decay`."""
    lr, weight_decay, betas = optim.lr, optim.weight_decay, optim.betas
    params = dict(model.named_parameters())
    decay, no_decay = parameter_groups(model)
    groups = [
        {"params": [params[n] for n in decay], "weight_decay": weight_decay, "scheduled_weight_decay": True},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "scheduled_weight_decay": False},
    ]
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused, foreach=None if fused else True)


def lr_scheduler(optimizer: torch.optim.Optimizer, schedules: OptimConfig, total_steps) -> dict:
    """Lightning's scheduler config: a per-step ``LambdaLR`` whose factor gives
    :meth:`OptimConfig.lr_at` (``total_steps`` a callable, read when the factor is)."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedules.lr_at(step, total_steps()) / schedules.base_lr
    )
    return {"scheduler": scheduler, "interval": "step"}


def set_weight_decay(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set the scheduled groups' weight decay (the others keep theirs, 0)."""
    for group in optimizer.param_groups:
        if group["scheduled_weight_decay"]:
            group["weight_decay"] = value


def rebase_schedulers(schedulers, schedules: OptimConfig) -> None:
    """After a resume: ``LambdaLR`` restored its base lr from the checkpoint, but the resumed run
    may have a new ``lr``; rebase it and set this step's lr by the scheduler's own formula."""
    for scheduler in schedulers:
        scheduler.base_lrs = [schedules.base_lr] * len(scheduler.base_lrs)
        for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(scheduler.last_epoch)
