"""V-JEPA's spatio-temporal multi-block sampler (:class:`SpatioTemporalMaskSampler`) and its
mask kind (:class:`SpatioTemporalMasks`, for clips)."""

from __future__ import annotations

import math

import torch

from ijepa.masks.base import Masks
from ijepa.masks.multiblock import MultiBlockMaskSampler
from ijepa.masks.policies import CONTEXT_POLICIES, check_interval


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
        self.temporal_scale = check_interval(temporal_scale, "temporal_scale", 0.0, 1.0)
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


class SpatioTemporalMasks(Masks):
    """V-JEPA's spatio-temporal multi-block masks (:class:`SpatioTemporalMaskSampler`) on a clip's
    ``(time, height, width)`` token grid: ``num_target_blocks`` spatial blocks of ``target_scale``
    and ``target_aspect_ratio``, each a tube through ``temporal_scale`` of the frames; the context
    is every token outside them, at least ``min_keep``. ``context_policy``: ``thin`` or ``pad``."""

    clips = True

    def __init__(
        self,
        num_target_blocks: int = 4,
        target_scale: tuple[float, float] = (0.15, 0.2),
        target_aspect_ratio: tuple[float, float] = (0.75, 1.5),
        temporal_scale: tuple[float, float] = (1.0, 1.0),
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
        if context_policy == "static":
            raise ValueError("context_policy 'static' is for image masks; clips take 'thin' or 'pad'.")
        self.num_target_blocks = num_target_blocks
        self.target_scale = check_interval(target_scale, "target_scale", 0.0, 1.0)
        self.target_aspect_ratio = check_interval(target_aspect_ratio, "target_aspect_ratio", 0.0, math.inf)
        self.temporal_scale = check_interval(temporal_scale, "temporal_scale", 0.0, 1.0)
        self.min_keep = min_keep
        self.context_policy = context_policy

    def sampler(self, grid, context_policy: str | None = None) -> SpatioTemporalMaskSampler:
        if isinstance(grid, int) or len(grid) != 3 or grid[1] != grid[2]:
            raise ValueError(f"SpatioTemporalMasks samples a clip's (time, side, side) token grid, got {grid}.")
        return SpatioTemporalMaskSampler(
            grid[0],
            grid[1],
            self.num_target_blocks,
            self.target_scale,
            self.target_aspect_ratio,
            self.temporal_scale,
            min_keep=self.min_keep,
            context_policy=context_policy or self.context_policy,
        )
