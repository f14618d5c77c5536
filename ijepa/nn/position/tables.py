"""Members that add a table of absolute positions to the tokens: learned or fixed sin-cos, over
image grids ``(H, W)`` and clip grids ``(T, H, W)``, plus the sin-cos helpers they are made of."""

from __future__ import annotations

import torch
import torch.nn as nn

from ijepa.nn.position.base import AdditivePosition
from ijepa.nn.resize import Grid, interpolate_3d_table, interpolate_axis_table, interpolate_position_embedding

SINCOS_AXIS_ORDERS = ("col_row", "row_col")


def sinusoidal_1d_positions(positions: torch.Tensor, dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """Transformer sin-cos code of 1D positions: ``[N] -> [N, dim]`` laid out as ``[sin | cos]``.

    Frequencies are ``temperature ** (-k / (dim / 2))`` for ``k < dim / 2``; always float32.
    """
    if dim <= 0 or dim % 2 != 0:
        raise ValueError(f"dim must be a positive even number, got {dim}.")
    omega = torch.arange(dim // 2, device=positions.device, dtype=torch.float32) / (dim // 2)
    omega = temperature**-omega
    angles = positions.float()[:, None] * omega[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def sinusoidal_2d_grid(
    grid_height: int,
    grid_width: int,
    embed_dim: int,
    temperature: float = 10_000.0,
    axis_order: str = "col_row",
    device: torch.device | None = None,
) -> torch.Tensor:
    """Fixed 2D sin-cos table ``[grid_height * grid_width, embed_dim]`` in row-major order.

    Half the channels encode the row, half the column, so the inner product of two rows of the
    table is ``f(r1 - r2) + g(c1 - c2)``. ``axis_order="col_row"`` puts the column half first, as
    MAE and the official I-JEPA code do (so their tables match this one entry for entry);
    ``"row_col"`` puts the row half first (V-JEPA, timm).
    """
    if embed_dim % 4 != 0:
        raise ValueError(f"embed_dim must be divisible by 4 for 2D sin-cos, got {embed_dim}.")
    if axis_order not in SINCOS_AXIS_ORDERS:
        raise ValueError(f"axis_order must be one of {SINCOS_AXIS_ORDERS}, got {axis_order!r}.")
    rows = torch.arange(grid_height, device=device).repeat_interleave(grid_width)
    cols = torch.arange(grid_width, device=device).repeat(grid_height)
    row_code = sinusoidal_1d_positions(rows, embed_dim // 2, temperature)
    col_code = sinusoidal_1d_positions(cols, embed_dim // 2, temperature)
    halves = [col_code, row_code] if axis_order == "col_row" else [row_code, col_code]
    return torch.cat(halves, dim=1)


def sincos_3d_table(
    grid_time: int, grid_height: int, grid_width: int, embed_dim: int, temperature: float = 10_000.0
) -> torch.Tensor:
    """V-JEPA's fixed 3D sin-cos table ``[T H W, D]``, row-major over ``(t, r, c)``: channels
    ``[time (D/2) | row (D/4) | col (D/4)]``, each a 1D sin-cos code (:func:`sinusoidal_1d_positions`)."""
    if embed_dim % 8:
        raise ValueError(f"embed_dim must be divisible by 8 for 3D sin-cos, got {embed_dim}.")
    t, r, c = torch.meshgrid(
        torch.arange(grid_time), torch.arange(grid_height), torch.arange(grid_width), indexing="ij"
    )
    return torch.cat(
        [
            sinusoidal_1d_positions(t.flatten(), embed_dim // 2, temperature),
            sinusoidal_1d_positions(r.flatten(), embed_dim // 4, temperature),
            sinusoidal_1d_positions(c.flatten(), embed_dim // 4, temperature),
        ],
        dim=1,
    )


class LearnedPosition(AdditivePosition):
    """ViT's learned table, one row per flattened row-major index, trunc-normal(0.02) init;
    ``H W D`` parameters."""

    name = "learned"

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1):
        super().__init__(grid, embed_dim, num_heads)
        self.embedding = nn.Embedding(self.num_positions, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.embedding.weight, std=0.02)

    def table(self) -> torch.Tensor:
        return self.embedding.weight

    def state_resizers(self, old_grid, mode="bicubic", antialias=False):
        return {
            "embedding.weight": lambda t: interpolate_position_embedding(t, old_grid, self.grid, 0, mode, antialias)
        }


class Learned2DPosition(AdditivePosition):
    """A learned row table ``[H, D]`` plus a column table ``[W, D]``, summed (factorized);
    ``(H + W) D`` parameters."""

    name = "learned_2d"
    packable = True

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1):
        super().__init__(grid, embed_dim, num_heads)
        self.row = nn.Parameter(torch.empty(self.grid_height, embed_dim))
        self.col = nn.Parameter(torch.empty(self.grid_width, embed_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.row, std=0.02)
        nn.init.trunc_normal_(self.col, std=0.02)

    def table(self) -> torch.Tensor:
        return (self.row[:, None, :] + self.col[None, :, :]).flatten(0, 1)

    def state_resizers(self, old_grid, mode="bicubic", antialias=False):
        # Per axis: the sum structure (position = row + column) survives the resize.
        return {
            "row": lambda t: interpolate_axis_table(t, self.grid_height, mode, antialias),
            "col": lambda t: interpolate_axis_table(t, self.grid_width, mode, antialias),
        }

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        rows, cols = self.coordinates(indices)
        return self.row[rows] + self.col[cols]


class SincosPosition(AdditivePosition):
    """Fixed 2D sin-cos table (MAE / I-JEPA), half the channels per axis; a float32 buffer, not
    saved in checkpoints. ``axis_order``: ``col_row`` (official I-JEPA / MAE) or ``row_col``
    (V-JEPA / timm)."""

    name = "sincos"
    packable = True

    def __init__(
        self,
        grid: Grid,
        embed_dim: int,
        num_heads: int = 1,
        temperature: float = 10_000.0,
        axis_order: str = "col_row",
    ):
        super().__init__(grid, embed_dim, num_heads)
        self.temperature = temperature
        self.axis_order = axis_order
        table = sinusoidal_2d_grid(self.grid_height, self.grid_width, embed_dim, temperature, axis_order)
        self.register_buffer("embedding", table, persistent=False)

    def table(self) -> torch.Tensor:
        return self.embedding


class LearnedFlat3DPosition(LearnedPosition):
    """``learned`` over clip tokens: one row of a ``[T H W, D]`` table per token (flat, not
    factorised per axis as ``learned_2d``), resized per axis. Its former name
    still builds it (:mod:`ijepa.legacy`)."""

    name = "learned_flat_3d"
    dims = 3

    def state_resizers(self, old_grid, mode="bicubic", antialias=False):
        if len(old_grid) != 3:
            raise ValueError(f"{self.name} needs the checkpoint's (T', H', W') grid, got {old_grid}.")
        return {"embedding.weight": lambda t: interpolate_3d_table(t, tuple(old_grid), self.grid, mode)}


class Sincos3DPosition(AdditivePosition):
    """V-JEPA's fixed 3D sin-cos table over clip tokens, channels ``[time D/2 | row D/4 | col D/4]``;
    a float32 buffer, not saved in checkpoints."""

    name = "sincos_3d"
    dims = 3

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1, temperature: float = 10_000.0):
        super().__init__(grid, embed_dim, num_heads)
        self.register_buffer("pos_embed", sincos_3d_table(*self.grid, embed_dim, temperature), persistent=False)

    def table(self) -> torch.Tensor:
        return self.pos_embed
