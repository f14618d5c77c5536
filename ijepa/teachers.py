"""Teacher policies: how the target encoder, whose features are the targets, moves. One class
each, chosen in YAML by ``class_path`` (``model.teacher_policy``; default :class:`EMATeacher`):

* :class:`EMATeacher`: I-JEPA's exponential moving average of the online encoder, moved by the
  :class:`ijepa.callbacks.EMATargetUpdate` callback (its momentum schedule lives there);
* :class:`FrozenTeacher`: the target encoder stays at its initial (random) weights, as in "Random
  Teachers are Good Teachers" and SALT's frozen teacher;
* :class:`StepwiseTeacher`: the online encoder's weights copied into it every ``every_n_steps``
  optimizer steps (dBOT's stagewise teacher).

A policy runs after every optimizer step (:meth:`TeacherPolicy.after_step`, called with the
global step), so a resumed run continues it exactly. A frozen or stepwise teacher is a network of
its own (``IJEPA.teacher_network``, in the checkpoint); the target encoder then follows the online
encoder step by step, as a distilled student's does, so that every reader of the target encoder
(probes, monitors, ``ijepa eval``, exports) reads the encoder that learns, not the teacher.
"""

from __future__ import annotations

import copy

import torch

from ijepa.nn.checks import check_range
from ijepa.nn.sharding import local_shards
from ijepa.registry import class_path, concrete_subclasses, from_config


class TeacherPolicy:
    """How the teacher moves. ``by_ema``: the teacher is the target encoder, which the EMA callback
    moves; otherwise the teacher is ``model.teacher_network`` (a copy of the initial target
    encoder) and :meth:`after_step`, the policy's own move after each optimizer step, also keeps
    the target encoder equal to the online one."""

    by_ema = False

    def __init__(self, **options):
        self.options = options

    def config(self) -> dict:
        """``{"class_path", "init_args"}``: plain values that rebuild this policy (checkpoints)."""
        return {"class_path": class_path(self), "init_args": copy.deepcopy(self.options)}

    def after_step(self, model: torch.nn.Module, step: int) -> None:
        """After optimizer step ``step`` (1-based: the global step once the step is taken): the
        target encoder set to the online one (what readers read); subclasses move the teacher."""
        copy_weights_(model.target_encoder, model.encoder)

    def run_warning(self, steps: float) -> str | None:
        """What to warn of at the start of a run of ``steps`` optimizer steps (None: nothing)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.options.items())})"


class EMATeacher(TeacherPolicy):
    """I-JEPA's EMA teacher: :class:`ijepa.callbacks.EMATargetUpdate` moves the target encoder
    (momentum and its schedule are that callback's options)."""

    by_ema = True

    def after_step(self, model: torch.nn.Module, step: int) -> None:
        """Nothing: the EMA callback moves the target encoder, which is the teacher."""


class FrozenTeacher(TeacherPolicy):
    """The teacher never moves: the initial weights teach for the whole run."""


class StepwiseTeacher(TeacherPolicy):
    """The online encoder's weights are copied into the teacher after every ``every_n_steps``-th
    optimizer step (steps N, 2N, ...); between copies the teacher is frozen.

    Args:
        every_n_steps: optimizer steps between copies (>= 1).
    """

    def __init__(self, every_n_steps: int = 100):
        check_range(every_n_steps, "StepwiseTeacher every_n_steps", 1)
        super().__init__(every_n_steps=every_n_steps)
        self.every_n_steps = int(every_n_steps)

    def run_warning(self, steps: float) -> str | None:
        # a copy at the last step (or none at all) teaches nothing: the run has a frozen teacher
        if 0 < steps <= self.every_n_steps:
            return (
                f"model.teacher_policy: StepwiseTeacher every_n_steps={self.every_n_steps} is not below the run's "
                f"{int(steps)} optimizer steps: the teacher is never refreshed while it teaches (a frozen teacher). "
                f"Set every_n_steps below {int(steps)}, or use FrozenTeacher."
            )
        return None

    def after_step(self, model: torch.nn.Module, step: int) -> None:
        super().after_step(model, step)
        if step > 0 and step % self.every_n_steps == 0:
            copy_weights_(model.teacher_network, model.encoder)


@torch.no_grad()
def copy_weights_(target: torch.nn.Module, online: torch.nn.Module) -> None:
    """``target``'s parameters set to ``online``'s, in place (sharded alike: shard by shard)."""
    pairs = dict(target.named_parameters()), dict(online.named_parameters())
    if pairs[0].keys() != pairs[1].keys():
        raise ValueError(
            f"target and online encoders differ in parameters: {sorted(pairs[0].keys() ^ pairs[1].keys())}"
        )
    names = list(pairs[0])
    torch._foreach_copy_(
        local_shards([pairs[0][n].data for n in names]), local_shards([pairs[1][n].data for n in names])
    )


def teacher_kinds() -> tuple[type[TeacherPolicy], ...]:
    """The concrete teacher policies imported so far (the CLI's and docs' registry)."""
    return tuple(kind for kind in concrete_subclasses(TeacherPolicy) if kind is not TeacherPolicy)


def teacher_from_config(config: dict | TeacherPolicy | None) -> TeacherPolicy:
    """The policy a :meth:`TeacherPolicy.config` dict describes (a policy as it is; None: EMA)."""
    if config is None:
        return EMATeacher()
    return config if isinstance(config, TeacherPolicy) else from_config(config, TeacherPolicy)
