"""Rotary members: each head's channel pairs are rotated by angles linear in the token's
coordinates, so ``<R(p1) q, R(p2) k>`` depends only on ``p1 - p2``. Angles are float32
``[B, 1 or heads, K, head_dim / 2]``; the rotation itself is :func:`ijepa.nn.attention.apply_rotary`."""

from __future__ import annotations

import torch
import torch.nn as nn

from ijepa.nn.position.base import AttentionPositions, PositionEncoding
from ijepa.nn.resize import Grid


def check_head_dim(position: PositionEncoding, multiple: int) -> int:
    """The head dimension, checked to be a multiple of ``multiple`` (pairs split across axes)."""
    if position.head_dim % multiple:
        raise ValueError(
            f"{position.name} needs a head dimension divisible by {multiple} (channel pairs split across the axes); "
            f"got embed_dim={position.embed_dim} / num_heads={position.num_heads} = {position.head_dim}."
        )
    return position.head_dim


def rotary_positions(angles: torch.Tensor) -> AttentionPositions:
    return AttentionPositions(rope=(angles.cos(), angles.sin()))


class RopeAxialPosition(PositionEncoding):
    """Axial 2D RoPE (Heo et al. 2024): the first half of each head's channel pairs is rotated by
    the row, the second half by the column, frequencies ``base ** (-k / (head_dim / 4))``. Row and
    column effects separate; no parameters."""

    name = "rope_axial"
    packable = True

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1, base: float = 100.0):
        super().__init__(grid, embed_dim, num_heads)
        quarter = check_head_dim(self, 4) // 4
        self.base = base
        self.register_buffer("freqs", base ** -(torch.arange(quarter, dtype=torch.float32) / quarter), persistent=False)

    def angles(self, indices: torch.Tensor) -> torch.Tensor:
        """Rotation angles ``[B, 1, K, head_dim / 2]`` of the tokens at ``indices [B, K]``."""
        rows, cols = self.coordinates(indices)
        row_angles = rows.float()[..., None] * self.freqs
        col_angles = cols.float()[..., None] * self.freqs
        return torch.cat([row_angles, col_angles], dim=-1).unsqueeze(1)

    def attention_positions(self, indices, frame_times=None):
        return rotary_positions(self.angles(indices))


class RopeMixedPosition(PositionEncoding):
    """RoPE-Mixed (Heo et al. 2024): learned per-head frequencies spanning both axes, angle
    ``r * f_row[h, j] + c * f_col[h, j]`` for channel pair ``j`` of head ``h``. Still relative
    (angles are linear in position) but able to represent diagonal offsets."""

    name = "rope_mixed"
    packable = True

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1, base: float = 10.0):
        super().__init__(grid, embed_dim, num_heads)
        pairs = check_head_dim(self, 2) // 2
        self.base = base
        self.freqs = nn.Parameter(torch.empty(2, num_heads, pairs))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Heo et al.'s init: axial magnitudes, each head's direction rotated by a random angle.
        pairs = self.freqs.size(-1)
        magnitude = self.base ** -(torch.arange(pairs, dtype=torch.float32) / pairs)
        direction = torch.rand(self.num_heads, 1) * 2 * torch.pi + torch.arange(pairs) % 2 * (torch.pi / 2)
        with torch.no_grad():
            self.freqs[0] = magnitude * direction.cos()
            self.freqs[1] = magnitude * direction.sin()

    def angles(self, indices: torch.Tensor) -> torch.Tensor:
        """Rotation angles ``[B, H, K, head_dim / 2]`` of the tokens at ``indices [B, K]``."""
        rows, cols = self.coordinates(indices)
        freqs = self.freqs.float()
        return (
            rows.float()[:, None, :, None] * freqs[0][None, :, None, :]
            + cols.float()[:, None, :, None] * freqs[1][None, :, None, :]
        )

    def attention_positions(self, indices, frame_times=None):
        return rotary_positions(self.angles(indices))


def mrope_sections(pairs: int) -> tuple[int, int, int]:
    """Qwen2-VL's default split of ``pairs`` rotary channel pairs: a quarter for time, the rest
    halved between height and width (16/24/24 of 64 pairs)."""
    spatial = (3 * pairs) // 8
    return pairs - 2 * spatial, spatial, spatial


class MropePosition(PositionEncoding):
    """Qwen2-VL's multimodal RoPE over clip tokens ``(t, r, c)``: each channel pair keeps its 1D
    RoPE frequency ``base ** (-2j / head_dim)``; the first ``sections[0]`` pairs are rotated by
    the temporal coordinate, the next ``sections[1]`` by the row, the last ``sections[2]`` by the
    column (default split 1/4, 3/8, 3/8). With ``t = r = c`` it is exactly 1D RoPE. The temporal
    coordinate is the frame-token index, or the clip's timestamps when ``frame_times`` are given
    (Qwen2.5-VL's absolute time; the model converts seconds with ``model.time_unit``)."""

    name = "mrope"
    dims = 3

    def __init__(
        self,
        grid: Grid,
        embed_dim: int,
        num_heads: int = 1,
        sections: tuple[int, int, int] | None = None,
        base: float = 10_000.0,
    ):
        super().__init__(grid, embed_dim, num_heads)
        pairs = check_head_dim(self, 2) // 2
        sections = tuple(sections) if sections is not None else mrope_sections(pairs)
        if len(sections) != 3 or min(sections) < 0 or sum(sections) != pairs:
            raise ValueError(
                f"sections must be 3 non-negative pair counts summing to head_dim / 2 = {pairs}, got {sections}."
            )
        self.sections = sections
        self.base = base
        self.register_buffer("freqs", base ** -(torch.arange(pairs, dtype=torch.float32) / pairs), persistent=False)
        self.register_buffer("axis", torch.repeat_interleave(torch.arange(3), torch.tensor(sections)), persistent=False)

    @property
    def grid_time(self) -> int:
        return self.grid[0]

    def token_coordinates(self, indices: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, K, 3]`` float coordinates ``(t, r, c)`` of the tokens at ``indices [B, K]``; ``t``
        read from ``frame_times [B, T]`` (temporal-position units) when given."""
        t, r, c = self.coordinates(indices)
        time = t.float()
        if frame_times is not None:
            if (
                frame_times.dim() != 2
                or frame_times.size(1) != self.grid_time
                or frame_times.size(0) != indices.size(0)
            ):
                raise ValueError(
                    f"frame_times must be [B, {self.grid_time}] with B={indices.size(0)}, got {tuple(frame_times.shape)}."
                )
            time = torch.gather(frame_times.float(), 1, t)
        return torch.stack([time, r.float(), c.float()], dim=-1)

    def angles_from_coordinates(self, coordinates: torch.Tensor) -> torch.Tensor:
        """``[B, K, 3]`` coordinates -> angles ``[B, 1, K, head_dim / 2]``."""
        position_per_pair = coordinates[..., self.axis]  # [B, K, pairs]: each pair's own axis
        return (position_per_pair * self.freqs).unsqueeze(1)

    def angles(self, indices: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """Rotation angles ``[B, 1, K, head_dim / 2]`` of the tokens at ``indices [B, K]``."""
        return self.angles_from_coordinates(self.token_coordinates(indices, frame_times))

    def attention_positions(self, indices, frame_times=None):
        return rotary_positions(self.angles(indices, frame_times))
