"""Masks: which patches of each image are context and which are targets, sampled per batch by
the collator (:mod:`ijepa.data.collate`). A mask kind (:class:`Masks`, chosen by ``data.masks``'s
``class_path``: :mod:`ijepa.masks.base`) builds a sampler for each grid the DataModule needs;
the kinds are the concrete :class:`Masks` subclasses of this package's files
(:func:`mask_kinds`): :class:`MultiBlockMasks`, :class:`SpatioTemporalMasks` (clips),
:class:`RandomMasks` (MAE-style).

I-JEPA's multi-block masks (:mod:`ijepa.masks.multiblock`):

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

from ijepa.masks.base import Masks, MaskSampler, mask_kinds, masks_from_config
from ijepa.masks.multiblock import MultiBlockMasks, MultiBlockMaskSampler
from ijepa.masks.policies import (
    CONTEXT_POLICIES,
    STATIC_CONTEXT_QUANTILE,
    context_padding_mask,
    fix_context_count,
    pad_blocks,
    pad_to_longest,
    thin_to_smallest,
)
from ijepa.masks.random_patches import RandomMasks, RandomMaskSampler
from ijepa.masks.spatiotemporal import SpatioTemporalMasks, SpatioTemporalMaskSampler

__all__ = [
    "CONTEXT_POLICIES",
    "STATIC_CONTEXT_QUANTILE",
    "MaskSampler",
    "Masks",
    "MultiBlockMaskSampler",
    "MultiBlockMasks",
    "RandomMaskSampler",
    "RandomMasks",
    "SpatioTemporalMaskSampler",
    "SpatioTemporalMasks",
    "context_padding_mask",
    "fix_context_count",
    "mask_kinds",
    "masks_from_config",
    "pad_blocks",
    "pad_to_longest",
    "thin_to_smallest",
]
