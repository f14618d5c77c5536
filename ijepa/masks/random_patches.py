"""MAE-style random masks (:class:`RandomMasks`): a random ``mask_ratio`` of the patches are the
targets, the rest the context. The proof that a mask kind is one file."""

from __future__ import annotations

import math

import torch

from ijepa.masks.base import Grid, Masks


class RandomMaskSampler:
    """Per image, ``round(mask_ratio * N)`` patches drawn uniformly without replacement are one
    target group ``[B, 1, Kt]``; the other ``N - Kt`` are the context ``[B, Kc]``, both sorted.
    Every image has the same counts, so no context policy pads or thins anything; the policy is
    only recorded (``static`` then adds all-True masks to the batch)."""

    def __init__(self, num_patches: int, mask_ratio: float = 0.75, min_keep: int = 4, context_policy: str = "thin"):
        if not 0.0 < mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in (0, 1), got {mask_ratio}.")
        if not 1 <= min_keep < num_patches:
            raise ValueError(
                f"min_keep must be in [1, {num_patches - 1}] on a grid of {num_patches} patches, got {min_keep}."
            )
        self.num_patches, self.mask_ratio, self.min_keep = num_patches, float(mask_ratio), min_keep
        self.context_policy = context_policy
        self.num_targets = round(mask_ratio * num_patches)
        if self.num_targets < 1 or num_patches - self.num_targets < min_keep:
            raise ValueError(
                f"mask_ratio={mask_ratio} masks {self.num_targets} of {num_patches} patches, leaving "
                f"{num_patches - self.num_targets} context patches: it needs at least 1 target and min_keep={min_keep} "
                "context patches; change mask_ratio or min_keep."
            )

    def __call__(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.rand(batch_size, self.num_patches, generator=generator).argsort(dim=1)
        targets = order[:, : self.num_targets].sort(dim=1).values
        context = order[:, self.num_targets :].sort(dim=1).values
        return context, targets[:, None, :]

    def check(self, tries: int = 1, batch_size: int = 1) -> None:
        """Nothing to fail: the constructor checked every setting."""


class RandomMasks(Masks):
    """MAE-style random masks on any grid (images or clips): a random ``mask_ratio`` of the
    patches are the targets (one group per image), the rest the context, at least ``min_keep``."""

    clips = None

    def __init__(self, mask_ratio: float = 0.75, min_keep: int = 4, masks_per_image: int = 1):
        super().__init__(masks_per_image)
        if not 0.0 < mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in (0, 1), got {mask_ratio}.")
        if min_keep < 1:
            raise ValueError(f"min_keep must be >= 1, got {min_keep}.")
        self.mask_ratio = float(mask_ratio)
        self.min_keep = min_keep

    def sampler(self, grid: Grid, context_policy: str | None = None) -> RandomMaskSampler:
        num_patches = grid * grid if isinstance(grid, int) else math.prod(grid)
        return RandomMaskSampler(num_patches, self.mask_ratio, self.min_keep, context_policy or "thin")
