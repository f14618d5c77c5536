"""The I-JEPA multi-block sampler (:class:`MultiBlockMaskSampler`) and its mask kind
(:class:`MultiBlockMasks`, ``data.masks: {class_path: ijepa.masks.MultiBlockMasks}``)."""

from __future__ import annotations

import math

import torch

from ijepa.masks.base import Masks
from ijepa.masks.policies import (
    CONTEXT_POLICIES,
    STATIC_CONTEXT_QUANTILE,
    check_interval,
    fix_context_count,
    pad_blocks,
    pad_to_longest,
    thin_to_smallest,
)


class MultiBlockMaskSampler:
    """Sample I-JEPA context and target patch indices on a ``grid_size`` x ``grid_size`` grid, or
    on a ``(grid_height, grid_width)`` grid (a native-resolution image, ``ijepa.nn.packing``):
    block areas are then shares of ``grid_height * grid_width``, block sides are clipped to their
    axis, and indices are row-major ``r * grid_width + c``.

    ``sampler(batch_size)`` returns ``context_indices [B, Kc]`` and ``target_indices [B, M, Kt]``,
    row-major patch indices, each row sorted; contexts and targets are disjoint per image. With
    ``context_policy="pad"`` a context row shorter than ``Kc`` repeats its last index
    (:func:`context_padding_mask` says which entries are real); with ``"thin"`` every row has
    exactly ``Kc`` distinct indices.
    """

    def __init__(
        self,
        grid_size: int | tuple[int, int],
        num_target_blocks: int = 4,
        target_scale: tuple[float, float] = (0.15, 0.2),
        target_aspect_ratio: tuple[float, float] = (0.75, 1.5),
        context_scale: tuple[float, float] = (0.85, 1.0),
        context_aspect_ratio: tuple[float, float] = (1.0, 1.0),
        min_keep: int = 4,
        max_tries: int = 20,
        context_policy: str = "thin",
    ):
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, got {context_policy!r}.")
        self.context_policy = context_policy
        height, width = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
        if height < 2 or width < 2:
            raise ValueError(f"grid_size must be >= 2 patches per side, got {grid_size}.")
        if num_target_blocks < 1:
            raise ValueError(f"num_target_blocks must be >= 1, got {num_target_blocks}.")
        self.grid_size = grid_size  # as given: an int for square grids
        self.grid_height, self.grid_width = height, width
        self.num_patches = height * width
        if not 1 <= min_keep < self.num_patches:
            raise ValueError(
                f"min_keep must be in [1, {self.num_patches - 1}] on a {height}x{width} grid, got {min_keep}."
            )
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}.")
        self.num_target_blocks = num_target_blocks
        self.target_scale = check_interval(target_scale, "target_scale", 0.0, 1.0)
        self.target_aspect_ratio = check_interval(target_aspect_ratio, "target_aspect_ratio", 0.0, math.inf)
        self.context_scale = check_interval(context_scale, "context_scale", 0.0, 1.0)
        self.context_aspect_ratio = check_interval(context_aspect_ratio, "context_aspect_ratio", 0.0, math.inf)
        self.min_keep = min_keep
        self.max_tries = max_tries
        if context_policy == "static":
            self.static_targets = max(
                h * w for h, w in self.reachable_shapes(self.target_scale, self.target_aspect_ratio)
            )
            counts = self.draw(2048, torch.Generator().manual_seed(0))[0].sum(1).double()
            self.static_context = max(min_keep, int(counts.quantile(STATIC_CONTEXT_QUANTILE)))

    def reachable_shapes(
        self, scale: tuple[float, float], aspect_ratio: tuple[float, float], steps: int = 401
    ) -> set[tuple[int, int]]:
        """Every ``(height, width)`` :meth:`block_shape` draws, found on a ``steps x steps`` grid
        of its two uniform draws (rounding makes each shape an interval of them)."""
        u = torch.linspace(0.0, 1.0, steps, dtype=torch.float64)
        area = self.num_patches * (scale[0] + u[:, None] * (scale[1] - scale[0]))
        aspect = aspect_ratio[0] + u[None, :] * (aspect_ratio[1] - aspect_ratio[0])
        heights = (area * aspect).sqrt().round().clamp(1, self.grid_height).long()
        widths = (area / aspect).sqrt().round().clamp(1, self.grid_width).long()
        return set(zip(heights.flatten().tolist(), widths.flatten().tolist()))

    def block_shape(
        self, scale: tuple[float, float], aspect_ratio: tuple[float, float], generator: torch.Generator | None = None
    ) -> tuple[int, int]:
        """Draw a block ``(height, width)``: area ``scale * N`` and ``height / width = aspect``,
        rounded to whole patches and clipped to the grid."""
        u = torch.rand(2, generator=generator).tolist()
        area = self.num_patches * (scale[0] + u[0] * (scale[1] - scale[0]))
        aspect = aspect_ratio[0] + u[1] * (aspect_ratio[1] - aspect_ratio[0])
        height = min(max(round(math.sqrt(area * aspect)), 1), self.grid_height)
        width = min(max(round(math.sqrt(area / aspect)), 1), self.grid_width)
        return height, width

    def place_blocks(
        self, count: int, height: int, width: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-left corners ``([count], [count])`` of ``height`` x ``width`` blocks, uniform over the
        ``(G_h - height + 1) x (G_w - width + 1)`` positions inside the grid."""
        top = torch.randint(0, self.grid_height - height + 1, (count,), generator=generator)
        left = torch.randint(0, self.grid_width - width + 1, (count,), generator=generator)
        return top, left

    def block_indices(self, top: torch.Tensor, left: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Row-major indices ``[count, height * width]`` of the blocks with the given corners."""
        rows = top[:, None, None] + torch.arange(height)[None, :, None]
        cols = left[:, None, None] + torch.arange(width)[None, None, :]
        return (rows * self.grid_width + cols).flatten(1)

    def _block_masks(self, top: torch.Tensor, left: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Boolean masks ``[count, N]`` of the blocks with the given corners."""
        rows, cols = torch.arange(self.grid_height), torch.arange(self.grid_width)
        in_rows = (rows >= top[:, None]) & (rows < top[:, None] + height)
        in_cols = (cols >= left[:, None]) & (cols < left[:, None] + width)
        return (in_rows[:, :, None] & in_cols[:, None, :]).flatten(1)

    def __call__(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        context_masks, target_indices = self.draw(batch_size, generator)
        if self.context_policy == "static":
            target_indices = pad_blocks(target_indices, self.static_targets)
        return self.batch_contexts(context_masks, generator), target_indices

    def draw(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch's boolean contexts ``[B, N]`` and target blocks ``[B, M, Kt]`` (before the
        context policy)."""
        m = self.num_target_blocks
        target_h, target_w = self.block_shape(self.target_scale, self.target_aspect_ratio, generator)
        context_h, context_w = self.block_shape(self.context_scale, self.context_aspect_ratio, generator)

        target_indices = torch.empty(batch_size, m, target_h * target_w, dtype=torch.long)
        context_masks = torch.empty(batch_size, self.num_patches, dtype=torch.bool)
        pending = torch.arange(batch_size)
        for _ in range(self.max_tries):
            # Resample only the images whose context came out too small.
            n = pending.numel()
            top, left = self.place_blocks(n * m, target_h, target_w, generator)
            targets = self.block_indices(top, left, target_h, target_w).view(n, m, -1)
            covered = self._block_masks(top, left, target_h, target_w).view(n, m, -1).any(1)
            top, left = self.place_blocks(n, context_h, context_w, generator)
            context = self._block_masks(top, left, context_h, context_w) & ~covered
            target_indices[pending] = targets
            context_masks[pending] = context
            pending = pending[context.sum(1) < self.min_keep]
            if pending.numel() == 0:
                break
        else:
            raise ValueError(
                f"could not leave min_keep={self.min_keep} context patches on a {self.grid_height}x{self.grid_width} "
                f"grid after removing {m} target blocks of {target_h}x{target_w} from a {context_h}x{context_w} "
                f"context block in {self.max_tries} tries: lower num_target_blocks, target_scale or min_keep, "
                f"or raise context_scale."
            )
        return context_masks, target_indices

    def batch_contexts(self, context_masks: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Boolean contexts ``[B, N]`` -> ``context_indices [B, Kc]`` under ``context_policy``."""
        if self.context_policy == "pad":
            return pad_to_longest(context_masks)
        if self.context_policy == "static":
            return fix_context_count(context_masks, self.static_context, generator)
        return thin_to_smallest(context_masks, generator)

    def check(self, tries: int = 8, batch_size: int = 64) -> None:
        """Fail fast (ValueError) if the settings cannot be satisfied on this grid."""
        generator = torch.Generator().manual_seed(0)
        for _ in range(tries):
            self(batch_size, generator)


class MultiBlockMasks(Masks):
    """I-JEPA's multi-block masks (:class:`MultiBlockMaskSampler`) on image grids: per image
    ``num_target_blocks`` target blocks of ``target_scale`` (area share) and ``target_aspect_ratio``
    (height / width), one context block of ``context_scale`` from which every target patch is
    removed, at least ``min_keep`` context patches left. ``context_policy``: how a batch holds
    contexts of different lengths (``thin``, ``pad`` or ``static``: :mod:`ijepa.masks`).

    A native-resolution image (:meth:`native_sampler`) keeps its whole context; its context
    block's aspect ratio follows the image's own shape and ``min_keep`` scales with its share of
    the full grid's patches (at least 1)."""

    clips = False

    def __init__(
        self,
        num_target_blocks: int = 4,
        target_scale: tuple[float, float] = (0.15, 0.2),
        target_aspect_ratio: tuple[float, float] = (0.75, 1.5),
        context_scale: tuple[float, float] = (0.85, 1.0),
        min_keep: int = 4,
        context_policy: str = "thin",
        masks_per_image: int = 1,
    ):
        super().__init__(masks_per_image)
        if num_target_blocks < 1:
            raise ValueError(f"num_target_blocks must be >= 1, got {num_target_blocks}.")
        if min_keep < 1:
            raise ValueError(f"min_keep must be >= 1, got {min_keep}.")
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, got {context_policy!r}.")
        self.num_target_blocks = num_target_blocks
        self.target_scale = check_interval(target_scale, "target_scale", 0.0, 1.0)
        self.target_aspect_ratio = check_interval(target_aspect_ratio, "target_aspect_ratio", 0.0, math.inf)
        self.context_scale = check_interval(context_scale, "context_scale", 0.0, 1.0)
        self.min_keep = min_keep
        self.context_policy = context_policy

    def sampler(self, grid, context_policy: str | None = None) -> MultiBlockMaskSampler:
        if not isinstance(grid, int) and len(grid) != 2:
            raise ValueError(
                f"MultiBlockMasks samples image grids (a side or (height, width)), got {grid}: "
                "clips take ijepa.masks.SpatioTemporalMasks."
            )
        return MultiBlockMaskSampler(
            grid,
            self.num_target_blocks,
            self.target_scale,
            self.target_aspect_ratio,
            self.context_scale,
            min_keep=self.min_keep,
            context_policy=context_policy or self.context_policy,
        )

    def native_sampler(self, grid: tuple[int, int], canvas: tuple[int, int]) -> MultiBlockMaskSampler:
        aspect = grid[0] / grid[1]
        min_keep = max(1, round(self.min_keep * grid[0] * grid[1] / (canvas[0] * canvas[1])))
        return MultiBlockMaskSampler(
            grid,
            self.num_target_blocks,
            self.target_scale,
            self.target_aspect_ratio,
            self.context_scale,
            context_aspect_ratio=(aspect, aspect),
            min_keep=min_keep,
            max_tries=100,  # one image per call: retries are cheap
            context_policy="pad",  # one image per call: nothing to pad
        )
