"""Video building blocks: tubelet embedding and a ViT over a ``T' x H' x W'`` token grid.

Tokens are row-major over (time, row, column): ``i = (t * H' + r) * W' + c``. The clip position
encodings (``sincos_3d``, ``learned_3d``, ``mrope``) are members of :mod:`ijepa.nn.position`
with ``dims = 3``, run by the shared :class:`Transformer` through the same hooks as the image
encodings.
"""

from __future__ import annotations

import torch
from torch import nn

from ijepa.nn.checks import check_indices, check_positive
from ijepa.nn.patch import gather_patches
from ijepa.nn.position import PositionEncoding, build_position_encoding
from ijepa.nn.vit import (
    Transformer,
    block_token_outputs,
    init_vit_weights,
    pooled_block_features,
    rescale_residual_branches,
)


class TubeletEmbed(nn.Module):
    """``[B, C, T, H, W] -> [B, T' H' W', D]`` with one ``tubelet_size x patch_size x patch_size``
    Conv3d (V-JEPA), tokens row-major over ``(t, r, c)``."""

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


class VideoVisionTransformer(nn.Module):
    """ViT encoder on clips that runs only on the given tokens.

    ``forward(clips [B, C, T, H, W], patch_indices [B, K] | None, frame_times [B, T'] | None)
    -> [B, K, D]``; with no indices it encodes all ``T' H' W'`` tokens in row-major order.
    ``frame_times`` (one per temporal token, in temporal-position units) reach ``mrope``; the
    others ignore them.
    ``token_mask [B, K]`` (True for real tokens) marks padding among the indices.
    The blocks are the image encoder's :class:`ijepa.nn.vit.Transformer`, unchanged.
    """

    def __init__(
        self,
        num_frames: int = 16,
        image_size: int = 64,
        tubelet_size: int = 2,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.0,
        pos_embed: str = "sincos_3d",
        rescale_residuals: bool = True,
        pos_options: dict | None = None,
    ):
        super().__init__()
        self.patch_embed = TubeletEmbed(num_frames, image_size, tubelet_size, patch_size, in_channels, embed_dim)
        self.grid = self.patch_embed.grid
        self.num_patches = self.patch_embed.num_patches
        self.embed_dim = embed_dim
        position = build_position_encoding(pos_embed, self.grid, embed_dim, num_heads, pos_options)
        self.transformer = Transformer(embed_dim, depth, num_heads, position, mlp_ratio, True, drop_path_rate)
        self.apply(init_vit_weights)
        position.reset_parameters()
        if rescale_residuals:
            rescale_residual_branches(self.transformer.blocks)

    @property
    def position(self) -> PositionEncoding:
        return self.transformer.position

    def pooled_features(
        self, clips: torch.Tensor, last_blocks: int = 1, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean over all tokens of the last ``last_blocks`` blocks' normed outputs, concatenated:
        ``[B, C, T, H, W] -> [B, last_blocks * D]`` (as :meth:`VisionTransformer.pooled_features`)."""
        return pooled_block_features(self, clips, last_blocks, frame_times)

    def block_outputs(
        self, clips: torch.Tensor, last_blocks: int = 1, frame_times: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """The last ``last_blocks`` blocks' normed outputs on all tokens, ``last_blocks`` x
        ``[B, N, D]`` (oldest block first; :func:`~ijepa.nn.vit.block_token_outputs`)."""
        return block_token_outputs(self, clips, last_blocks, frame_times)

    def forward(
        self,
        clips: torch.Tensor,
        patch_indices: torch.Tensor | None = None,
        frame_times: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens = self.patch_embed(clips)  # [B, N, D]
        if patch_indices is None:
            patch_indices = torch.arange(self.num_patches, device=clips.device).expand(clips.size(0), -1)
        else:
            check_indices(patch_indices, self.num_patches, "patch_indices")
            tokens = gather_patches(tokens, patch_indices)
        return self.transformer(tokens, patch_indices, frame_times=frame_times, token_mask=token_mask)
