"""Callbacks, each switchable in a config's ``trainer.callbacks``. The probes' classifiers are
:mod:`ijepa.classifiers`."""

from ijepa.callbacks.attentive import AttentiveProbe
from ijepa.callbacks.checkpoint_safety import CheckpointFolderCheck, PreemptionCheckpoint
from ijepa.callbacks.collapse import CollapseMonitor, feature_std, rankme
from ijepa.callbacks.ema import EMATargetUpdate, ema_update_
from ijepa.callbacks.features import FeatureWriter
from ijepa.callbacks.final_checkpoint import FinalCheckpoint
from ijepa.callbacks.jepa_images import JEPAImages, position_loss_map
from ijepa.callbacks.knn import KNNProbe
from ijepa.callbacks.linear import LinearProbe
from ijepa.callbacks.position_images import PositionSimilarityImages
from ijepa.callbacks.probe import Probe, extract_features
from ijepa.callbacks.rank_watchdog import RankWatchdog
from ijepa.callbacks.resolution import PositionEmbeddingInterpolation
from ijepa.callbacks.spike import LossSpikeSkip, SpikeTracker
from ijepa.callbacks.throughput import ThroughputLogger, peak_flops, step_flops

__all__ = [
    "AttentiveProbe",
    "CheckpointFolderCheck",
    "CollapseMonitor",
    "EMATargetUpdate",
    "FeatureWriter",
    "FinalCheckpoint",
    "JEPAImages",
    "KNNProbe",
    "LinearProbe",
    "LossSpikeSkip",
    "PositionEmbeddingInterpolation",
    "PositionSimilarityImages",
    "PreemptionCheckpoint",
    "Probe",
    "RankWatchdog",
    "SpikeTracker",
    "ThroughputLogger",
    "ema_update_",
    "extract_features",
    "feature_std",
    "peak_flops",
    "position_loss_map",
    "rankme",
    "step_flops",
]
