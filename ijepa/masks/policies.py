"""Context policies: how a batch holds contexts of different lengths (``thin``, ``pad``,
``static``), and the padding helpers the collator and the model share."""

from __future__ import annotations

import torch

CONTEXT_POLICIES = ("pad", "thin", "static")
STATIC_CONTEXT_QUANTILE = 0.05  # the static context count: this quantile of the per-image context sizes


def check_interval(value: tuple[float, float], name: str, low: float, high: float) -> tuple[float, float]:
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
