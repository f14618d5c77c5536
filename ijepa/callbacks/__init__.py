"""Callbacks, each switchable in a config's ``trainer.callbacks``."""

from ijepa.callbacks.collapse import CollapseMonitor, feature_std, rankme
from ijepa.callbacks.ema import EMATargetUpdate, ema_update_
from ijepa.callbacks.knn import KNNProbe, knn_scores
from ijepa.callbacks.position_images import PositionSimilarityImages
from ijepa.callbacks.resolution import PositionEmbeddingInterpolation

__all__ = [
    "CollapseMonitor",
    "EMATargetUpdate",
    "KNNProbe",
    "PositionEmbeddingInterpolation",
    "PositionSimilarityImages",
    "ema_update_",
    "feature_std",
    "knn_scores",
    "rankme",
]
