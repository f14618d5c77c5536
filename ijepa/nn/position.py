"""Position encodings over a 2D patch grid.

Every encoding receives the integer patch indices of the tokens it sees (``[B, K]``, row-major
``i = r * grid_width + c``), never assumes the full grid, and acts in up to three places of a
transformer (see :class:`PositionEncoding`):

* additive: a ``[B, K, D]`` embedding added to the tokens before the first block
  (``learned``, ``sincos``);
* attention: rotary angles for q/k or a bias on the attention logits, handed to every attention
  layer as :class:`AttentionPositions`;
* after a block: a token-mixing step such as a positional convolution.

The encoder and predictor call all three hooks, so a new encoding plugs in by overriding the
hook it needs; nothing in the transformer changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ijepa.nn.checks import check_indices, check_positive
from ijepa.nn.patch import gather_patches
from ijepa.nn.resize import (
    Resizer,
    interpolate_axis_table,
    interpolate_position_embedding,
    interpolate_relative_bias_table,
)

SINCOS_AXIS_ORDERS = ("col_row", "row_col")


@dataclass
class AttentionPositions:
    """What an attention layer needs to know about token positions.

    Attributes:
        rope: optional ``(cos, sin)``, each ``[B, 1, K, head_dim / 2]``, rotating q and k.
        bias: optional additive attention bias ``[B, heads, K, K]`` (finite values only).
    """

    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    bias: torch.Tensor | None = None


class PositionEncoding(nn.Module):
    """Base class: a position encoding over a ``grid_height`` x ``grid_width`` patch grid.

    Subclasses override the hooks they act through; the defaults do nothing.
    """

    # Whether attention_positions takes ``frame_times [B, T']`` (M-RoPE's timestamps); the
    # Transformer passes them only to encodings that do.
    takes_frame_times = False

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int):
        super().__init__()
        check_positive(grid_height, "grid_height")
        check_positive(grid_width, "grid_width")
        check_positive(embed_dim, "embed_dim")
        self.grid_height = grid_height
        self.grid_width = grid_width
        self.num_positions = grid_height * grid_width
        self.embed_dim = embed_dim

    def add_to_tokens(self, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """``tokens [B, K, D]`` at ``indices [B, K]`` -> tokens with absolute positions added."""
        return tokens

    def attention_positions(self, indices: torch.Tensor) -> AttentionPositions | None:
        """Rotary angles and/or attention bias for tokens at ``indices [B, K]``."""
        return None

    def after_block(self, block_index: int, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Hook run after transformer block ``block_index`` on ``tokens [B, K, D]``."""
        return tokens

    def row_col(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row-major indices ``[B, K]`` -> grid rows and columns, each ``[B, K]``."""
        return indices // self.grid_width, indices % self.grid_width

    @property
    def grid(self) -> tuple[int, int]:
        """``(grid_height, grid_width)``."""
        return self.grid_height, self.grid_width

    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of the parameters the optimizer must not decay: by
        default all of them, since an encoding's parameters are tables of per-position (or
        per-frequency) values, which weight decay would pull towards "no position" (ViT, timm)."""
        return {name for name, _ in self.named_parameters()}

    def state_resizers(
        self, old_grid: tuple[int, int], mode: str = "bicubic", antialias: bool = False
    ) -> dict[str, Resizer]:
        """How to bring this module's saved tensors from ``old_grid`` to its own grid.

        Returns ``{state-dict key relative to this module: function old tensor -> new tensor}``
        for the grid-dependent tensors only; fixed tables (sin-cos) and rotary angles are
        computed from the grid and need nothing, so the default is empty.
        """
        return {}


class NoPositionEmbedding(PositionEncoding):
    """The ablation: no position information; the transformer is permutation-equivariant."""


class AdditivePositionEmbedding(PositionEncoding):
    """Base for encodings that add a ``[N, D]`` table, looked up at the token indices."""

    def table(self) -> torch.Tensor:
        """The full ``[N, D]`` table in row-major order."""
        raise NotImplementedError

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """``indices [B, K]`` -> embeddings ``[B, K, D]``."""
        check_indices(indices, self.num_positions, "indices")
        return self.table()[indices.long()]

    def full_grid(self, batch_size: int = 1) -> torch.Tensor:
        """Embeddings of every grid position, ``[batch_size, N, D]``."""
        return self.table().unsqueeze(0).expand(batch_size, -1, -1)

    def add_to_tokens(self, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return tokens + self(indices)


class Learned2DPositionEmbedding(AdditivePositionEmbedding):
    """ViT's learned table over the flattened row-major index (trunc-normal init, std 0.02)."""

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int):
        super().__init__(grid_height, grid_width, embed_dim)
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


class FixedSinCos2DPositionEmbedding(AdditivePositionEmbedding):
    """Fixed 2D sin-cos embedding (MAE / I-JEPA); a float32 buffer, not saved in checkpoints."""

    def __init__(
        self,
        grid_height: int,
        grid_width: int,
        embed_dim: int,
        temperature: float = 10_000.0,
        axis_order: str = "col_row",
    ):
        super().__init__(grid_height, grid_width, embed_dim)
        self.temperature = temperature
        self.axis_order = axis_order
        table = sinusoidal_2d_grid(grid_height, grid_width, embed_dim, temperature, axis_order)
        self.register_buffer("embedding", table, persistent=False)

    def table(self) -> torch.Tensor:
        return self.embedding


def add_position_embedding(tokens: torch.Tensor, pos_embed: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
    """ViT-style broadcast add of a ``[1, N, D]`` table to ``[B, N, D]`` tokens.

    With ``num_prefix_tokens > 0`` (class or register tokens first in the sequence), the table
    may either cover the whole sequence (``N`` rows, prefix rows included, as in ViT) or only the
    patches (``N - num_prefix_tokens`` rows, prefix tokens left unchanged).
    """
    if tokens.dim() != 3 or pos_embed.dim() != 3 or pos_embed.size(0) != 1:
        raise ValueError(
            f"expected tokens [B, N, D] and pos_embed [1, N, D], got {tuple(tokens.shape)} and {tuple(pos_embed.shape)}."
        )
    if pos_embed.size(-1) != tokens.size(-1):
        raise ValueError(f"pos_embed width {pos_embed.size(-1)} != token width {tokens.size(-1)}.")
    if pos_embed.size(1) == tokens.size(1):
        return tokens + pos_embed
    if num_prefix_tokens > 0 and pos_embed.size(1) == tokens.size(1) - num_prefix_tokens:
        prefix, patches = tokens[:, :num_prefix_tokens], tokens[:, num_prefix_tokens:]
        return torch.cat([prefix, patches + pos_embed], dim=1)
    raise ValueError(
        f"pos_embed has {pos_embed.size(1)} rows for {tokens.size(1)} tokens with num_prefix_tokens={num_prefix_tokens}: "
        f"expected {tokens.size(1)} (prefix rows included) or {tokens.size(1) - num_prefix_tokens} (patches only)."
    )


def gather_tokens_with_positions(
    patch_tokens: torch.Tensor, indices: torch.Tensor, position_embedding: AdditivePositionEmbedding
) -> torch.Tensor:
    """Gather ``[B, N, D]`` patch tokens at ``indices [B, K]`` and add their positions: ``[B, K, D]``."""
    return gather_patches(patch_tokens, indices) + position_embedding(indices)


class LearnedFactorized2DPositionEmbedding(AdditivePositionEmbedding):
    """Learned row table ``[H, D]`` plus column table ``[W, D]``, summed: ``(H + W) * D`` parameters."""

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int):
        super().__init__(grid_height, grid_width, embed_dim)
        self.row = nn.Parameter(torch.empty(grid_height, embed_dim))
        self.col = nn.Parameter(torch.empty(grid_width, embed_dim))
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
        check_indices(indices, self.num_positions, "indices")
        rows, cols = self.row_col(indices.long())
        return self.row[rows] + self.col[cols]


def _head_dim(embed_dim: int, num_heads: int, multiple: int, name: str) -> int:
    if num_heads <= 0 or embed_dim % num_heads != 0:
        raise ValueError(f"num_heads={num_heads} must be a positive divisor of the width {embed_dim}.")
    head_dim = embed_dim // num_heads
    if head_dim % multiple != 0:
        raise ValueError(
            f"{name} needs a head dimension divisible by {multiple} (channel pairs split across the axes); "
            f"got embed_dim={embed_dim} / num_heads={num_heads} = {head_dim}."
        )
    return head_dim


class RotaryAxial2DPositionEmbedding(PositionEncoding):
    """Axial 2D RoPE (Heo et al. 2024): the first half of each head's channel pairs is rotated by
    the row, the second half by the column, with frequencies ``base ** (-k / (head_dim / 4))``.

    ``<R(p1) q, R(p2) k>`` depends only on ``p1 - p2``, and row and column effects separate.
    Angles are float32 (``[B, 1, K, head_dim / 2]``); no additive table.
    """

    needs_num_heads = True

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int, num_heads: int = 1, base: float = 100.0):
        super().__init__(grid_height, grid_width, embed_dim)
        head_dim = _head_dim(embed_dim, num_heads, 4, "rope_axial")
        quarter = head_dim // 4
        freqs = base ** -(torch.arange(quarter, dtype=torch.float32) / quarter)
        self.register_buffer("freqs", freqs, persistent=False)

    def angles(self, indices: torch.Tensor) -> torch.Tensor:
        """Rotation angles ``[B, 1, K, head_dim / 2]`` of the tokens at ``indices [B, K]``."""
        check_indices(indices, self.num_positions, "indices")
        rows, cols = self.row_col(indices.long())
        row_angles = rows.float()[..., None] * self.freqs
        col_angles = cols.float()[..., None] * self.freqs
        return torch.cat([row_angles, col_angles], dim=-1).unsqueeze(1)

    def attention_positions(self, indices: torch.Tensor) -> AttentionPositions:
        angles = self.angles(indices)
        return AttentionPositions(rope=(angles.cos(), angles.sin()))


class RotaryMixed2DPositionEmbedding(PositionEncoding):
    """RoPE-Mixed (Heo et al. 2024): learned per-head frequencies that span both axes,
    angle ``= r * f_row[h, j] + c * f_col[h, j]`` for channel pair ``j`` of head ``h``.

    Still relative (angles are linear in position) but able to represent diagonal offsets.
    Angles are float32 (``[B, H, K, head_dim / 2]``).
    """

    needs_num_heads = True

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int, num_heads: int = 1, base: float = 10.0):
        super().__init__(grid_height, grid_width, embed_dim)
        head_dim = _head_dim(embed_dim, num_heads, 2, "rope_mixed")
        self.num_heads = num_heads
        self.base = base
        self.freqs = nn.Parameter(torch.empty(2, num_heads, head_dim // 2))
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
        check_indices(indices, self.num_positions, "indices")
        rows, cols = self.row_col(indices.long())
        freqs = self.freqs.float()
        return (
            rows.float()[:, None, :, None] * freqs[0][None, :, None, :]
            + cols.float()[:, None, :, None] * freqs[1][None, :, None, :]
        )

    def attention_positions(self, indices: torch.Tensor) -> AttentionPositions:
        angles = self.angles(indices)
        return AttentionPositions(rope=(angles.cos(), angles.sin()))


class RelativePositionBias(PositionEncoding):
    """Swin-style learned bias per head over grid offsets ``(dr, dc)``, added to attention logits.

    Table ``[(2H - 1) * (2W - 1), heads]``; bias ``[B, heads, K, K]``, always finite.
    """

    needs_num_heads = True

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int, num_heads: int = 1):
        super().__init__(grid_height, grid_width, embed_dim)
        _head_dim(embed_dim, num_heads, 1, "relative_bias")
        self.table = nn.Parameter(torch.empty((2 * grid_height - 1) * (2 * grid_width - 1), num_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.table, std=0.02)

    def offset_index(self, indices: torch.Tensor) -> torch.Tensor:
        """Row of the table for every token pair: ``[B, K, K]``."""
        check_indices(indices, self.num_positions, "indices")
        rows, cols = self.row_col(indices.long())
        dr = rows[:, :, None] - rows[:, None, :] + self.grid_height - 1
        dc = cols[:, :, None] - cols[:, None, :] + self.grid_width - 1
        return dr * (2 * self.grid_width - 1) + dc

    def attention_positions(self, indices: torch.Tensor) -> AttentionPositions:
        return AttentionPositions(bias=self.table[self.offset_index(indices)].permute(0, 3, 1, 2))

    def state_resizers(self, old_grid, mode="bicubic", antialias=False):
        return {"table": lambda t: interpolate_relative_bias_table(t, old_grid, self.grid, mode, antialias)}


class PositionalConvolution(PositionEncoding):
    """CPVT's positional encoding generator: after the first block, a depthwise 3x3 convolution
    over the token grid is added to the tokens. A gathered subset is scattered into a zero grid,
    convolved and gathered back, so absent patches count as zero padding."""

    def __init__(self, grid_height: int, grid_width: int, embed_dim: int):
        super().__init__(grid_height, grid_width, embed_dim)
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


POSITION_EMBEDDINGS: dict[str, type[PositionEncoding]] = {
    "none": NoPositionEmbedding,
    "learned": Learned2DPositionEmbedding,
    "learned_2d": LearnedFactorized2DPositionEmbedding,
    "sincos": FixedSinCos2DPositionEmbedding,
    "rope_axial": RotaryAxial2DPositionEmbedding,
    "rope_mixed": RotaryMixed2DPositionEmbedding,
    "peg": PositionalConvolution,
    "relative_bias": RelativePositionBias,
}


def build_position_embedding(
    name: str, grid_height: int, grid_width: int, embed_dim: int, num_heads: int = 1, **options
) -> PositionEncoding:
    """Build a position encoding by its config name (see ``POSITION_EMBEDDINGS``); rotary and bias
    types also take the attention's ``num_heads``."""
    if name not in POSITION_EMBEDDINGS:
        raise ValueError(f"unknown position embedding {name!r}; valid names: {', '.join(sorted(POSITION_EMBEDDINGS))}.")
    cls = POSITION_EMBEDDINGS[name]
    if getattr(cls, "needs_num_heads", False):
        options["num_heads"] = num_heads
    return cls(grid_height, grid_width, embed_dim, **options)
