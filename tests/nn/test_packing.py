"""NaViT packing: several images of their own sizes in one sequence, attention kept per image."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ijepa.nn.packing import (
    PACKABLE_POSITIONS,
    Packed,
    canvas_positions,
    drop_tokens,
    instance_norm_per_image,
    pack,
    pack_greedy,
    patchify,
    pooled_per_image,
)
from ijepa.nn.position import position_names
from ijepa.nn.predictor import Predictor
from ijepa.nn.vit import VisionTransformer
from ijepa.step import normalize_targets


def unpack(values: torch.Tensor, image_ids: torch.Tensor, num_images: int) -> list[torch.Tensor]:
    """Per-slot ``values [S, L, ...]`` back to one ``[n_i, ...]`` tensor per image."""
    flat_ids, flat = image_ids.flatten(), values.flatten(0, 1)
    return [flat[flat_ids == i] for i in range(num_images)]


SIZES = [(48, 48), (16, 40), (32, 24), (8, 16), (24, 48), (40, 8)]  # pixels, patch 8, canvas 6x6


def images(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=generator) for h, w in SIZES]


def packed_images(budget: int = 40) -> tuple[Packed, list[torch.Tensor], list[torch.Tensor]]:
    pictures = images()
    patches = [patchify(image, 8) for image in pictures]
    positions = [canvas_positions((h // 8, w // 8), (6, 6)) for h, w in SIZES]
    return pack(patches, positions, pack_greedy([p.size(0) for p in patches], budget)), pictures, positions


def encoder(pos_embed: str) -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer.for_images(
        image_size=48, patch_size=8, embed_dim=32, depth=2, num_heads=2, pos_embed=pos_embed
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("pos_embed", PACKABLE_POSITIONS)
def test_packed_output_equals_each_image_run_alone(pos_embed):
    model = encoder(pos_embed)
    packed, pictures, positions = packed_images()
    assert packed.values.size(0) < len(pictures)  # several images share a sequence
    with torch.no_grad():
        out = model.forward_packed(packed)
        per_image = unpack(out, packed.image_ids, len(pictures))
        for image, pos, got in zip(pictures, positions, per_image):
            tokens = model.patch_embed.proj(image[None]).flatten(2).transpose(1, 2)  # the convolution, unpacked
            alone = model.transformer(tokens, pos[None])[0]
            torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
        # a full-size image is the ordinary encoder's forward
        torch.testing.assert_close(per_image[0], model(pictures[0][None])[0], rtol=1e-5, atol=1e-5)
        pooled = pooled_per_image(out, packed.image_ids, len(pictures))
        torch.testing.assert_close(pooled, torch.stack([t.mean(0) for t in per_image]), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()  # padding rows included


def test_no_token_attends_across_images_and_padding_is_never_a_key():
    packed, _, _ = packed_images()
    mask = packed.attention_mask()[:, 0]  # [S, L, L]
    ids = packed.image_ids
    real_query = ids[:, :, None] >= 0
    assert not (mask & real_query & (ids[:, :, None] != ids[:, None, :])).any()
    assert not (mask & real_query & (ids[:, None, :] < 0)).any()
    assert mask.any(-1).all()  # every row has a key: no NaN from a fully masked row
    # and the outputs agree: changing another image's pixels leaves an image's features alone
    model = encoder("sincos")
    with torch.no_grad():
        before = model.forward_packed(packed)
        changed = packed.values.clone()
        changed[packed.image_ids != 0] += 1.0
        after = model.forward_packed(Packed(changed, packed.positions, packed.image_ids))
    own = packed.image_ids == 0
    torch.testing.assert_close(after[own], before[own])


@pytest.mark.parametrize("pos_embed", [n for n in position_names(2) if n not in PACKABLE_POSITIONS])
def test_position_types_that_need_a_whole_grid_are_refused(pos_embed):
    packed, _, _ = packed_images()
    with pytest.raises(ValueError, match=f"pos_embed '{pos_embed}' cannot act per image inside packed sequences"):
        encoder(pos_embed).forward_packed(packed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(50, 120))
def test_packing_respects_the_budget_and_loses_no_image(lengths, budget):
    bins = pack_greedy(lengths, budget)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= budget for b in bins)
    assert len(bins) <= max(1, 2 * sum(lengths) // budget + 1)  # first fit never leaves two bins half empty


def test_an_image_larger_than_the_budget_is_an_error():
    with pytest.raises(ValueError, match=r"longer than the token budget 10: \(index, length\) \[\(1, 11\)\]"):
        pack_greedy([3, 11], 10)


def test_packed_instance_norm_equals_each_images_own_instance_norm():
    """data2vec's target norm on packed tokens: each feature normalised over its own image's
    tokens, the same as ``normalize_targets(..., "instance")`` on the image alone; padding is 0."""
    packed, pictures, _ = packed_images(budget=40)
    values = torch.randn(*packed.image_ids.shape, 16, generator=torch.Generator().manual_seed(1)) * 3 + 2
    normed = instance_norm_per_image(values, packed.image_ids, len(pictures))
    assert normed.shape == values.shape
    assert torch.all(normed[~packed.real] == 0)
    for alone, mine in zip(
        unpack(values, packed.image_ids, len(pictures)), unpack(normed, packed.image_ids, len(pictures))
    ):
        torch.testing.assert_close(mine, normalize_targets(alone[None], "instance")[0], rtol=1e-4, atol=1e-4)


def test_token_drop_keeps_the_stated_share_without_repeats():
    kept = drop_tokens([36, 10, 1], 0.5, torch.Generator().manual_seed(0))
    assert [k.numel() for k in kept] == [18, 5, 1]
    assert all(torch.equal(k, k.unique()) for k in kept)
    with pytest.raises(ValueError, match=r"token drop rate must be in \[0, 1\)"):
        drop_tokens([4], 1.0)


def test_canvas_positions_place_an_image_at_the_top_left_and_refuse_what_does_not_fit():
    assert canvas_positions((2, 3), (4, 5)).tolist() == [0, 1, 2, 5, 6, 7]
    with pytest.raises(ValueError, match="3x7 patches does not fit the model's 4x5 grid"):
        canvas_positions((3, 7), (4, 5))


def test_the_packed_predictor_equals_the_one_pass_predictor_per_image():
    torch.manual_seed(0)
    predictor = Predictor(6, 32, 16, depth=2, num_heads=2, pos_embed="rope_mixed", mode="one_pass").eval()
    # two images: contexts of 5 and 3 tokens, 2 blocks of 2 and of 1 target
    contexts = [torch.randn(5, 32), torch.randn(3, 32)]
    context_pos = [torch.tensor([0, 1, 2, 6, 7]), torch.tensor([0, 6, 12])]
    target_pos = [torch.tensor([[13, 14], [20, 21]]), torch.tensor([[1], [7]])]
    context_packed = pack([c for c in contexts], context_pos, [[0, 1]])  # [1, 8, 32]
    sources, positions, groups = [], [], []
    offset = 0
    for c, pos, targets in zip(contexts, context_pos, target_pos):
        sources.append(torch.cat([torch.arange(offset, offset + c.size(0)), torch.full((targets.numel(),), -1)]))
        positions.append(torch.cat([pos, targets.flatten()]))
        groups.append(torch.cat([torch.zeros(c.size(0)), torch.arange(1, 3).repeat_interleave(targets.size(1))]).long())
        offset += c.size(0)
    layout = pack([s[:, None] for s in sources], positions, [[0, 1]], groups)
    source = layout.values[..., 0]
    context_slot = torch.where(layout.real & (source >= 0), source, -1)
    target_slot = torch.where(layout.real & (source < 0), 0, -1)
    with torch.no_grad():
        packed = predictor.forward_packed(context_packed.values, layout, context_slot, target_slot)
        alone = torch.cat(
            [
                predictor(c[None], pos[None], targets[None])[0].flatten(0, 1)
                for c, pos, targets in zip(contexts, context_pos, target_pos)
            ]
        )
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
