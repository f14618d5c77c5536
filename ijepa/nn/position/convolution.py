"""Convolutional members: positions inferred from a convolution over the token grid, after a
block (CPVT's positional encoding generator)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ijepa.nn.checks import check_indices
from ijepa.nn.patch import gather_patches
from ijepa.nn.position.base import PositionEncoding
from ijepa.nn.resize import Grid


class PegPosition(PositionEncoding):
    """CPVT's PEG: after block 1, a depthwise 3x3 convolution over the token grid is added to the
    tokens. A subset is scattered into a zero grid, convolved and gathered back, so absent
    patches count as zero padding; ``9 D + D`` parameters."""

    name = "peg"

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1):
        super().__init__(grid, embed_dim, num_heads)
        self.conv = nn.Conv2d(embed_dim, embed_dim, kernel_size=3, padding=1, groups=embed_dim)

    def scatter_to_grid(self, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """``[B, K, D]`` tokens at ``indices`` -> zero-filled grid ``[B, D, H, W]``."""
        check_indices(indices, self.num_positions, "indices")
        batch, _, dim = tokens.shape
        grid = tokens.new_zeros(batch, self.num_positions, dim)
        # Summing, not assigning: padding that repeats a real index (as zeros) then changes nothing.
        grid.scatter_add_(1, indices.long()[..., None].expand(-1, -1, dim), tokens)
        return grid.transpose(1, 2).reshape(batch, dim, self.grid_height, self.grid_width)

    def no_weight_decay(self) -> set[str]:
        # The depthwise kernel is a convolution's weight, decayed like every other kernel.
        return {"conv.bias"}

    def after_block(self, block_index: int, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        if block_index != 0:
            return tokens
        grid = self.conv(self.scatter_to_grid(tokens, indices))
        return tokens + gather_patches(grid.flatten(2).transpose(1, 2), indices)
