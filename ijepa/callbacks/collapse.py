"""Collapse monitoring: spread and effective rank of the target encoder's features."""

from __future__ import annotations

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ijepa.nn.checks import check_range


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
    """Log ``val/target_std`` and ``val/rankme`` of the mean-pooled target features ``[B, D]`` at
    the start of ``fit`` (step 0, the random-init reference, never warned about) and at each
    validation, and warn on collapse.

    Two kinds of collapse are watched: complete collapse (every image gets nearly the same
    feature: ``val/target_std`` below ``std_threshold``) and dimensional collapse (the features
    span only a few of the ``D`` dimensions: ``val/rankme`` below ``rankme_fraction * D``, or
    below the absolute ``rankme_threshold``). At validation the features are those that
    :meth:`IJEPA.validation_step` returns, gathered from every rank; at step 0 each rank encodes
    the same held-out batches.

    Args:
        std_threshold: warn when ``val/target_std`` is below this.
        rankme_threshold: warn when ``val/rankme`` is below this absolute value.
        rankme_fraction: warn when ``val/rankme`` is below this fraction of the encoder width
            (RankMe is at most ``min(samples, D)``); 0 switches the relative check off.
        max_samples: features kept per rank (the SVD is over at most ``world_size * max_samples``).
        at_start: also measure the random-init encoder when ``fit`` starts at step 0.
    """

    def __init__(
        self,
        std_threshold: float = 0.01,
        rankme_threshold: float = 1.5,
        rankme_fraction: float = 0.1,
        max_samples: int = 4096,
        at_start: bool = True,
    ):
        check_range(std_threshold, "std_threshold", 0)
        check_range(rankme_threshold, "rankme_threshold", 0)
        check_range(rankme_fraction, "rankme_fraction", 0, 1)
        check_range(max_samples, "max_samples", 2)
        self.std_threshold = std_threshold
        self.rankme_threshold = rankme_threshold
        self.rankme_fraction = rankme_fraction
        self.max_samples = max_samples
        self.at_start = at_start
        self._features: list[torch.Tensor] = []
        self._count = 0

    def rankme_floor(self, width: int) -> float:
        """The RankMe below which a ``width``-dimensional feature set counts as collapsed."""
        return max(self.rankme_threshold, self.rankme_fraction * width)

    def check(self, features: torch.Tensor, step: int, warn: bool = True) -> tuple[float, float]:
        """``val/target_std`` and ``val/rankme`` of ``features [N, D]``, warning below the thresholds."""
        std, rank = float(feature_std(features)), float(rankme(features))
        if not warn:
            return std, rank
        if std < self.std_threshold:
            rank_zero_warn(
                f"Possible collapse at step {step}: val/target_std={std:.3g} < std_threshold={self.std_threshold}."
            )
        floor = self.rankme_floor(features.size(1))
        if rank < floor:
            rank_zero_warn(
                f"Possible collapse at step {step}: val/rankme={rank:.3g} < {floor:.3g} "
                f"(rankme_threshold={self.rankme_threshold}, rankme_fraction={self.rankme_fraction} of the width "
                f"{features.size(1)}): the features span only a few dimensions."
            )
        return std, rank

    def on_train_start(self, trainer, pl_module) -> None:
        if not self.at_start or trainer.global_step != 0 or trainer.datamodule is None:
            return
        features, count = [], 0
        with torch.no_grad():
            for batch in trainer.datamodule.val_dataloader():
                batch = move_data_to_device(batch, pl_module.device)
                pooled = pl_module.pooled_target_features(batch)[: self.max_samples - count]
                features.append(pooled)
                count += pooled.size(0)
                if count >= self.max_samples:
                    break
        if not features:
            return
        # A reference, not a verdict: a random-init ViT's pooled features are themselves low-rank
        # (docs/reliability.md has the quickstart's values), so no warning here.
        std, rank = self.check(torch.cat(features), 0, warn=False)
        for logger in trainer.loggers:  # self.log is not available outside the loops
            logger.log_metrics({"val/target_std": std, "val/rankme": rank}, step=0)
        rank_zero_info(f"Collapse monitor (random init, step 0): val/rankme = {rank:.2f}, val/target_std = {std:.4f}")

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
        std, rank = self.check(features, trainer.global_step)
        pl_module.log("val/target_std", std)
        pl_module.log("val/rankme", rank)
        if trainer.state.fn == "fit":
            rank_zero_info(
                f"Collapse monitor (step {trainer.global_step}): val/rankme = {rank:.2f}, val/target_std = {std:.4f}"
            )
        self._features = []
