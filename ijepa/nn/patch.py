"""Patch embedding and index gathering.

Patches are numbered row-major: the patch at grid row ``r`` and column ``c`` has index
``i = r * grid_width + c``. Every module in the package uses this convention.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.nn.checks import check_indices, check_positive
from ijepa.nn.resize import resize_patch_embed_kernel


def grid_size(image_size: int, patch_size: int) -> int:
    """Patches per side for a square image; ValueError unless ``patch_size`` divides ``image_size``."""
    check_positive(image_size, "image_size")
    check_positive(patch_size, "patch_size")
    if image_size % patch_size != 0:
        lower = image_size - image_size % patch_size
        raise ValueError(
            f"image_size={image_size} must be divisible by patch_size={patch_size} "
            f"(e.g. image_size={lower} or {lower + patch_size})."
        )
    return image_size // patch_size


def gather_patches(tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Select tokens by patch index.

    Args:
        tokens: ``[B, N, D]`` one token per patch, row-major.
        indices: ``[B, K]`` integer patch indices in ``[0, N)``.

    Returns:
        ``[B, K, D]`` with ``out[b, k] = tokens[b, indices[b, k]]``.
    """
    if tokens.dim() != 3:
        raise ValueError(f"tokens must have shape [B, N, D], got {tuple(tokens.shape)}.")
    check_indices(indices, tokens.size(1), "indices")
    if indices.size(0) != tokens.size(0):
        raise ValueError(f"batch mismatch: tokens have B={tokens.size(0)}, indices have B={indices.size(0)}.")
    index = indices.long().unsqueeze(-1).expand(-1, -1, tokens.size(-1))
    return torch.gather(tokens, 1, index)


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch_size`` x ``patch_size`` patches projected to ``embed_dim``.

    ``[B, C, H, W] -> [B, N, D]`` with ``N = (H / P) * (W / P)`` in row-major order.
    ``forward(images, patch_size=p)`` cuts ``p x p`` patches instead, with the kernel resized by
    FlexiViT's pseudo-inverse (:func:`~ijepa.nn.resize.resize_patch_embed_kernel`, the resize a
    checkpoint load applies), gradient included: ``N = (H / p)^2``. ``grid`` is ``(H / P, W / P)``,
    spelled as :class:`~ijepa.nn.video.TubeletEmbed`'s ``(T', H', W')``.
    """

    def __init__(self, image_size: int, patch_size: int, in_channels: int = 3, embed_dim: int = 192):
        super().__init__()
        side = grid_size(image_size, patch_size)
        self.grid = (side, side)
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_patches = side * side
        self.proj = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor, patch_size: int | None = None) -> torch.Tensor:
        if images.dim() != 4:
            raise ValueError(f"images must have shape [B, C, H, W], got {tuple(images.shape)}.")
        if images.size(1) != self.proj.in_channels:
            raise ValueError(
                f"images have {images.size(1)} channels, the patch embedding expects "
                f"in_channels={self.proj.in_channels}."
            )
        h, w = images.shape[-2:]
        if (h, w) != (self.image_size, self.image_size):
            raise ValueError(
                f"images are {h}x{w}, the model was built for image_size={self.image_size} "
                f"(resize the data or rebuild the model)."
            )
        if patch_size is None or patch_size == self.patch_size:
            return self.proj(images).flatten(2).transpose(1, 2)
        grid_size(self.image_size, patch_size)  # a clear error unless patch_size divides the image
        weight = resize_patch_embed_kernel(self.proj.weight, patch_size)
        return F.conv2d(images, weight, self.proj.bias, stride=patch_size).flatten(2).transpose(1, 2)
