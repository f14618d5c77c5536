"""Top-1 accuracy, the score every probe and protocol reports."""

from __future__ import annotations

import torch
from torchmetrics.functional.classification import multiclass_accuracy


def top1(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in [0, 1] of class ``scores [N, C]`` (logits or votes) against ``labels [N]``:
    the share of rows whose highest score is at their label (micro average)."""
    if scores.dim() != 2 or labels.shape != scores.shape[:1]:
        raise ValueError(f"scores must be [N, C] and labels [N], got {tuple(scores.shape)} and {tuple(labels.shape)}.")
    labels = labels.to(scores.device)
    return float(multiclass_accuracy(scores, labels, num_classes=scores.size(1), average="micro"))
