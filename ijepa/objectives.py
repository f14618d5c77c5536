"""Objectives: changes to what the JEPA step predicts and how its loss is formed, one class each,
chosen in YAML by ``class_path`` (``model.objectives``, a list; empty: I-JEPA's objective).

Two levers from V-JEPA 2.1 (Assran et al. 2025):

* :class:`ContextLoss`: the predictor also predicts the context tokens; their loss against the
  target encoder's features at those positions joins the loss, each token weighted by
  ``1 / sqrt(d)``, ``d`` its distance to the nearest target token.
* :class:`MultiLevelTargets`: the targets are several blocks of the target encoder, each
  normalised and predicted on its own (the predictor's output projection widened to ``k * D``),
  their losses averaged.

The objectives read the step's record (:class:`ijepa.step.StepOutput`), which :mod:`ijepa.step`
defines and fills. A new objective is one :class:`Objective` subclass.
"""

from __future__ import annotations

import abc
import copy
import math

import torch
import torch.nn as nn

from ijepa.nn.checks import check_range
from ijepa.registry import class_path, concrete_subclasses, from_config
from ijepa.step import StepOutput, target_blocks


class Objective(nn.Module, metaclass=abc.ABCMeta):
    """A change to the JEPA step. Subclasses override what they change: :meth:`target_blocks`
    (which target-encoder blocks are the targets), :meth:`predicts_context` (whether the step
    computes the predictor's context outputs) and :meth:`add_to` (a term joining the loss)."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def config(self) -> dict:
        """``{"class_path", "init_args"}``: plain values that rebuild this member (checkpoints)."""
        return {"class_path": class_path(self), "init_args": copy.deepcopy(self.options)}

    def target_blocks(self, depth: int) -> list[int] | None:
        """The target-encoder blocks (1-based) whose outputs are the targets; None: no change."""
        return None

    def predicts_context(self, step: int) -> bool:
        """Whether the step at ``step`` needs :attr:`StepOutput.context_predictions`."""
        return False

    def grid_only(self) -> bool:
        """Whether this member changes the step (native-resolution packed batches refuse it then)."""
        return False

    @abc.abstractmethod
    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        """The loss with this objective's term joined, and ``{log name: value}`` to log;
        ``loss_fn(predictions, targets, reduction)`` is the module's prediction loss."""

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.options.items())


def grid_coordinates(indices: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
    """Flat token indices ``[...]`` on a row-major ``grid`` -> coordinates ``[..., len(grid)]``
    (float): ``(row, col)`` for images, ``(time, row, col)`` for clips."""
    coords, rest = [], indices
    for side in reversed(grid):
        coords.append(rest % side)
        rest = torch.div(rest, side, rounding_mode="floor")
    return torch.stack(coords[::-1], dim=-1).float()


def context_distance_weights(
    context_indices: torch.Tensor,
    target_indices: torch.Tensor,
    grid: tuple[int, ...],
    context_mask: torch.Tensor | None = None,
    target_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[R, Kc]``: ``1 / sqrt(d)`` per context token, ``d`` the Euclidean distance in grid cells
    (patches; clips: tubelets, one tubelet step counting as one cell) from the token to the nearest
    real target token of its row (any of its ``M`` blocks), at least 1 (a context token on a target
    counts as distance 1); 0 at padded context slots and in rows without a real target."""
    rows = context_indices.size(0)
    context_xy = grid_coordinates(context_indices, grid)  # [R, Kc, g]
    target_xy = grid_coordinates(target_indices.reshape(rows, -1), grid)  # [R, M*Kt, g]
    squared = (context_xy[:, :, None] - target_xy[:, None]).pow(2).sum(-1)  # [R, Kc, M*Kt], whole numbers
    if target_mask is not None:
        squared = squared.masked_fill(~target_mask.reshape(rows, 1, -1), math.inf)
    weights = squared.min(-1).values.clamp_min(1.0).pow(-0.25)  # 1 / sqrt(d) = (d^2)^(-1/4); 0 at inf
    return weights if context_mask is None else weights * context_mask.to(weights.dtype)


class ContextLoss(Objective):
    """V-JEPA 2.1's context loss: the predictor also predicts the context tokens (its outputs at
    the context positions, through its output projection) and their loss against the target
    encoder's normalised features there joins the loss, each token's weighted by ``1 / sqrt(d)``,
    ``d`` its grid distance to the nearest target token of its mask row.

    The step's loss becomes ``loss + lambda(step) * sum_t (w_t * loss_t) / real context tokens``
    (``w_t`` from :func:`context_distance_weights`, ``loss_t`` the ``model.loss`` of token ``t``
    averaged over its features), with ``lambda`` rising linearly from 0 to ``weight`` over ``warmup_steps`` (a function of the
    global step, so a resumed run continues it). ``train/context_loss`` logs the weighted mean,
    ``train/context_weight`` lambda. In ``per_block`` predictor mode each block's sequence gives the
    context its own outputs: their mean over the ``M`` blocks is used. While lambda is 0 (``weight:
    0``, or step 0 of a warm-up) nothing of it is computed: the step is I-JEPA's, bit for bit.
    Grid batches only (native-resolution packed batches refuse it).

    Args:
        weight: lambda after the warm-up (>= 0); 0 switches the term off.
        warmup_steps: optimizer steps over which lambda rises linearly from 0 (>= 0; 0: no warm-up).
    """

    def __init__(self, weight: float = 0.5, warmup_steps: int = 0):
        check_range(weight, "ContextLoss weight", 0)
        check_range(warmup_steps, "ContextLoss warmup_steps", 0)
        super().__init__(weight=weight, warmup_steps=warmup_steps)
        self.weight, self.warmup_steps = float(weight), int(warmup_steps)

    def weight_at(self, step: int) -> float:
        """lambda at global step ``step``: ``weight * min(1, step / warmup_steps)``."""
        if self.warmup_steps == 0:
            return self.weight
        return self.weight * min(1.0, step / self.warmup_steps)

    def predicts_context(self, step: int) -> bool:
        return self.weight_at(step) > 0

    def grid_only(self) -> bool:
        return self.weight > 0

    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        lam = self.weight_at(step)
        if lam == 0 or out.context_predictions is None:
            return loss, {}
        per_token = loss_fn(out.context_predictions, out.context_targets, reduction="none").mean(-1)  # [R, Kc]
        weights = context_distance_weights(
            out.context_indices, out.target_indices, out.grid, out.context_mask, out.target_mask
        )
        real = per_token.numel() if out.context_mask is None else out.context_mask.sum().clamp_min(1)
        term = (per_token * weights).sum() / real
        return loss + lam * term, {"context_loss": term.detach(), "context_weight": lam}


class MultiLevelTargets(Objective):
    """V-JEPA 2.1's multi-level targets: the outputs of ``levels`` target-encoder blocks, evenly
    spaced and ending at the last (``round(depth * i / levels)`` for ``i = 1 .. levels``: 12 blocks,
    3 levels: blocks 4, 8, 12), each through the encoder's final norm and normalised by
    ``model.target_norm`` on its own, are the targets. The predictor's output projection is widened
    to ``levels * D``, one ``D``-wide slice per level, and the loss is the mean over levels of each
    level's loss (its mean over the wider features); ``train/level_<i>_loss`` logs level ``i``
    (1 .. ``levels``, shallowest first).
    Unlike ``model.target_last_blocks`` (one target, the average) the levels stay apart.
    One level is I-JEPA's last-block target, with the same parameters. The level count is part of
    the architecture (the output projection's shape): resuming with another one is refused.
    Grid batches only; not with ``model.target_last_blocks`` > 1.

    Args:
        levels: target levels ``k`` (>= 1, at most the encoder depth).
    """

    def __init__(self, levels: int = 4):
        check_range(levels, "MultiLevelTargets levels", 1)
        super().__init__(levels=levels)
        self.levels = int(levels)

    def target_blocks(self, depth: int) -> list[int]:
        if self.levels > depth:
            raise ValueError(f"MultiLevelTargets levels must be <= {depth} (the encoder depth), got {self.levels}.")
        return [round(depth * i / self.levels) for i in range(1, self.levels + 1)]

    def grid_only(self) -> bool:
        return self.levels > 1

    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        terms = {}
        with torch.no_grad():  # the logged terms only: the loss already is their mean
            per_value = loss_fn(out.predictions, out.targets, reduction="none")
            weights = None if out.target_mask is None else out.target_mask.to(per_value.dtype)[..., None]
            for level, chunk in enumerate(per_value.chunk(self.levels, dim=-1), start=1):
                total = chunk.mean() if weights is None else (chunk * weights).sum() / (weights.sum() * chunk.size(-1))
                terms[f"level_{level}_loss"] = total
        return loss, terms


def objective_kinds() -> tuple[type[Objective], ...]:
    """The concrete objectives imported so far, in definition order (the CLI's and docs' registry)."""
    return concrete_subclasses(Objective)


def objective_from_config(config: dict | Objective) -> Objective:
    """The member an :meth:`Objective.config` dict describes (a member is returned as it is)."""
    return config if isinstance(config, Objective) else from_config(config, Objective)


def refuse_packed(objectives, last_blocks: int) -> None:
    """Native-resolution batches take the last block's targets and no context loss."""
    if last_blocks != 1:
        raise ValueError("native-resolution batches take target_last_blocks=1 (the last block's output).")
    if any(member.grid_only() for member in objectives):
        raise ValueError(
            "native-resolution (packed) batches take no model.objectives (ContextLoss, MultiLevelTargets)."
        )


def check_resumed_levels(checkpoint: dict, blocks: list[int], depth: int) -> None:
    """Refuse a checkpoint whose target levels (the predictor's output width) differ from ``blocks``."""
    saved = [objective_from_config(c) for c in (checkpoint.get("hyper_parameters") or {}).get("objectives") or ()]
    theirs = target_blocks(saved, depth)
    if len(theirs) != len(blocks):
        raise ValueError(
            f"the checkpoint predicts {len(theirs)} target level(s) (blocks {theirs}), this model {len(blocks)} "
            f"(blocks {blocks}): model.objectives' MultiLevelTargets levels fix the predictor's output width. Use "
            "the checkpoint's levels, or start a new run without ckpt_path."
        )
