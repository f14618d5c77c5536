"""``ijepa eval``: evaluation protocols a paper can cite, on a checkpoint's frozen encoder.

Protocols (each chosen by ``class_path``, :mod:`ijepa.evaluation.protocols`): a grid of linear
heads, V-JEPA's attentive probe, a logistic-regression sweep, k-NN, and low-shot; on data with
masks and counts (:mod:`ijepa.evaluation.dense`), linear segmentation and object counting. Features are
cached per checkpoint (:mod:`ijepa.evaluation.cache`); :class:`Evaluation` runs them. The
classifiers are :mod:`ijepa.classifiers`, the same code as the in-fit probes.
"""

from ijepa.evaluation.data import EvalData
from ijepa.evaluation.dense import CountingProtocol, SegmentationProtocol
from ijepa.evaluation.protocols import (
    AttentiveProtocol,
    KNNProtocol,
    LinearProtocol,
    LogRegProtocol,
    LowShotProtocol,
    Protocol,
    protocol_kinds,
)
from ijepa.evaluation.readouts import GridReadout, MeanReadout, Readout, readout_kinds
from ijepa.evaluation.runner import Evaluation, read_results

__all__ = [
    "AttentiveProtocol",
    "CountingProtocol",
    "EvalData",
    "Evaluation",
    "GridReadout",
    "KNNProtocol",
    "LinearProtocol",
    "LogRegProtocol",
    "LowShotProtocol",
    "MeanReadout",
    "Protocol",
    "Readout",
    "SegmentationProtocol",
    "protocol_kinds",
    "read_results",
    "readout_kinds",
]
