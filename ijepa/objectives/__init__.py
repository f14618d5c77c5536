"""Objectives: changes to what the JEPA step predicts, sees and how its loss is formed, one class
each, chosen in YAML by ``class_path`` (``model.objectives``, a list; empty: I-JEPA's objective).
The kind (:class:`Objective`, its hooks and registry) is :mod:`ijepa.objectives.base`; members:

* :class:`ContextLoss`, :class:`MultiLevelTargets` (V-JEPA 2.1, :mod:`ijepa.objectives.vjepa21`);
* :class:`Recolour`, :class:`ViewInvariance` (the context's views, :mod:`ijepa.objectives.views`);
* :class:`PixelTarget` (MAE's norm-pix target beside or instead of the latent one,
  :mod:`ijepa.objectives.pixels`);
* :class:`PredictionNorm` (a LayerNorm on the predictions before the latent loss,
  :mod:`ijepa.objectives.prediction_norm`).

The objectives read the step's record (:class:`ijepa.step.StepOutput`), which :mod:`ijepa.step`
defines and fills. A new objective is one :class:`Objective` subclass in a file of this package.
"""

from __future__ import annotations

from ijepa.objectives.base import (
    Objective,
    check_resumed_levels,
    context_views,
    latent_predictions,
    latent_weight,
    objective_from_config,
    objective_kinds,
    refuse_packed,
)
from ijepa.objectives.pixels import PixelTarget, norm_pix, patchify
from ijepa.objectives.prediction_norm import PredictionNorm
from ijepa.objectives.views import Recolour, ViewInvariance, invariance_loss, pooled_rows, recolour
from ijepa.objectives.vjepa21 import ContextLoss, MultiLevelTargets, context_distance_weights, grid_coordinates

__all__ = [
    "ContextLoss",
    "MultiLevelTargets",
    "Objective",
    "PixelTarget",
    "PredictionNorm",
    "Recolour",
    "ViewInvariance",
    "check_resumed_levels",
    "context_distance_weights",
    "context_views",
    "grid_coordinates",
    "invariance_loss",
    "latent_predictions",
    "latent_weight",
    "norm_pix",
    "objective_from_config",
    "objective_kinds",
    "patchify",
    "pooled_rows",
    "recolour",
    "refuse_packed",
]
