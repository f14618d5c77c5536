"""The functions behind the notebooks' pictures (ijepa.explore)."""

import pytest
import torch
from conftest import TINY_MODEL, save_tiny_checkpoint

from ijepa.explore import (
    bias_offset_map,
    encoder_report,
    load_model,
    mask_statistics,
    position_channel_map,
    position_similarity_map,
    rope_offset_scores,
)
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA
from ijepa.nn import VisionTransformer, build_position_encoding
from ijepa.pictures import patch_grid_image, to_png


def test_png_round_trip():
    import io

    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    image = torch.rand(3, 8, 12)
    decoded = pil_to_tensor(Image.open(io.BytesIO(to_png(image))))
    assert decoded.shape == (3, 8, 12)
    assert (decoded.float() / 255 - image).abs().max() <= 0.5 / 255 + 1e-6


def test_patch_grid_lines_and_row_major_labels():
    image = torch.zeros(3, 32, 48)  # 4 x 6 patches of 8
    plain = patch_grid_image(image, 8, scale=4, indices=False)
    assert plain.shape == (3, 128, 192)
    assert (plain[:, ::32, :] == 1).all() and (plain[:, :, ::32] == 1).all()
    assert (plain[:, 1:32, 1:32] == 0).all()  # inside a cell: the image
    labelled = patch_grid_image(image, 8, scale=4)
    for r in range(4):
        for c in range(6):  # every cell got its label drawn, nothing outside the cells changed
            cell = labelled[:, r * 32 + 1 : (r + 1) * 32, c * 32 + 1 : (c + 1) * 32]
            assert cell.sum() > 0

    # wider labels for two-digit indices: patch 23 (r=3, c=5) uses more ink than patch 1
    def ink(r, c):
        return labelled[:, r * 32 + 1 : (r + 1) * 32, c * 32 + 1 : (c + 1) * 32].sum()

    assert ink(3, 5) > ink(0, 1)
    with pytest.raises(ValueError, match="multiples of patch_size=8"):
        patch_grid_image(torch.zeros(3, 30, 32), 8)


def test_mask_statistics_are_consistent():
    sampler = MultiBlockMaskSampler(8, 4, (0.1, 0.15), min_keep=6)
    stats = mask_statistics(sampler, batch_size=16, num_batches=10)
    target, context = stats["target_frequency"], stats["context_frequency"]
    assert target.shape == context.shape == (8, 8)
    assert 0 <= target.min() and target.max() <= 1 and 0 <= context.min()
    assert (target + context <= 1 + 1e-6).all()  # context and targets of a sample are disjoint
    assert min(stats["context_lengths"]) >= 6 and len(stats["context_lengths"]) == 10
    assert abs(stats["mean_target_fraction"] - float(target.mean())) < 1e-6
    assert abs(stats["mean_context_fraction"] - float(context.mean())) < 1e-6
    assert target.sum() > 0


def test_table_maps():
    sincos = build_position_encoding("sincos", (6, 6), 32)
    table = sincos.table().detach()
    torch.testing.assert_close(position_channel_map(sincos, 3), table[:, 3].view(6, 6))
    similarity = position_similarity_map(sincos, 14)
    assert similarity.shape == (6, 6) and abs(similarity.view(-1)[14] - 1) < 1e-6
    # symmetric: sim(i, j) = sim(j, i)
    assert abs(similarity.view(-1)[20] - position_similarity_map(sincos, 20).view(-1)[14]) < 1e-6
    assert position_similarity_map(build_position_encoding("learned_2d", (4, 5), 16), 0).shape == (4, 5)
    with pytest.raises(ValueError, match="no additive table"):
        position_channel_map(build_position_encoding("rope_axial", (4, 4), 16, 2), 0)
    with pytest.raises(ValueError, match=r"channel must be in 0\.\.31"):
        position_channel_map(sincos, 32)


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed"])
def test_rope_scores_depend_only_on_the_offset(name):
    position = build_position_encoding(name, (5, 5), 32, 2)
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(16, generator=generator), torch.randn(16, generator=generator)
    scores = rope_offset_scores(position, query, key)
    assert scores.shape == (9, 9) and torch.isfinite(scores).all()
    assert abs(scores[4, 4] - query @ key) < 1e-4  # no offset: no net rotation
    # Relativity: with the key at (2, 2) instead of the far corner, the offsets it can reach agree.
    anchored = rope_offset_scores(position, query, key, anchor=(2, 2))
    reachable = torch.isfinite(anchored)
    assert reachable.sum() == 25
    torch.testing.assert_close(anchored[reachable], scores[reachable], atol=1e-4, rtol=1e-4)
    assert scores.std() > 0.01  # and the score does vary with the offset
    with pytest.raises(ValueError, match="not a rotary encoding"):
        rope_offset_scores(build_position_encoding("sincos", (4, 4), 16), query, key)


def test_encoder_report():
    encoder = VisionTransformer.for_images(32, 8, embed_dim=32, depth=2, num_heads=2, pos_embed="learned")
    images = torch.randn(3, 3, 32, 32)
    full = encoder_report(encoder, images)
    assert full["output_shape"] == (3, 16, 32) and full["indices_shape"] is None
    assert set(full["grad_norms"]) == {"patch_embed", "position", "block 0", "block 1", "norm"}
    assert all(value > 0 for value in full["grad_norms"].values())
    assert all(p.grad is None for p in encoder.parameters())  # nothing left behind
    part = encoder_report(encoder, images, torch.tensor([[0, 5, 9]] * 3))
    assert part["output_shape"] == (3, 3, 32) and part["indices_shape"] == (3, 3)


def test_bias_offset_map_and_checkpoint_loading(tmp_path):
    position = build_position_encoding("relative_bias", (3, 4), 16, 2)
    bias_map = bias_offset_map(position, head=1)
    torch.testing.assert_close(bias_map, position.table[:, 1].detach().view(5, 7))  # the table, as offsets
    assert bias_map.shape == (5, 7)
    # the map's entry at offset (dr, dc) is the bias between tokens that far apart
    bias = position.attention_positions(torch.tensor([[5, 0]])).bias  # token 5 = (1, 1), token 0 = (0, 0)
    assert bias[0, 1, 0, 1] == bias_map[2 + 1, 3 + 1]
    with pytest.raises(ValueError, match="SincosPosition puts no bias on the attention logits"):
        bias_offset_map(build_position_encoding("sincos", (3, 4), 16))

    model = IJEPA(**{**TINY_MODEL, "pos_embed": "learned"})
    path = save_tiny_checkpoint(model, tmp_path / "model.ckpt")
    loaded = load_model(str(path))
    torch.testing.assert_close(loaded.encoder.position.table(), model.encoder.position.table())
    bigger = load_model(str(path), image_size=48)  # 4x4 -> 6x6 grid, table interpolated
    assert bigger.encoder.position.table().shape == (36, 32)
