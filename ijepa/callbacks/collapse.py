"""Collapse monitoring: spread and effective rank of the target encoder's features."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn


def feature_std(features: torch.Tensor) -> torch.Tensor:
    """Mean over channels of the per-channel standard deviation across samples, ``[N, D] -> []``.
    Zero when every image gets the same feature (complete collapse)."""
    return features.float().std(dim=0).mean()


def rankme(features: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """RankMe (Garrido et al. 2023): ``exp`` of the entropy of the normalised singular values of
    ``features [N, D]``; between 1 (all samples on one direction) and ``min(N, D)``."""
    singular = torch.linalg.svdvals(features.float())
    p = singular / singular.sum().clamp_min(eps) + eps
    return torch.exp(-(p * p.log()).sum())


class CollapseMonitor(L.Callback):
    """At each validation, log ``val/target_std`` and ``val/rankme`` of the mean-pooled target
    features ``[B, D]`` that :meth:`IJEPA.validation_step` returns (gathered from every rank), and
    warn when either falls below its threshold.

    Args:
        std_threshold: warn when ``val/target_std`` is below this.
        rankme_threshold: warn when ``val/rankme`` is below this (RankMe is at most the width).
        max_samples: features kept per rank (the SVD is over at most ``world_size * max_samples``).
    """

    def __init__(self, std_threshold: float = 0.01, rankme_threshold: float = 1.5, max_samples: int = 4096):
        if std_threshold < 0 or rankme_threshold < 0:
            raise ValueError(f"thresholds must be >= 0, got std_threshold={std_threshold}, rankme_threshold={rankme_threshold}.")
        if max_samples < 2:
            raise ValueError(f"max_samples must be >= 2, got {max_samples}.")
        self.std_threshold = std_threshold
        self.rankme_threshold = rankme_threshold
        self.max_samples = max_samples
        self._features: list[torch.Tensor] = []
        self._count = 0

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._features, self._count = [], 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not isinstance(outputs, dict) or "target_features" not in outputs or self._count >= self.max_samples:
            return
        features = outputs["target_features"].detach()[: self.max_samples - self._count]
        self._features.append(features)
        self._count += features.size(0)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not self._features:
            return
        features = torch.cat(self._features)
        if trainer.world_size > 1:  # every rank computes the same numbers from all ranks' features
            features = pl_module.all_gather(features).flatten(0, 1)
        std, rank = feature_std(features), rankme(features)
        pl_module.log("val/target_std", std)
        pl_module.log("val/rankme", rank)
        step = trainer.global_step
        if std < self.std_threshold:
            rank_zero_warn(f"Possible collapse at step {step}: val/target_std={float(std):.3g} < std_threshold={self.std_threshold}.")
        if rank < self.rankme_threshold:
            rank_zero_warn(f"Possible collapse at step {step}: val/rankme={float(rank):.3g} < rankme_threshold={self.rankme_threshold}.")
        self._features = []
