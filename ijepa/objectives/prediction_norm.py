"""A LayerNorm on the predictor's outputs before the latent loss.

I-JEPA's targets are layer-normalised (``model.target_norm: layer``) but its predictions are a
free linear projection, so part of what the loss asks of the predictor is to learn each token's
scale and offset. :class:`PredictionNorm` normalises every predicted token as the targets are,
leaving the predictor only the direction to get right.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.nn.checks import check_range
from ijepa.objectives.base import Objective
from ijepa.step import StepOutput


class PredictionNorm(Objective):
    """A LayerNorm over each predicted token's features before the latent loss; with multi-level
    targets (:class:`~ijepa.objectives.MultiLevelTargets`) over each level's own ``D'`` features,
    as the targets are. The step's record (``StepOutput.predictions``) keeps the predictor's own
    outputs; other objectives' terms (the context loss) read them unchanged.

    Args:
        affine: a learned per-feature scale and bias after the normalisation (a ``D'`` pair,
            shared by the levels), as ``nn.LayerNorm(elementwise_affine=True)``; off: the plain
            normalisation, the targets' own space.
        eps: the normalisation's epsilon (> 0).
    """

    def __init__(self, affine: bool = False, eps: float = 1e-6):
        check_range(eps, "PredictionNorm eps", 0, low_open=True)
        super().__init__(affine=bool(affine), eps=eps)
        self.affine, self.eps = bool(affine), float(eps)
        self.width: int | None = None

    def build(self, model: nn.Module) -> None:
        self.width = model.hparams.target_dim or model.hparams.embed_dim
        if self.affine:
            self.weight = nn.Parameter(torch.ones(self.width))
            self.bias = nn.Parameter(torch.zeros(self.width))

    def latent_predictions(self, predictions: torch.Tensor) -> torch.Tensor:
        """``predictions [..., L * D']`` normalised over each level's ``D'``; the same shape."""
        if self.width is None:
            raise RuntimeError("PredictionNorm is built by the model (Objective.build) before the step.")
        levels = predictions.unflatten(-1, (-1, self.width))  # [..., L, D']
        weight, bias = (self.weight, self.bias) if self.affine else (None, None)
        return F.layer_norm(levels, (self.width,), weight, bias, self.eps).flatten(-2)

    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        return loss, {}
