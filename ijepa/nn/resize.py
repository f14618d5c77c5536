"""Resolution change: resize position tables and patch kernels to a new patch grid.

Functional helpers, used by :meth:`ijepa.nn.PositionEncoding.resize_state` (each encoding knows
which of its tensors depend on the grid) and by :func:`ijepa.checkpoint.resize_state_dict`, which
adapts a whole model's state dict saved at one image/patch size to a model built at another.

* Learned tables ``[N, D]`` are treated as a ``D``-channel image of the grid and resampled
  bicubically to the target *size* (ViT / DeiT), never by a scale factor that rounds.
* Patch-embedding kernels are resized with FlexiViT's pseudo-inverse, so that a patch resized
  with the same operation gives the same token (exact when the patch grows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

INTERPOLATION_MODES = ("bicubic", "bilinear", "nearest")

Grid = tuple[int, ...]  # (H, W), or (T, H, W) for clips


def check_grid(grid, name: str, dims: tuple[int, ...] = (2,)) -> Grid:
    if len(grid) not in dims or any(int(g) != g or g <= 0 for g in grid):
        what = "two positive integers (grid_height, grid_width)"
        if 3 in dims:
            what += " or, for clips, three (grid_time, grid_height, grid_width)"
        raise ValueError(f"{name} must be {what}, got {grid}.")
    return tuple(int(g) for g in grid)


def _check_mode(mode: str) -> None:
    if mode not in INTERPOLATION_MODES:
        raise ValueError(f"mode must be one of {INTERPOLATION_MODES}, got {mode!r}.")


def resample_grid(values: torch.Tensor, new_size: Grid, mode: str = "bicubic", antialias: bool = False) -> torch.Tensor:
    """Resample a channels-first grid ``[C, H, W] -> [C, H', W']`` to an exact ``new_size``.

    Computed in float32 and returned in the input dtype. ``antialias`` only acts when a side
    shrinks (and only for ``bilinear``/``bicubic``); an unchanged size returns the input exactly.
    """
    _check_mode(mode)
    new_size = check_grid(new_size, "new_size")
    if tuple(values.shape[-2:]) == new_size:
        return values
    shrinking = new_size[0] < values.size(-2) or new_size[1] < values.size(-1)
    kwargs = {} if mode == "nearest" else {"align_corners": False, "antialias": antialias and shrinking}
    out = F.interpolate(values.float().unsqueeze(0), size=new_size, mode=mode, **kwargs)
    return out.squeeze(0).to(values.dtype)


def interpolate_position_embedding(
    pos_embedding: torch.Tensor,
    old_grid_size: Grid,
    new_grid_size: Grid,
    num_prefix_tokens: int = 0,
    mode: str = "bicubic",
    antialias: bool = False,
) -> torch.Tensor:
    """Resize a learned position table from one patch grid to another.

    Args:
        pos_embedding: ``[N_old, D]`` or ``[1, N_old, D]``, row-major over the grid, optionally
            preceded by ``num_prefix_tokens`` rows for class/register tokens.
        old_grid_size: ``(grid_height, grid_width)`` the table was trained on.
        new_grid_size: ``(grid_height, grid_width)`` to resize to (rectangular grids allowed).
        num_prefix_tokens: leading rows that belong to no grid cell; copied unchanged.
        mode: ``bicubic`` (ViT / DeiT, default), ``bilinear`` or ``nearest``.
        antialias: low-pass filter when a side shrinks (off by default, as in ViT).

    Returns:
        ``[num_prefix_tokens + N_new, D]`` (or ``[1, ..., D]`` for a 3-D input); the input
        itself when the grid does not change.
    """
    old_h, old_w = check_grid(old_grid_size, "old_grid_size")
    new_h, new_w = check_grid(new_grid_size, "new_grid_size")
    batched = pos_embedding.dim() == 3
    if batched and pos_embedding.size(0) != 1 or pos_embedding.dim() not in (2, 3):
        raise ValueError(f"pos_embedding must be [N, D] or [1, N, D], got {tuple(pos_embedding.shape)}.")
    table = pos_embedding[0] if batched else pos_embedding
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}.")
    if table.size(0) != num_prefix_tokens + old_h * old_w:
        raise ValueError(
            f"pos_embedding has {table.size(0)} rows; old_grid_size={old_grid_size} with "
            f"num_prefix_tokens={num_prefix_tokens} needs {num_prefix_tokens + old_h * old_w}."
        )
    if (old_h, old_w) == (new_h, new_w):
        return pos_embedding
    prefix, grid = table[:num_prefix_tokens], table[num_prefix_tokens:]
    grid = grid.reshape(old_h, old_w, -1).permute(2, 0, 1)  # [D, H, W]
    grid = resample_grid(grid, (new_h, new_w), mode, antialias)
    out = torch.cat([prefix, grid.permute(1, 2, 0).reshape(new_h * new_w, -1)], dim=0)
    return out.unsqueeze(0) if batched else out


def interpolate_3d_table(
    table: torch.Tensor, old_grid: tuple[int, int, int], new_grid: tuple[int, int, int], mode: str = "bicubic"
) -> torch.Tensor:
    """A row-major ``[T H W, D]`` table resampled to ``[T' H' W', D]``: trilinear for
    ``bicubic``/``bilinear`` (PyTorch has no tricubic), ``nearest`` for ``nearest``. An unchanged
    grid returns the input exactly."""
    _check_mode(mode)
    old_grid, new_grid = check_grid(old_grid, "old_grid", (3,)), check_grid(new_grid, "new_grid", (3,))
    if table.size(0) != old_grid[0] * old_grid[1] * old_grid[2]:
        raise ValueError(
            f"table has {table.size(0)} rows, but old_grid {old_grid} has {old_grid[0] * old_grid[1] * old_grid[2]}."
        )
    if old_grid == new_grid:
        return table
    grid = table.float().T.reshape(1, table.size(1), *old_grid)
    kwargs = {"mode": "nearest"} if mode == "nearest" else {"mode": "trilinear", "align_corners": False}
    out = F.interpolate(grid, size=new_grid, **kwargs)
    return out.reshape(table.size(1), -1).T.contiguous().to(table.dtype)


def interpolate_axis_table(
    table: torch.Tensor, new_length: int, mode: str = "bicubic", antialias: bool = False
) -> torch.Tensor:
    """Resize a per-axis table ``[L, D] -> [new_length, D]`` (one axis of ``learned_2d``)."""
    if table.dim() != 2:
        raise ValueError(f"table must be [L, D], got {tuple(table.shape)}.")
    grid = table.T.unsqueeze(-1)  # [D, L, 1]: a one-column image, so only the length resamples
    return resample_grid(grid, (new_length, 1), mode, antialias).squeeze(-1).T


def interpolate_relative_bias_table(
    table: torch.Tensor, old_grid_size: Grid, new_grid_size: Grid, mode: str = "bicubic", antialias: bool = False
) -> torch.Tensor:
    """Resize a Swin relative-bias table ``[(2H-1)(2W-1), heads]`` to the offsets of a new grid.

    The table is an image over offsets ``(dr, dc)`` with ``dr in [-(H-1), H-1]``, so it is
    resampled to ``(2H'-1) x (2W'-1)`` per head (Swin V1's fine-tuning recipe).
    """
    old_h, old_w = check_grid(old_grid_size, "old_grid_size")
    new_h, new_w = check_grid(new_grid_size, "new_grid_size")
    rows, cols = 2 * old_h - 1, 2 * old_w - 1
    if table.dim() != 2 or table.size(0) != rows * cols:
        raise ValueError(f"table must be [{rows * cols}, heads] for a {old_h}x{old_w} grid, got {tuple(table.shape)}.")
    offsets = table.T.reshape(-1, rows, cols)  # [heads, 2H-1, 2W-1]
    offsets = resample_grid(offsets, (2 * new_h - 1, 2 * new_w - 1), mode, antialias)
    return offsets.flatten(1).T.contiguous()


def resize_patch(patches: torch.Tensor, new_patch_size: int) -> torch.Tensor:
    """The resize FlexiViT's kernel resize inverts: bilinear, no antialias, ``[..., p, p] -> [..., p', p']``."""
    shape = patches.shape
    flat = patches.reshape(-1, 1, shape[-2], shape[-1]).float()
    out = F.interpolate(
        flat, size=(new_patch_size, new_patch_size), mode="bilinear", align_corners=False, antialias=False
    )
    return out.reshape(*shape[:-2], new_patch_size, new_patch_size).to(patches.dtype)


@functools.lru_cache(maxsize=64)
def pseudo_inverse_resize(old_patch_size: int, new_patch_size: int) -> torch.Tensor:
    """``pinv(B^T)`` ``[p'^2, p^2]`` in float64 on the CPU, with ``B`` the linear map of
    :func:`resize_patch` from ``p x p`` to ``p' x p'`` (cached: FlexiViT training asks each step)."""
    basis = torch.eye(old_patch_size**2, dtype=torch.float64).reshape(-1, old_patch_size, old_patch_size)
    resize_t = resize_patch(basis, new_patch_size).reshape(old_patch_size**2, -1)  # B^T: [p^2, p'^2]
    return torch.linalg.pinv(resize_t)


def resize_patch_embed_kernel(weight: torch.Tensor, new_patch_size: int) -> torch.Tensor:
    """FlexiViT's pseudo-inverse resize of a patch-embedding kernel ``[D, C, p, p] -> [D, C, p', p']``.

    With ``B`` the linear map of :func:`resize_patch` (``p x p -> p' x p'``), the new kernel is
    ``w' = pinv(B^T) w``, so ``<B x, w'> = <x, w>``: a patch upsampled with ``resize_patch``
    gives exactly the old token. When the patch shrinks, ``B^T`` has no right inverse and ``w'``
    is the least-squares solution (the token then changes; ``docs/resolution.md`` gives the size).
    Differentiable in ``weight`` (FlexiViT training resizes the kernel in every step) and
    computed in float64, returned in ``weight``'s dtype.
    """
    if weight.dim() != 4 or weight.size(-1) != weight.size(-2):
        raise ValueError(f"weight must be [D, C, p, p], got {tuple(weight.shape)}.")
    if new_patch_size <= 0:
        raise ValueError(f"new_patch_size must be > 0, got {new_patch_size}.")
    old = weight.size(-1)
    if old == new_patch_size:
        return weight
    inverse = pseudo_inverse_resize(old, new_patch_size).to(weight.device)
    new = weight.double().reshape(-1, old * old) @ inverse.T
    return new.reshape(*weight.shape[:2], new_patch_size, new_patch_size).to(weight.dtype)


Resizer = Callable[[torch.Tensor], torch.Tensor]
