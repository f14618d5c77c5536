"""I-JEPA multi-block masks, sampled per batch by the collator (:mod:`ijepa.data.collate`).

Per image: ``num_target_blocks`` rectangular target blocks and one large context block from
which every target patch is removed. Block shapes are drawn once per batch (as in I-JEPA), so
every target block in a batch has the same number of patches. A block's top-left corner is drawn
uniformly over every position that keeps it inside the grid, ``[0, G - h]`` (the official sampler
draws from ``[0, G - h)`` and so never reaches the last row and column); cells near the centre
are then covered most often, as in I-JEPA (``docs/data_and_masks.md`` has the coverage maps).

What is left of the context differs in size per image. ``context_policy`` says how a batch
holds them:

* ``thin`` (default, official I-JEPA): every context is randomly thinned to the batch's smallest,
  which discards about a third of an average image's context on a 12x12 grid;
* ``pad``: each image keeps its whole context; shorter ones are padded to the batch's longest by
  repeating their last index, and the collator adds ``context_mask [B, Kc]`` (True for real
  tokens) so the encoder and predictor ignore the padding.

* ``static``: every batch of a run has the same shapes, so a compiled step is captured once
  (``docs/benchmarks.md``). Contexts are cut at random to, or padded up to, one count per run
  (the 5th percentile of the per-image context sizes, measured on the sampler's own draws), and
  target blocks, still drawn per batch, are padded to the largest block the draw can produce by
  repeating their last index; the collator adds ``context_mask`` and ``target_mask`` (True for
  real tokens), which the model uses to ignore the padding.

``thin`` is the default because it measured better (``docs/training.md``).
"""

from __future__ import annotations

import math

import torch

CONTEXT_POLICIES = ("pad", "thin", "static")
STATIC_CONTEXT_QUANTILE = 0.05  # the static context count: this quantile of the per-image context sizes


def _check_range(value: tuple[float, float], name: str, low: float, high: float) -> tuple[float, float]:
    if len(value) != 2 or not (low < value[0] <= value[1] <= high):
        raise ValueError(f"{name} must be (min, max) with {low} < min <= max <= {high}, got {tuple(value)}.")
    return float(value[0]), float(value[1])


def pad_to_longest(context_masks: torch.Tensor) -> torch.Tensor:
    """Boolean contexts ``[B, N]`` -> indices ``[B, keep]`` in increasing order, ``keep`` the
    longest context of the batch; a shorter row repeats its last index to fill up (so every index
    stays valid). :func:`context_padding_mask` recovers which entries are real."""
    counts = context_masks.sum(1)
    keep = int(counts.max())
    # Stable sort puts each row's context indices first, in increasing order.
    order = (~context_masks).to(torch.uint8).argsort(dim=1, stable=True)[:, :keep]
    last = order.gather(1, (counts - 1).clamp_min(0)[:, None])
    real = torch.arange(keep)[None, :] < counts[:, None]
    return torch.where(real, order, last)


def context_padding_mask(context_indices: torch.Tensor) -> torch.Tensor:
    """``[B, Kc]`` indices from :func:`pad_to_longest` -> ``[B, Kc]`` boolean, True for real
    tokens: real indices increase strictly, padding repeats the last one."""
    real = torch.ones_like(context_indices, dtype=torch.bool)
    real[:, 1:] = context_indices[:, 1:] != context_indices[:, :-1]
    return real


def fix_context_count(
    context_masks: torch.Tensor, count: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Boolean contexts ``[B, N]`` -> indices ``[B, count]``: a row with more context keeps a
    uniformly random ``count`` of it, a row with less keeps all and repeats its last index (so
    :func:`context_padding_mask` recovers the real entries). Real indices in increasing order."""
    batch_size, num_patches = context_masks.shape
    keys = torch.rand(batch_size, num_patches, generator=generator, dtype=torch.float64)
    keys.masked_fill_(~context_masks, 2.0)
    order = keys.argsort(dim=1)[:, :count]  # each row's context first (keys < 1), in random order
    kept = context_masks.sum(1).clamp(max=count)
    real = torch.arange(count)[None, :] < kept[:, None]
    indices = torch.where(real, order, num_patches).sort(dim=1).values  # real ones first, ascending
    last = indices.gather(1, (kept - 1).clamp_min(0)[:, None])
    return torch.where(real, indices, last)


def pad_blocks(target_indices: torch.Tensor, size: int) -> torch.Tensor:
    """Target blocks ``[B, M, Kt]`` -> ``[B, M, size]`` by repeating each block's last index
    (real indices increase within a block, so :func:`context_padding_mask` finds the padding)."""
    if target_indices.size(-1) > size:
        raise ValueError(f"a target block of {target_indices.size(-1)} patches exceeds the static size {size}.")
    last = target_indices[..., -1:].expand(*target_indices.shape[:-1], size - target_indices.size(-1))
    return torch.cat([target_indices, last], dim=-1)


def thin_to_smallest(context_masks: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Boolean contexts ``[B, N]`` -> indices ``[B, keep]`` in increasing order, ``keep`` the
    smallest context of the batch; each row drops a uniformly random subset of its extra patches
    (truncating a sorted list, as the official code does, would always drop the bottom rows)."""
    batch_size, num_patches = context_masks.shape
    keep = int(context_masks.sum(1).min())
    keys = torch.rand(batch_size, num_patches, generator=generator, dtype=torch.float64)
    keys.masked_fill_(~context_masks, 2.0)
    # The `keep` smallest keys of each row, in index order: a k-th value threshold and
    # nonzero() (row-major, hence sorted) instead of a full argsort + sort. float64 keys make
    # a tie at the threshold practically impossible; if one happens, sort instead.
    threshold = keys.kthvalue(keep, dim=1, keepdim=True).values
    chosen = keys <= threshold
    if int(chosen.sum()) == batch_size * keep:
        return chosen.nonzero()[:, 1].view(batch_size, keep)
    return keys.argsort(dim=1)[:, :keep].sort(dim=1).values


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
        self.target_scale = _check_range(target_scale, "target_scale", 0.0, 1.0)
        self.target_aspect_ratio = _check_range(target_aspect_ratio, "target_aspect_ratio", 0.0, math.inf)
        self.context_scale = _check_range(context_scale, "context_scale", 0.0, 1.0)
        self.context_aspect_ratio = _check_range(context_aspect_ratio, "context_aspect_ratio", 0.0, math.inf)
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


class SpatioTemporalMaskSampler(MultiBlockMaskSampler):
    """V-JEPA-style masks on a ``grid_time x grid_size x grid_size`` token grid (row-major
    ``i = (t * G + r) * G + c``): each target block is a spatial block (scale and aspect ratio as
    in :class:`MultiBlockMaskSampler`) extended through ``temporal_scale`` of the frames from a
    random start; the context is every token outside all target blocks, thinned to the batch's
    smallest, at least ``min_keep``. Disjoint from the targets over time as well as space.

    ``__call__(batch_size, generator)`` -> ``(context_indices [B, Kc], target_indices [B, M, Kt])``
    with ``Kt = t_len * h * w``; shapes are shared by the batch, positions differ per image.
    """

    def __init__(
        self,
        grid_time: int,
        grid_size: int,
        num_target_blocks: int = 8,
        target_scale: tuple[float, float] = (0.15, 0.15),
        target_aspect_ratio: tuple[float, float] = (0.75, 1.5),
        temporal_scale: tuple[float, float] = (1.0, 1.0),
        min_keep: int = 4,
        max_tries: int = 20,
        context_policy: str = "thin",
    ):
        if context_policy == "static":
            raise ValueError("context_policy 'static' is for image masks; clips take 'thin' or 'pad'.")
        super().__init__(
            grid_size,
            num_target_blocks,
            target_scale,
            target_aspect_ratio,
            (1.0, 1.0),
            min_keep=1,
            max_tries=max_tries,
            context_policy=context_policy,
        )
        if grid_time < 1:
            raise ValueError(f"grid_time must be >= 1 temporal position, got {grid_time}.")
        self.grid_time = grid_time
        self.temporal_scale = _check_range(temporal_scale, "temporal_scale", 0.0, 1.0)
        self.num_patches = grid_time * grid_size * grid_size
        if not 1 <= min_keep < self.num_patches:
            raise ValueError(
                f"min_keep must be in [1, {self.num_patches - 1}] on a {grid_time}x{grid_size}x{grid_size} "
                f"grid, got {min_keep}."
            )
        self.min_keep = min_keep

    def __call__(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        m, g, frames = self.num_target_blocks, self.grid_size, self.grid_time
        height, width = self.block_shape(self.target_scale, self.target_aspect_ratio, generator)
        u = float(torch.rand(1, generator=generator))
        scale = self.temporal_scale[0] + u * (self.temporal_scale[1] - self.temporal_scale[0])
        length = min(max(round(scale * frames), 1), frames)

        target_indices = torch.empty(batch_size, m, length * height * width, dtype=torch.long)
        context_masks = torch.empty(batch_size, self.num_patches, dtype=torch.bool)
        pending = torch.arange(batch_size)
        times = torch.arange(frames)
        for _ in range(self.max_tries):
            n = pending.numel()
            top, left = self.place_blocks(n * m, height, width, generator)
            start = torch.randint(0, frames - length + 1, (n * m,), generator=generator)
            spatial = self.block_indices(top, left, height, width)  # [n*m, h*w], row-major in the plane
            frame = start[:, None] + torch.arange(length)  # [n*m, length]
            blocks = (frame[:, :, None] * g * g + spatial[:, None, :]).flatten(1)  # [n*m, length*h*w]
            in_time = (times >= start[:, None]) & (times < start[:, None] + length)  # [n*m, T]
            in_plane = self._block_masks(top, left, height, width)  # [n*m, G*G]
            covered = (in_time[:, :, None] & in_plane[:, None, :]).flatten(1).view(n, m, -1).any(1)
            target_indices[pending] = blocks.view(n, m, -1)
            context_masks[pending] = ~covered
            pending = pending[context_masks[pending].sum(1) < self.min_keep]
            if pending.numel() == 0:
                break
        else:
            raise ValueError(
                f"could not leave min_keep={self.min_keep} context tokens on a {frames}x{g}x{g} grid outside {m} "
                f"target blocks of {length}x{height}x{width} in {self.max_tries} tries: lower num_target_blocks, "
                f"target_scale, temporal_scale or min_keep."
            )
        return self.batch_contexts(context_masks, generator), target_indices
