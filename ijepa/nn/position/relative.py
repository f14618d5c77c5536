"""Relative members: a learned bias on the attention logits indexed by the offset between two
tokens' grid positions."""

from __future__ import annotations

import torch
import torch.nn as nn

from ijepa.nn.position.base import AttentionPositions, PositionEncoding
from ijepa.nn.resize import Grid, interpolate_relative_bias_table


class RelativeBiasPosition(PositionEncoding):
    """Swin-style learned bias per head over grid offsets ``(dr, dc)``, added to the attention
    logits: a ``[(2H - 1)(2W - 1), heads]`` table; the bias ``[B, heads, K, K]`` is always finite."""

    name = "relative_bias"

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1):
        super().__init__(grid, embed_dim, num_heads)
        self.table = nn.Parameter(torch.empty((2 * self.grid_height - 1) * (2 * self.grid_width - 1), num_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.table, std=0.02)

    def offset_index(self, indices: torch.Tensor) -> torch.Tensor:
        """Row of the table for every token pair: ``[B, K, K]``."""
        rows, cols = self.coordinates(indices)
        dr = rows[:, :, None] - rows[:, None, :] + self.grid_height - 1
        dc = cols[:, :, None] - cols[:, None, :] + self.grid_width - 1
        return dr * (2 * self.grid_width - 1) + dc

    def attention_positions(self, indices, frame_times=None):
        return AttentionPositions(bias=self.table[self.offset_index(indices)].permute(0, 3, 1, 2))

    def state_resizers(self, old_grid, mode="bicubic", antialias=False):
        return {"table": lambda t: interpolate_relative_bias_table(t, old_grid, self.grid, mode, antialias)}
