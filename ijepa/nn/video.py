"""Video building blocks: the tubelet embedding of a clip encoder and per-tubelet timestamps.

A clip encoder is :class:`ijepa.nn.vit.VisionTransformer` with a :class:`TubeletEmbed`
(``VisionTransformer.for_clips``). Tokens are row-major over (time, row, column):
``i = (t * H' + r) * W' + c``. The clip position encodings (``sincos_3d``, ``learned_flat_3d``,
``mrope``) are members of :mod:`ijepa.nn.position` with ``dims = 3``, run by the shared
``Transformer`` through the same hooks as the image encodings.
"""

from __future__ import annotations

import torch
from torch import nn

from ijepa.nn.checks import check_positive


class TubeletEmbed(nn.Module):
    """``[B, C, T, H, W] -> [B, T' H' W', D]`` with one ``tubelet_size x patch_size x patch_size``
    Conv3d (V-JEPA), tokens row-major over ``(t, r, c)``; ``grid`` is ``(T', H', W')``."""

    def __init__(
        self,
        num_frames: int,
        image_size: int,
        tubelet_size: int = 2,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
    ):
        super().__init__()
        for value, name in (
            (num_frames, "num_frames"),
            (image_size, "image_size"),
            (tubelet_size, "tubelet_size"),
            (patch_size, "patch_size"),
            (embed_dim, "embed_dim"),
        ):
            check_positive(value, name)
        if num_frames % tubelet_size:
            raise ValueError(f"num_frames={num_frames} must be a multiple of tubelet_size={tubelet_size}.")
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} must be a multiple of patch_size={patch_size}.")
        self.num_frames, self.image_size = num_frames, image_size
        self.tubelet_size, self.patch_size = tubelet_size, patch_size
        self.grid = (num_frames // tubelet_size, image_size // patch_size, image_size // patch_size)
        self.num_patches = self.grid[0] * self.grid[1] * self.grid[2]
        self.proj = nn.Conv3d(
            in_channels,
            embed_dim,
            (tubelet_size, patch_size, patch_size),
            stride=(tubelet_size, patch_size, patch_size),
        )

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        if clips.dim() != 5:
            raise ValueError(f"clips must be [B, C, T, H, W], got {tuple(clips.shape)}.")
        tokens = self.proj(clips)  # [B, D, T', H', W']
        if tuple(tokens.shape[2:]) != self.grid:
            raise ValueError(f"clips {tuple(clips.shape)} give a {tuple(tokens.shape[2:])} grid, expected {self.grid}.")
        return tokens.flatten(2).transpose(1, 2)


def tubelet_times(frame_times: torch.Tensor, tubelet_size: int) -> torch.Tensor:
    """Per-frame timestamps ``[B, T]`` (seconds) -> one per temporal token ``[B, T // tubelet_size]``:
    the time of each tubelet's first frame. Only differences reach M-RoPE, so the choice of the
    first frame (rather than the middle) shifts every token equally and changes nothing."""
    if frame_times.dim() != 2 or frame_times.size(1) % tubelet_size:
        raise ValueError(
            f"frame_times must be [B, T] with T a multiple of tubelet_size={tubelet_size}, "
            f"got {tuple(frame_times.shape)}."
        )
    return frame_times[:, ::tubelet_size]


def temporal_positions(frame_times: torch.Tensor, tubelet_size: int, time_unit: float) -> torch.Tensor:
    """Per-frame timestamps ``[B, T]`` (seconds) -> the temporal positions an encoder takes,
    ``[B, T // tubelet_size]``: each tubelet's first time in units of ``time_unit`` (seconds per
    position). Training (``IJEPA.token_times``) and ``ijepa eval`` both convert through this."""
    return tubelet_times(frame_times, tubelet_size) / time_unit
