"""NaViT sequence packing: images of different sizes and aspect ratios, each on its own patch
grid, packed several to a sequence up to a token budget, attention kept inside each image.

A packed batch is ``S`` sequences of ``L`` slots. Every slot holds one patch of one image or is
padding; it carries the patch's pixels ``[C p p]``, its position on the model's *canvas* grid
``(G_h, G_w)`` (row-major ``r * G_w + c`` for the patch at row ``r``, column ``c`` of its own
image: every image's grid sits at the canvas's top-left corner, so an image of ``h x w`` patches
uses positions as a ``h x w`` model would) and the index of its image (``-1`` for padding). The
position encodings of the family see integer positions as always, so ``learned_2d``, ``sincos``,
``rope_axial`` and ``rope_mixed`` act per image on its own grid; members whose meaning depends on
a full grid (one table per flat index, a convolution over the grid, biases over grid offsets) are
refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ijepa.nn.position.registry import packable_positions

PACKABLE_POSITIONS = packable_positions()  # the members whose class says `packable = True`


def check_packable(name: str, what: str = "pos_embed") -> None:
    """ValueError unless position member ``name`` acts per image on its own grid."""
    if name not in PACKABLE_POSITIONS:
        raise ValueError(
            f"{what} {name!r} cannot act per image inside packed sequences (it depends on a whole grid or a flat "
            f"index); native-resolution packing supports {PACKABLE_POSITIONS}."
        )


def patchify(image: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[C, H, W]`` with ``H, W`` multiples of ``patch_size`` -> ``[h w, C p p]`` patches in
    row-major order, each flattened as a ``Conv2d`` kernel is (channel, row, column), so that
    ``patches @ kernel.flatten(1).T`` is the convolution's output."""
    if image.dim() != 3 or image.size(-1) % patch_size or image.size(-2) % patch_size:
        raise ValueError(f"image must be [C, H, W] with H and W multiples of {patch_size}, got {tuple(image.shape)}.")
    return F.unfold(image[None], patch_size, stride=patch_size)[0].T


def canvas_positions(grid: tuple[int, int], canvas: tuple[int, int]) -> torch.Tensor:
    """Row-major canvas positions ``[h w]`` of an image grid ``(h, w)`` placed at the canvas's
    top-left corner; ValueError if it does not fit."""
    (h, w), (canvas_h, canvas_w) = grid, canvas
    if not (1 <= h <= canvas_h and 1 <= w <= canvas_w):
        raise ValueError(f"an image grid of {h}x{w} patches does not fit the model's {canvas_h}x{canvas_w} grid.")
    rows = torch.arange(h).repeat_interleave(w)
    cols = torch.arange(w).repeat(h)
    return rows * canvas_w + cols


def pack_greedy(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of items grouped into bins of total length at most ``budget``: first fit, longest
    first (deterministic; every item in exactly one bin). ValueError if an item exceeds the budget."""
    if budget < 1:
        raise ValueError(f"the token budget must be >= 1, got {budget}.")
    too_long = [(i, n) for i, n in enumerate(lengths) if n > budget]
    if too_long:
        raise ValueError(f"items longer than the token budget {budget}: (index, length) {too_long[:5]}.")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return [sorted(b) for b in bins]


@dataclass
class Packed:
    """``S`` packed sequences of ``L`` slots.

    Attributes:
        values: ``[S, L, ...]`` per-slot values (patch pixels ``[C p p]``, or features ``D``), or
            None for a layout only (the predictor's, whose inputs the model assembles).
        positions: ``[S, L]`` canvas positions (0 in padding).
        image_ids: ``[S, L]`` image index of each slot, ``-1`` for padding.
        groups: ``[S, L]`` optional group within the image (``0``: sees its image's group 0;
            ``g > 0``: sees its image's group 0 and group ``g``), the predictor's blocks.
    """

    values: torch.Tensor | None
    positions: torch.Tensor
    image_ids: torch.Tensor
    groups: torch.Tensor | None = None

    @property
    def real(self) -> torch.Tensor:
        """``[S, L]`` True for slots that hold a token."""
        return self.image_ids >= 0

    def attention_mask(self) -> torch.Tensor:
        """Boolean ``[S, 1, L, L]``, True where query slot may attend to key slot: the same image
        (and, with ``groups``, the key's group 0 or the query's own group). A padding query may
        attend to every real key (its output is thrown away; a row with no key would be NaN)."""
        ids = self.image_ids
        same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0)
        if self.groups is not None:
            g = self.groups
            same = same & ((g[:, None, :] == 0) | (g[:, :, None] == g[:, None, :]))
        padding_query = (ids[:, :, None] < 0) & (ids[:, None, :] >= 0)
        allowed = same | padding_query
        empty = ~allowed.any(-1, keepdim=True)  # a sequence of padding only: let it see itself
        eye = torch.eye(ids.size(1), dtype=torch.bool, device=ids.device)[None]
        return (allowed | (empty & eye))[:, None]


def pack(
    items: list[torch.Tensor],
    positions: list[torch.Tensor],
    bins: list[list[int]],
    groups: list[torch.Tensor] | None = None,
) -> Packed:
    """Lay ``items`` (``[n_i, ...]``, one per image) with their canvas ``positions`` (``[n_i]``)
    and optional ``groups`` (``[n_i]``) into sequences, one per bin of image indices, padded to
    the longest."""
    length = max(sum(items[i].size(0) for i in b) for b in bins)
    first = items[0]
    values = first.new_zeros(len(bins), length, *first.shape[1:])
    pos = torch.zeros(len(bins), length, dtype=torch.long, device=first.device)
    ids = torch.full((len(bins), length), -1, dtype=torch.long, device=first.device)
    grp = None if groups is None else torch.zeros(len(bins), length, dtype=torch.long, device=first.device)
    for s, b in enumerate(bins):
        start = 0
        for i in b:
            n = items[i].size(0)
            values[s, start : start + n] = items[i]
            pos[s, start : start + n] = positions[i]
            ids[s, start : start + n] = i
            if grp is not None:
                grp[s, start : start + n] = groups[i]
            start += n
    return Packed(values, pos, ids, grp)


def pack_images(images: list[torch.Tensor], patch_size: int, canvas: tuple[int, int], budget: int | None = None):
    """Images ``[C, H_i, W_i]`` at their own sizes (sides multiples of ``patch_size``, at most the
    ``canvas`` grid's) as patches with their canvas positions, packed greedily several to a
    sequence of ``budget`` slots (default: one full canvas)."""
    patches = [patchify(image, patch_size) for image in images]
    positions = [canvas_positions((im.size(-2) // patch_size, im.size(-1) // patch_size), canvas) for im in images]
    return pack(patches, positions, pack_greedy([x.size(0) for x in patches], budget or canvas[0] * canvas[1]))


def pooled_per_image(values: torch.Tensor, image_ids: torch.Tensor, num_images: int) -> torch.Tensor:
    """Mean of each image's slots: ``[S, L, D]`` -> ``[num_images, D]`` (padding excluded)."""
    flat_ids, flat = image_ids.flatten(), values.flatten(0, 1).float()
    real = flat_ids >= 0
    sums = flat.new_zeros(num_images, flat.size(-1)).index_add_(0, flat_ids[real], flat[real])
    counts = torch.bincount(flat_ids[real], minlength=num_images).clamp_min(1)
    return (sums / counts[:, None]).to(values.dtype)


def instance_norm_per_image(
    values: torch.Tensor, image_ids: torch.Tensor, num_images: int, eps: float = 1e-5
) -> torch.Tensor:
    """Each feature normalised over its own image's slots, ``[S, L, D]`` -> ``[S, L, D]``
    (data2vec's instance norm of packed targets; padding slots come back as 0). An image split
    over several sequences is normalised as one image."""
    x = values.float()
    mean = pooled_per_image(x, image_ids, num_images)  # [n, D]
    var = (pooled_per_image(x.square(), image_ids, num_images) - mean.square()).clamp_min(0)
    index = image_ids.clamp_min(0)
    normed = (x - mean[index]) * torch.rsqrt(var[index] + eps)
    return torch.where((image_ids >= 0)[..., None], normed, 0.0).to(values.dtype)


def drop_tokens(
    lengths: list[int], rate: float, generator: torch.Generator | None = None, min_keep: int = 1
) -> list[torch.Tensor]:
    """NaViT's random token drop: for each image of ``lengths[i]`` tokens, the sorted indices of
    the tokens it keeps, ``max(min_keep, round((1 - rate) n))`` of them drawn without replacement."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"the token drop rate must be in [0, 1), got {rate}.")
    kept = []
    for n in lengths:
        keep = min(n, max(min_keep, round((1.0 - rate) * n)))
        kept.append(torch.randperm(n, generator=generator)[:keep].sort().values)
    return kept
