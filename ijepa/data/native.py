"""Native-resolution (NaViT) pretraining batches: each image on its own patch grid, its masks
sampled on that grid, the tokens of several images packed into sequences up to a token budget
(:mod:`ijepa.nn.packing`)."""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from ijepa.data.batch import PackedBatch
from ijepa.data.collate import split_seeds
from ijepa.masks import Masks, MaskSampler, MultiBlockMasks
from ijepa.nn.packing import Packed, canvas_positions, drop_tokens, pack, pack_greedy, patchify


class NativeSizeCrop:
    """A random resized crop to a size of its own per image: ``h x w`` patches with ``h`` and
    ``w`` drawn independently and uniformly from ``sides`` (inclusive, in patches), so sizes and
    aspect ratios mix within a batch. ``[C, H, W] -> [C, h p, w p]``; uses the global RNG, which
    :class:`~ijepa.data.sampling.SeededSamples` seeds per sample."""

    def __init__(self, patch_size: int, sides: tuple[int, int], scale: tuple[float, float] = (0.3, 1.0)):
        if not 2 <= sides[0] <= sides[1]:
            raise ValueError(f"native_sides must be (min, max) patches per side with 2 <= min <= max, got {sides}.")
        self.patch_size, self.sides, self.scale = patch_size, (int(sides[0]), int(sides[1])), tuple(scale)

    def __call__(self, image):
        h, w = torch.randint(self.sides[0], self.sides[1] + 1, (2,)).tolist()
        size = (h * self.patch_size, w * self.patch_size)
        return v2.RandomResizedCrop(size, scale=self.scale, antialias=True)(image)


class PackedMaskCollator:
    """DataLoader ``collate_fn`` for native-resolution batches of ``(image, label[, seed])``
    samples whose images differ in size (multiples of ``patch_size``).

    Per image: masks from the ``masks`` kind's :meth:`~ijepa.masks.Masks.native_sampler` on its
    own grid (every context kept whole: no thinning, no padding), then NaViT's ``token_drop`` on
    the context. With :class:`~ijepa.masks.MultiBlockMasks` (the default, or built from
    ``mask_options``) two settings follow the image: the context block's aspect ratio is the
    grid's own, and ``min_keep`` scales with the image's share of the full grid's patches (at
    least 1). The three token
    sets are packed separately into sequences of at most ``token_budget`` slots (first fit,
    longest first; an image larger than the budget is an error), returned as a
    :class:`~ijepa.data.batch.PackedBatch`:

    * ``full``: every patch of every image, for the target encoder;
    * ``context``: the context patches, for the context encoder;
    * ``pred``: per image its context slots (group 0) then each target block (groups 1..M),
      for the predictor. ``pred_context_slot`` points each group-0 slot at its context token
      (a flat index into ``[S_c * L_c]``), ``pred_target_slot`` each block slot at its target
      token (a flat index into ``[S_f * L_f]``); ``-1`` elsewhere.

    ``packing=False`` gives every image a sequence of its own, padded to the longest (the
    baseline packing is measured against, ``ijepa.benchmark.packing``).

    Each set is a :class:`~ijepa.nn.packing.Packed` with ``values`` (patch pixels ``[S, L, C p p]``;
    none for ``pred``), ``positions`` (canvas positions on ``canvas``, the model's grid) and
    ``image_ids`` (image index, ``-1`` padding); ``pred`` also has ``groups``. The batch also has
    ``labels [B]``.
    """

    def __init__(
        self,
        patch_size: int,
        canvas: tuple[int, int],
        token_budget: int,
        token_drop: float = 0.0,
        packing: bool = True,
        masks: Masks | None = None,
        **mask_options,
    ):
        if not 0.0 <= token_drop < 1.0:
            raise ValueError(f"token_drop must be in [0, 1), got {token_drop}.")
        self.patch_size, self.canvas, self.budget, self.token_drop = patch_size, tuple(canvas), token_budget, token_drop
        self.packing = packing
        if masks is not None and mask_options:
            raise ValueError("PackedMaskCollator takes masks or mask options (MultiBlockMasks'), not both.")
        self.masks = masks if masks is not None else MultiBlockMasks(**mask_options)
        self._samplers: dict[tuple[int, int], MaskSampler] = {}

    def bins(self, lengths: list[int], budget: int) -> list[list[int]]:
        """Images grouped into sequences: packed up to ``budget`` slots, or one per sequence."""
        if not self.packing:
            return [[i] for i in range(len(lengths))]
        return pack_greedy(lengths, budget)

    def sampler(self, grid: tuple[int, int]) -> MaskSampler:
        """The mask sampler of an image with a ``grid = (h, w)`` of patches."""
        if grid not in self._samplers:
            self._samplers[grid] = self.masks.native_sampler(grid, self.canvas)
        return self._samplers[grid]

    def check(self, sides: tuple[int, int]) -> None:
        """Fail fast (ValueError) if the masks cannot be drawn on some grid with both sides in
        ``sides`` (min, max)."""
        for h in range(sides[0], sides[1] + 1):
            for w in range(sides[0], sides[1] + 1):
                self.sampler((h, w)).check(tries=4, batch_size=32)

    def __call__(self, samples: list) -> PackedBatch:
        samples, generator = split_seeds(samples)
        labels = torch.as_tensor([int(sample[1]) for sample in samples])
        images = [sample[0] for sample in samples]
        patches, positions, grids = [], [], []
        for image in images:
            grid = (image.size(-2) // self.patch_size, image.size(-1) // self.patch_size)
            patches.append(patchify(image, self.patch_size))
            positions.append(canvas_positions(grid, self.canvas))
            grids.append(grid)
        contexts, targets = [], []
        for grid in grids:
            context, target = self.sampler(grid)(1, generator)  # [1, Kc], [1, M, Kt]
            contexts.append(context[0])
            targets.append(target[0])
        if self.token_drop > 0:
            kept = drop_tokens([c.numel() for c in contexts], self.token_drop, generator)
            contexts = [c[k] for c, k in zip(contexts, kept)]
        full = pack(patches, positions, self.bins([p.size(0) for p in patches], self.budget))
        context_items = [p[c] for p, c in zip(patches, contexts)]
        context_positions = [pos[c] for pos, c in zip(positions, contexts)]
        context = pack(context_items, context_positions, self.bins([c.numel() for c in contexts], self.budget))
        pred, context_slot, target_slot = self._prediction_layout(full, context, contexts, targets, positions)
        return PackedBatch(labels, full, context, pred, context_slot, target_slot)

    def _prediction_layout(
        self, full, context, contexts, targets, positions
    ) -> tuple[Packed, torch.Tensor, torch.Tensor]:
        # where each image's tokens sit in the packed full and context sets (flat slot indices)
        full_slots = _slots_per_image(full.image_ids, len(contexts))
        context_slots = _slots_per_image(context.image_ids, len(contexts))
        sources, pred_positions, groups = [], [], []
        for i, (context_i, target_i) in enumerate(zip(contexts, targets)):
            blocks, size = target_i.shape
            # source: >= 0 a context slot, < -1 encodes -(2 + full slot) of a target token
            target_full_slot = full_slots[i][target_i.flatten()]
            sources.append(torch.cat([context_slots[i], -2 - target_full_slot]))
            pred_positions.append(torch.cat([positions[i][context_i], positions[i][target_i.flatten()]]))
            block_groups = torch.arange(1, blocks + 1).repeat_interleave(size)
            groups.append(torch.cat([torch.zeros(context_i.numel(), dtype=torch.long), block_groups]))
        # an image's context plus its M blocks may outgrow the budget (blocks overlap): such an
        # image gets a sequence of its own
        lengths = [s.numel() for s in sources]
        bins = self.bins(lengths, max(self.budget, max(lengths)))
        packed = pack([s[:, None] for s in sources], pred_positions, bins, groups)
        source = packed.values[..., 0]
        real = packed.image_ids >= 0
        layout = Packed(None, packed.positions, packed.image_ids, packed.groups)
        context_slot = torch.where(real & (source >= 0), source, -1)
        target_slot = torch.where(real & (source < -1), -2 - source, -1)
        return layout, context_slot, target_slot


def _slots_per_image(image_ids: torch.Tensor, num_images: int) -> list[torch.Tensor]:
    """For each image, the flat slot indices of its tokens in packing order."""
    flat = image_ids.flatten()
    return [torch.nonzero(flat == i)[:, 0] for i in range(num_images)]
