"""MixUp, CutMix and label smoothing of fine-tuning batches (torchvision transforms v2), as a
collate function whose every draw is seeded by the batch's samples.

:class:`MixCollate` turns samples ``(image [3, H, W], label, sample_seed)`` (from
:class:`ijepa.data.sampling.SeededSamples`) into ``(images [B, 3, H, W], targets [B, C])``: soft
targets, each row summing to 1. With mixing on, a batch gets MixUp with probability ``1 -
switch_prob`` and CutMix otherwise (torchvision's ``MixUp`` and ``CutMix``, one ``lambda`` per
batch, as in MAE's timm ``Mixup``); label smoothing then spreads ``label_smoothing`` of each row
evenly over the classes (it commutes with the mixing: both are linear). The draws come from a
generator seeded by the samples' seeds, so a batch is the same in any worker and after a resume.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate
from torchvision.transforms import v2

from ijepa.data.collate import split_seeds
from ijepa.nn.checks import check_range


def smooth(targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """``targets [B, C]`` (rows summing to 1) with ``label_smoothing`` of each row spread evenly:
    ``(1 - e) targets + e / C``; what ``F.cross_entropy(label_smoothing=e)`` trains against."""
    return targets * (1.0 - label_smoothing) + label_smoothing / targets.size(-1)


def check_labels(labels: torch.Tensor, num_classes: int, option: str = "data.source") -> None:
    """One line if a label lies outside ``0 .. num_classes - 1``."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        bad = int(labels.max()) if int(labels.max()) >= num_classes else int(labels.min())
        raise ValueError(
            f"{option}: a label {bad} lies outside 0..{num_classes - 1} (model.num_classes={num_classes}); "
            "set model.num_classes to the data's class count (or null: the data's)."
        )


class MixCollate:
    """Collate with MixUp / CutMix and label smoothing into soft targets ``[B, C]``.

    Args:
        num_classes: classes of the targets.
        mixup_alpha: MixUp's Beta(alpha, alpha) (0: no MixUp; MAE: 0.8).
        cutmix_alpha: CutMix's Beta(alpha, alpha) (0: no CutMix; MAE: 1.0).
        switch_prob: with both on, the probability a batch gets CutMix rather than MixUp (MAE: 0.5).
        mix_prob: probability that a batch is mixed at all (MAE: 1.0).
        label_smoothing: share of each target spread over all classes, in [0, 1) (MAE: 0.1).
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        switch_prob: float = 0.5,
        mix_prob: float = 1.0,
        label_smoothing: float = 0.0,
    ):
        check_range(num_classes, "model.num_classes", 2)
        check_range(mixup_alpha, "data.mixup_alpha", 0)
        check_range(cutmix_alpha, "data.cutmix_alpha", 0)
        check_range(switch_prob, "data.switch_prob", 0, 1)
        check_range(mix_prob, "data.mix_prob", 0, 1)
        check_range(label_smoothing, "data.label_smoothing", 0, 1, high_open=True)
        self.num_classes, self.mix_prob, self.label_smoothing = num_classes, mix_prob, label_smoothing
        kinds, weights = [], []
        if mixup_alpha > 0:
            kinds.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
            weights.append(1.0 - switch_prob if cutmix_alpha > 0 else 1.0)
        if cutmix_alpha > 0:
            kinds.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
            weights.append(switch_prob if mixup_alpha > 0 else 1.0)
        self.mix = v2.RandomChoice(kinds, p=weights) if kinds else None

    def __call__(self, samples: list) -> tuple[torch.Tensor, torch.Tensor]:
        samples, generator = split_seeds(samples)
        images, labels = default_collate(samples)
        images, labels = torch.as_tensor(images), torch.as_tensor(labels)
        check_labels(labels, self.num_classes)
        return self.mix_batch(images, labels, generator)

    def mix_batch(
        self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images [B, 3, H, W], labels [B])`` -> mixed images and soft targets ``[B, C]``."""
        seed = int(torch.randint(2**62, (1,), generator=generator))
        targets = F.one_hot(labels, self.num_classes).float()
        if self.mix is not None:
            # torchvision draws from the global RNG: run it on a fork seeded by this batch
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                if float(torch.rand(())) < self.mix_prob:
                    images, targets = self.mix(images, labels)
                    images = images.as_subclass(torch.Tensor)
        return images, smooth(targets, self.label_smoothing)
