"""Callbacks, each switchable in a config's ``trainer.callbacks``."""

from ijepa.callbacks.ema import EMATargetUpdate, ema_update_
from ijepa.callbacks.knn import KNNProbe, knn_scores

__all__ = ["EMATargetUpdate", "KNNProbe", "ema_update_", "knn_scores"]
