"""Native-resolution (NaViT) pretraining: images of mixed sizes and aspect ratios, masks per
image on its own grid, tokens packed into sequences, the JEPA loss unchanged per image."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL

from ijepa.data import IJEPADataModule, ShapesSource
from ijepa.data.native import NativeSizeCrop, PackedMaskCollator
from ijepa.data.sampling import mix_seed
from ijepa.masks import MultiBlockMasks
from ijepa.module import IJEPA
from ijepa.nn.packing import PACKABLE_POSITIONS, canvas_positions, pack_images, patchify, pooled_per_image

MODEL = {
    **TINY_MODEL,
    "image_size": 48,
    "predictor_mode": "one_pass",  # the packed predictor's attention: blocks see the context, the context itself
}
MASKS = dict(num_target_blocks=3, target_scale=(0.15, 0.2), min_keep=2)


def native_batch(token_drop: float = 0.0, count: int = 7, seed: int = 0):
    torch.manual_seed(seed)
    crop = NativeSizeCrop(8, (3, 6))
    samples = [(crop(torch.randn(3, 48, 48)), i % 3, 1000 * seed + i) for i in range(count)]
    return samples, PackedMaskCollator(8, (6, 6), 72, token_drop, **MASKS)(samples)


def per_image_loss(model: IJEPA, samples, collate: PackedMaskCollator) -> tuple[torch.Tensor, int]:
    """The JEPA loss summed over every target token, each image run alone through the ordinary
    (unpacked) encoder, predictor and loss, with the masks the collator drew."""
    generator = torch.Generator().manual_seed(mix_seed(*(s[-1] for s in samples)))
    total, count = 0.0, 0
    for image, _, _ in samples:
        grid = (image.size(-2) // 8, image.size(-1) // 8)
        context, targets = collate.sampler(grid)(1, generator)
        positions = canvas_positions(grid, (6, 6))
        tokens = model.encoder.patch_embed.proj(image[None]).flatten(2).transpose(1, 2)  # [1, n, D]
        with torch.no_grad():
            full = model.target_encoder.transformer(tokens, positions[None])
            normed = F.layer_norm(full, full.shape[-1:])[0]
        encoded = model.encoder.transformer(tokens[:, context[0]], positions[context[0]][None])
        prediction = model.predictor(encoded, positions[context], positions[targets[0]][None])  # [1, M, Kt, D]
        target = normed[targets[0]]
        total = total + F.smooth_l1_loss(prediction[0], target, reduction="sum")
        count += target.numel()
    return total, count


@pytest.mark.parametrize("pos_embed", PACKABLE_POSITIONS)
def test_the_packed_jepa_loss_equals_each_image_run_alone(pos_embed):
    torch.manual_seed(0)
    model = IJEPA(**MODEL, pos_embed=pos_embed, predictor_pos_embed=pos_embed)
    samples, batch = native_batch()
    assert batch.full.values.size(0) < len(samples)  # images share sequences
    loss, pooled = model.jepa_step(batch)
    total, count = per_image_loss(model, samples, PackedMaskCollator(8, (6, 6), 72, **MASKS))
    torch.testing.assert_close(loss, total / count, rtol=1e-5, atol=1e-6)
    assert pooled.shape == (len(samples), 32)


def test_every_image_is_packed_whole_within_the_budget_and_masked_on_its_own_grid():
    samples, batch = native_batch(token_drop=0.25)
    sizes = [(s[0].size(-2) // 8) * (s[0].size(-1) // 8) for s in samples]
    assert len({s[0].shape for s in samples}) > 2  # mixed sizes and aspect ratios
    full_ids, context_ids = batch.full.image_ids, batch.context.image_ids
    for i, n in enumerate(sizes):
        assert int((full_ids == i).sum()) == n  # every patch of every image, once
        # NaViT's token drop on the context: a quarter of each context gone, never below one token
        assert 1 <= int((context_ids == i).sum()) < n
    assert full_ids.size(1) <= 72 and context_ids.size(1) <= 72
    # context and target tokens of an image are disjoint positions on its own grid
    for i in range(len(samples)):
        context = set(batch.context.positions[context_ids == i].tolist())
        targets = batch.pred.positions[(batch.pred.image_ids == i) & (batch.pred_target_slot >= 0)]
        grid = (samples[i][0].size(-2) // 8, samples[i][0].size(-1) // 8)
        allowed = set(canvas_positions(grid, (6, 6)).tolist())
        assert context <= allowed and set(targets.tolist()) <= allowed
        assert not context & set(targets.tolist())
    # the target slots point at the target encoder's tokens at the same positions
    slots = batch.pred_target_slot[batch.pred_target_slot >= 0]
    pos = batch.pred.positions[batch.pred_target_slot >= 0]
    assert torch.equal(batch.full.positions.flatten()[slots], pos)
    assert patchify(samples[0][0], 8).shape[1] == 3 * 64


def test_native_settings_are_checked_when_the_data_is_built():
    source = ShapesSource()
    with pytest.raises(ValueError, match=r"native_sides must be \(min, max\) .* <= 6"):
        IJEPADataModule(source, image_size=48, patch_size=8, native_sides=(3, 7))
    with pytest.raises(ValueError, match="token_budget must hold one full-size image's 36 tokens"):
        IJEPADataModule(source, image_size=48, patch_size=8, native_sides=(3, 6), token_budget=30)
    with pytest.raises(ValueError, match="set native_sides too"):
        IJEPADataModule(source, image_size=48, patch_size=8, token_drop=0.5)
    with pytest.raises(ValueError, match="not with num_frames, train_patch_sizes or masks_per_image"):
        IJEPADataModule(
            source, image_size=48, patch_size=8, native_sides=(3, 6), masks=MultiBlockMasks(masks_per_image=2)
        )


def test_a_position_type_that_needs_a_whole_grid_is_refused_at_the_first_packed_step():
    model = IJEPA(**MODEL, pos_embed="peg", predictor_pos_embed="sincos")
    with pytest.raises(ValueError, match="pos_embed 'peg' cannot act per image inside packed sequences"):
        model.jepa_step(native_batch()[1])


def test_packed_features_pool_each_image_at_its_own_size():
    torch.manual_seed(0)
    model = IJEPA(**MODEL, pos_embed="rope_mixed", predictor_pos_embed="sincos").eval()
    full = torch.randn(2, 3, 48, 48)
    small = [torch.randn(3, 24, 40), torch.randn(3, 16, 16)]
    packed = pack_images([full[0], *small, full[1]], 8, (6, 6))  # what the packed collators build
    with torch.no_grad():
        pooled = pooled_per_image(model.target_encoder.forward_packed(packed), packed.image_ids, 4)
    assert pooled.shape == (4, 32)
    with torch.no_grad():
        torch.testing.assert_close(pooled[[0, 3]], model.features(full), rtol=1e-5, atol=1e-5)
        for image, got in zip(small, pooled[1:3]):
            grid = (image.size(-2) // 8, image.size(-1) // 8)
            tokens = model.target_encoder.patch_embed.proj(image[None]).flatten(2).transpose(1, 2)
            alone = model.target_encoder.transformer(tokens, canvas_positions(grid, (6, 6))[None])
            torch.testing.assert_close(got, alone[0].mean(0), rtol=1e-5, atol=1e-5)
