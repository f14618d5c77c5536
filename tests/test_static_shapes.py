"""Static shapes: every batch of a run has the same context and target token counts, so a compiled
step is captured once; the padding changes no loss."""

from dataclasses import replace

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler, context_padding_mask
from ijepa.module import IJEPA

GRID = 6  # the quickstart's grid
MODEL = {**TINY_MODEL, "image_size": 48}


def samplers(**options):
    return MultiBlockMaskSampler(GRID, context_policy="static", **options), MultiBlockMaskSampler(GRID, **options)


def test_every_static_batch_has_the_same_shapes_and_the_same_target_blocks_as_the_per_batch_draw():
    static, per_batch = samplers()
    shapes = set()
    for seed in range(30):
        context, targets = static(16, torch.Generator().manual_seed(seed))
        _, reference = per_batch(16, torch.Generator().manual_seed(seed))
        shapes.add((tuple(context.shape), tuple(targets.shape)))
        real = context_padding_mask(targets.flatten(0, 1)).view_as(targets)
        kt = reference.size(-1)
        assert bool(real[..., :kt].all()) and not bool(real[..., kt:].any())
        assert torch.equal(targets[..., :kt], reference)  # the same blocks, padded
        context_real = context_padding_mask(context)
        for b in range(16):
            kept = set(context[b][context_real[b]].tolist())
            assert not kept & set(targets[b].flatten().tolist())  # contexts stay disjoint from targets
    assert shapes == {((16, static.static_context), (16, 4, static.static_targets))}


def test_static_masks_keep_more_context_than_thinning_and_pad_few_images():
    static, thin = samplers()
    static_kept, thin_kept, padded, images = 0, 0, 0, 0
    for seed in range(100):
        context, _ = static(64, torch.Generator().manual_seed(seed))
        real = context_padding_mask(context)
        static_kept += int(real.sum())
        padded += int((~real.all(1)).sum())
        thin_kept += thin(64, torch.Generator().manual_seed(seed))[0].numel()
        images += 64
    # per image on average: the static count keeps at least thinning's context (stated bound)
    assert static_kept / images >= thin_kept / images
    # the count is the 5th percentile of the context sizes: few images are padded
    assert padded / images <= 0.10


@pytest.mark.parametrize("mode", ["per_block", "one_pass"])
def test_a_static_batch_gives_the_loss_of_its_unpadded_masks(mode):
    torch.manual_seed(0)
    model = IJEPA(**MODEL, predictor_mode=mode)
    static, _ = samplers()
    samples = [(torch.randn(3, 48, 48), 0, i) for i in range(6)]
    batch = MaskCollator(static)(samples)
    assert batch.target_mask is not None and not bool(batch.target_mask.all())  # some padding to ignore
    kt = int(batch.target_mask[0, 0].sum())
    unpadded = replace(batch, target_mask=None, target_indices=batch.target_indices[..., :kt])
    torch.testing.assert_close(model.jepa_loss(batch), model.jepa_loss(unpadded))


def test_static_is_for_images():
    from ijepa.masks import SpatioTemporalMaskSampler

    with pytest.raises(ValueError, match="'static' is for image masks"):
        SpatioTemporalMaskSampler(2, 4, context_policy="static")


def test_a_masked_prediction_loss_is_the_mean_over_real_slots_and_refuses_another_reduction():
    from ijepa.step import prediction_loss

    predictions, targets = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    mask = torch.tensor([[[True, True, False]], [[True, False, False]]])
    expected = torch.nn.functional.smooth_l1_loss(predictions[mask], targets[mask])
    torch.testing.assert_close(prediction_loss(predictions, targets, mask=mask), expected)
    with pytest.raises(ValueError, match="reduction must be 'mean', got 'none'"):
        prediction_loss(predictions, targets, reduction="none", mask=mask)
