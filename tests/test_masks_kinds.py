"""Mask kinds (``data.masks``): every registered member builds a sampler for a grid that yields
valid masks; the MAE-style random kind's math; the DataModule builds its samplers from the kind."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_datamodule

from ijepa.data import IJEPADataModule
from ijepa.data.sources import MovingShapesSource
from ijepa.masks import (
    Masks,
    MultiBlockMasks,
    RandomMasks,
    SpatioTemporalMasks,
    mask_kinds,
    masks_from_config,
)

KINDS = mask_kinds()


def grid_of(kind: type[Masks]) -> tuple[int, ...]:
    return (2, 6, 6) if kind.clips else (6, 6)


def test_the_registry_finds_every_kind_from_its_classes():
    assert {MultiBlockMasks, SpatioTemporalMasks, RandomMasks} <= set(KINDS)
    assert all(issubclass(kind, Masks) for kind in KINDS)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
def test_every_kind_builds_a_sampler_with_disjoint_in_range_masks_respecting_min_keep(kind):
    masks = kind(min_keep=6)
    sampler = masks.sampler(grid_of(kind))
    sampler.check()
    num_patches = torch.tensor(grid_of(kind)).prod().item()
    assert sampler.num_patches == num_patches
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        context, targets = sampler(16, generator)
        assert context.dim() == 2 and targets.dim() == 3 and context.size(0) == targets.size(0) == 16
        assert context.min() >= 0 and context.max() < num_patches
        assert targets.min() >= 0 and targets.max() < num_patches
        for row, blocks in zip(context, targets):
            real = set(row.tolist())  # padding repeats an index: the set holds the real ones
            assert len(real) >= 6, "min_keep"
            assert not real & set(blocks.flatten().tolist()), "context and targets overlap"
    # plain values rebuild the same kind (a checkpoint stores them)
    assert masks_from_config(masks.config()).config() == masks.config()


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
def test_every_kind_drives_the_data_module(kind):
    clips = dict(num_frames=4, image_size=16, patch_size=4, batch_size=4) if kind.clips else {}
    if kind.clips:
        clips["source"] = MovingShapesSource(train_size=8, val_size=8)
    data = tiny_datamodule(masks=kind(min_keep=2), **clips)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch.context_indices.size(0) == batch.images.size(0)
    assert data.hparams.masks["class_path"].endswith(kind.__name__)


def test_random_masks_mask_the_ratio_disjointly_covering_the_grid():
    sampler = RandomMasks(mask_ratio=0.75, min_keep=4).sampler(8)
    context, targets = sampler(32, torch.Generator().manual_seed(0))
    assert targets.shape == (32, 1, 48) and context.shape == (32, 16)  # round(0.75 * 64) = 48 targets
    together = torch.cat([context, targets[:, 0]], dim=1).sort(dim=1).values
    assert torch.equal(together, torch.arange(64).expand(32, -1))  # disjoint and covering every patch
    assert (context.diff(dim=1) > 0).all() and (targets.diff(dim=-1) > 0).all()  # sorted, distinct
    # every patch is a target about mask_ratio of the time (uniform draws)
    _, many = sampler(4000, torch.Generator().manual_seed(1))
    share = torch.zeros(64).index_add_(0, many.flatten(), torch.ones(many.numel())) / 4000
    assert (share - 0.75).abs().max() < 0.05
    # rectangular and clip grids count their patches
    assert RandomMasks(0.5).sampler((3, 5))(2)[1].shape == (2, 1, 8)
    assert RandomMasks(0.5).sampler((2, 4, 4))(2)[0].shape == (2, 16)


def test_random_masks_are_a_function_of_the_seed():
    sampler = RandomMasks(mask_ratio=0.6).sampler(6)
    first, again, other = (sampler(8, torch.Generator().manual_seed(s)) for s in (5, 5, 6))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_random_masks_refuse_a_ratio_that_leaves_too_little():
    with pytest.raises(ValueError, match="mask_ratio must be in"):
        RandomMasks(mask_ratio=0.0)
    with pytest.raises(ValueError, match="min_keep=4"):
        RandomMasks(mask_ratio=0.9, min_keep=4).sampler(4)  # 14 of 16 masked leaves 2
    with pytest.raises(ValueError, match="at least 1 target"):
        RandomMasks(mask_ratio=0.01, min_keep=1).sampler(4)


def test_the_default_masks_are_todays_sampler_bit_for_bit():
    # data.masks null: MultiBlockMasks() for images, SpatioTemporalMasks() for clips
    default, explicit = IJEPADataModule(num_workers=0), IJEPADataModule(num_workers=0, masks=MultiBlockMasks())
    assert default.hparams.masks == explicit.hparams.masks
    drawn = [dm.mask_sampler(8, torch.Generator().manual_seed(0)) for dm in (default, explicit)]
    assert all(torch.equal(a, b) for a, b in zip(*drawn))
    assert isinstance(IJEPADataModule(source=MovingShapesSource(), num_frames=4).masks, SpatioTemporalMasks)


def test_a_kind_for_the_wrong_data_or_a_bad_option_is_refused_naming_it():
    with pytest.raises(ValueError, match="for clips, but num_frames=0"):
        IJEPADataModule(masks=SpatioTemporalMasks())
    with pytest.raises(ValueError, match="masks_per_image"):
        MultiBlockMasks(masks_per_image=0)
    with pytest.raises(TypeError, match="data.masks must be a mask kind"):
        IJEPADataModule(masks="multiblock")
