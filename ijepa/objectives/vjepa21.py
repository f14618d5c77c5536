"""Two levers from V-JEPA 2.1 (Assran et al. 2025):

* :class:`ContextLoss`: the predictor also predicts the context tokens; their loss against the
  target encoder's features at those positions joins the loss, each token weighted by
  ``1 / sqrt(d)``, ``d`` its distance to the nearest target token.
* :class:`MultiLevelTargets`: the targets are several blocks of the target encoder, each
  normalised and predicted on its own (the predictor's output projection widened to ``k * D``),
  their losses averaged.
"""

from __future__ import annotations

import math

import torch

from ijepa.nn.checks import check_range
from ijepa.objectives.base import Objective
from ijepa.step import StepOutput


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
