"""Pixel normalisation shared by every data source and by the pictures that undo it."""

from __future__ import annotations

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ClipToTensor:
    """``uint8 [T, 3, H, W]`` clip -> normalised float ``[3, T, H, W]`` (channels first, as Conv3d
    takes them)."""

    def __init__(self):
        self.mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)

    def __call__(self, clip: torch.Tensor) -> torch.Tensor:
        return ((clip.float() / 255 - self.mean) / self.std).permute(1, 0, 2, 3).contiguous()


def unnormalize(images: torch.Tensor) -> torch.Tensor:
    """ImageNet-normalised ``[B, 3, H, W]`` (or clips ``[B, 3, T, H, W]``) -> ``[0, 1]``."""
    shape = (1, 3) + (1,) * (images.dim() - 2)
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(shape)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(shape)
    return (images.float() * std + mean).clamp(0, 1)
