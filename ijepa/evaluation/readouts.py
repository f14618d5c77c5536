"""How a pooled-feature protocol reads a frozen encoder's tokens, one class per kind, chosen in
YAML by ``class_path`` (the ``readout`` of the k-NN, logistic-regression, low-shot and linear
protocols):

* :class:`MeanReadout`: every token averaged, ``[B, K, D] -> [B, D]`` (the default; I-JEPA's and
  DINOv2's linear probes);
* :class:`GridReadout`: the token grid average-pooled to ``grid x grid`` cells, the cells
  concatenated, ``[B, K, D] -> [B, grid^2 D]``; ``grid: null`` keeps every token, ``[B, K D]``.

Every encoder is read the same way, raw pixels included: their tokens are the image's patches
(``3 p^2`` values each), so the pixel baseline under :class:`MeanReadout` is the mean patch and
under ``GridReadout(grid: null)`` the whole image (its values reordered, which no protocol
sees). A readout acts on each of the last blocks alone: ``[B, L, K, D] -> [B, L, F]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ijepa.nn.checks import check_range
from ijepa.registry import class_path, concrete_subclasses, from_config

BLOCKS = "blocks"  # the feature kind of the mean readout; another readout's is "blocks:<key>"


class Readout:
    """A way to pool an encoder's tokens into one vector per image and block."""

    key: str = ""

    def pool(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        """``tokens [B, L, K, D]`` (``K`` row-major on ``grid``) -> ``[B, L, F]``."""
        raise NotImplementedError

    def width(self, dim: int, grid: tuple[int, ...]) -> int:
        """``F`` for tokens of width ``dim`` on ``grid``."""
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """The feature kind the cache and the context key this readout's features by."""
        return BLOCKS if not self.key else f"{BLOCKS}:{self.key}"

    def config(self) -> dict:
        return {"class_path": class_path(self), "init_args": dict(vars(self))}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in vars(self).items())})"


class MeanReadout(Readout):
    """Every token averaged (the mean-pool)."""

    def pool(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        return tokens.mean(dim=2)

    def width(self, dim: int, grid: tuple[int, ...]) -> int:
        return dim


class GridReadout(Readout):
    """The token grid average-pooled to ``grid x grid`` cells, concatenated row-major.

    Args:
        grid: cells per side, at most the token grid's side (a side it does not divide gets
            cells of unequal size, as ``adaptive_avg_pool2d`` cuts them); null: every token
            concatenated (no pooling).
    """

    def __init__(self, grid: int | None = 2):
        if grid is not None:
            check_range(grid, "readout.grid", 1)
        self.grid = grid

    @property
    def key(self) -> str:
        return "tokens" if self.grid is None else f"grid{self.grid}"

    def cells(self, grid: tuple[int, ...]) -> tuple[int, ...]:
        if self.grid is None:
            return tuple(grid)
        if len(grid) != 2:
            raise ValueError(
                f"readout: GridReadout(grid={self.grid}) pools an image's 2-D token grid; clip tokens lie on a "
                f"{len(grid)}-D grid: use grid: null (every token) or MeanReadout."
            )
        if self.grid > min(grid):
            raise ValueError(
                f"readout.grid must be in 1..{min(grid)} (the encoder's token grid is {grid[0]}x{grid[1]}), got {self.grid}."
            )
        return (self.grid, self.grid)

    def pool(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        cells = self.cells(grid)  # checks the grid first, clips included
        if self.grid is None:
            return tokens.flatten(2)
        batch, blocks, _, dim = tokens.shape
        maps = tokens.reshape(batch * blocks, *grid, dim).permute(0, 3, 1, 2)  # [B L, D, H', W']
        pooled = F.adaptive_avg_pool2d(maps, cells)  # [B L, D, g, g]
        return pooled.permute(0, 2, 3, 1).reshape(batch, blocks, -1)  # cells row-major, each cell's D values

    def width(self, dim: int, grid: tuple[int, ...]) -> int:
        count = 1
        for side in self.cells(grid):
            count *= side
        return count * dim


def readout_kinds() -> tuple[type[Readout], ...]:
    """The readout classes (the docs' registry)."""
    return tuple(kind for kind in concrete_subclasses(Readout) if kind is not Readout)


def readout_from_config(config: dict | Readout | None) -> Readout:
    """The readout a ``{"class_path", "init_args"}`` dict names (a readout as it is; None: the mean)."""
    if config is None:
        return MeanReadout()
    return config if isinstance(config, Readout) else from_config(config, Readout)


def is_pooled(kind: str) -> bool:
    """Whether a feature kind is one readout's pooled block features ``[N, L, F]``."""
    return kind == BLOCKS or kind.startswith(f"{BLOCKS}:")
