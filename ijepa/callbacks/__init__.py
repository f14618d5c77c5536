"""Callbacks, each switchable in a config's ``trainer.callbacks``."""

from ijepa.callbacks.ema import EMATargetUpdate, ema_update_
from ijepa.callbacks.knn import KNNProbe, knn_scores
from ijepa.callbacks.position_images import PositionSimilarityImages
from ijepa.callbacks.resolution import PositionEmbeddingInterpolation

__all__ = ["EMATargetUpdate", "KNNProbe", "PositionEmbeddingInterpolation", "PositionSimilarityImages", "ema_update_", "knn_scores"]
