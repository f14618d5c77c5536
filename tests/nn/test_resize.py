"""Resolution change: table interpolation, FlexiViT kernel resize, checkpoint adaptation."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL

from ijepa.checkpoint import resize_state_dict
from ijepa.module import IJEPA
from ijepa.nn import (
    VisionTransformer,
    build_position_encoding,
    position_names,
    sinusoidal_2d_grid,
)
from ijepa.nn.resize import (
    interpolate_axis_table,
    interpolate_position_embedding,
    interpolate_relative_bias_table,
    resize_patch,
    resize_patch_embed_kernel,
)
from ijepa.optim import parameter_order


def smooth_table(height, width, dim=8):
    """A table whose channels are smooth functions of the (continuous) grid position."""
    r = (torch.arange(height) + 0.5) / height
    c = (torch.arange(width) + 0.5) / width
    rr, cc = torch.meshgrid(r, c, indexing="ij")
    channels = [torch.sin(torch.pi * (k + 1) * rr / 2) * torch.cos(torch.pi * cc / (k + 2)) for k in range(dim)]
    return torch.stack(channels, dim=-1).reshape(height * width, dim)


# --- interpolate_position_embedding --------------------------------------------------------------
def test_interpolation_to_the_same_grid_is_the_identity():
    table = torch.randn(24, 16)
    torch.testing.assert_close(interpolate_position_embedding(table, (4, 6), (4, 6)), table, atol=1e-6, rtol=0)
    batched = table[None]
    assert interpolate_position_embedding(batched, (4, 6), (4, 6)).shape == (1, 24, 16)


def test_interpolation_follows_the_row_major_grid_on_rectangular_grids():
    # a table that is linear in the column only: resizing the width keeps it a function of the column
    old_h, old_w, new_h, new_w = 3, 5, 6, 4
    col = torch.arange(old_w).float().repeat(old_h)
    table = torch.stack([col, -col], dim=1)
    out = interpolate_position_embedding(table, (old_h, old_w), (new_h, new_w), mode="bilinear")
    assert out.shape == (new_h * new_w, 2)
    grid = out[:, 0].view(new_h, new_w)
    torch.testing.assert_close(grid, grid[:1].expand(new_h, -1))  # rows are equal
    assert (grid[0, 1:] > grid[0, :-1]).all()  # increasing along columns


def test_smooth_table_resized_up_and_back_down_stays_close():
    table = smooth_table(6, 6)
    up = interpolate_position_embedding(table, (6, 6), (12, 12))
    back = interpolate_position_embedding(up, (12, 12), (6, 6), antialias=False)
    assert up.shape == (144, 8)
    error = (back - table).abs().max() / table.abs().max()
    assert error < 0.05, error


def test_prefix_rows_are_untouched():
    table = torch.randn(2 + 16, 8)
    out = interpolate_position_embedding(table, (4, 4), (7, 5), num_prefix_tokens=2)
    assert out.shape == (2 + 35, 8)
    torch.testing.assert_close(out[:2], table[:2], atol=0, rtol=0)
    # and the grid part is what the prefix-free call gives
    torch.testing.assert_close(out[2:], interpolate_position_embedding(table[2:], (4, 4), (7, 5)))


def test_antialias_only_acts_when_shrinking():
    table = torch.randn(36, 4)
    up_plain = interpolate_position_embedding(table, (6, 6), (9, 9))
    up_aa = interpolate_position_embedding(table, (6, 6), (9, 9), antialias=True)
    torch.testing.assert_close(up_plain, up_aa, atol=0, rtol=0)
    down_plain = interpolate_position_embedding(table, (6, 6), (3, 3))
    down_aa = interpolate_position_embedding(table, (6, 6), (3, 3), antialias=True)
    assert not torch.allclose(down_plain, down_aa)


def test_interpolation_rejects_bad_input():
    with pytest.raises(ValueError, match="old_grid_size"):
        interpolate_position_embedding(torch.randn(15, 4), (4, 4), (5, 5))
    with pytest.raises(ValueError, match="new_grid_size"):
        interpolate_position_embedding(torch.randn(16, 4), (4, 4), (0, 5))
    with pytest.raises(ValueError, match="mode"):
        interpolate_position_embedding(torch.randn(16, 4), (4, 4), (5, 5), mode="area")


# --- per-type tables ----------------------------------------------------------------------------------
def test_learned_2d_resizes_per_axis_and_stays_a_sum():
    old = build_position_encoding("learned_2d", (4, 5), 8)
    new = build_position_encoding("learned_2d", (6, 3), 8)
    state = old.state_dict()
    for key, resizer in new.state_resizers((4, 5)).items():
        state[key] = resizer(state[key])
    new.load_state_dict(state)
    assert sum(p.numel() for p in new.parameters()) == (6 + 3) * 8
    torch.testing.assert_close(new.row, interpolate_axis_table(old.row.detach(), 6))
    idx = torch.arange(18)[None]
    torch.testing.assert_close(new(idx)[0], (new.row[:, None] + new.col[None]).reshape(18, 8))


def test_relative_bias_table_resizes_over_the_new_offset_range():
    # per head a linear function of (dr, dc): a smooth function of the offset stays that function
    old_h, old_w, new_h, new_w, heads = 4, 4, 7, 6, 2
    dr, dc = torch.meshgrid(
        torch.arange(-(old_h - 1), old_h).float(), torch.arange(-(old_w - 1), old_w).float(), indexing="ij"
    )
    table = torch.stack([dr.flatten(), dc.flatten()], dim=1)
    out = interpolate_relative_bias_table(table, (old_h, old_w), (new_h, new_w), mode="bilinear")
    assert out.shape == ((2 * new_h - 1) * (2 * new_w - 1), heads)
    module = build_position_encoding("relative_bias", (new_h, new_w), 8, num_heads=heads)
    with torch.no_grad():
        module.table.copy_(out)
    # the bias between the two grid corners has the extreme offsets, which map to the old extremes
    idx = torch.tensor([[0, new_h * new_w - 1]])
    bias = module.attention_positions(idx).bias[0].detach()  # [heads, 2, 2]
    assert float(bias[0, 1, 0]) == pytest.approx(old_h - 1, abs=1e-5)  # dr = +(H'-1) -> +(H-1)
    assert float(bias[1, 0, 1]) == pytest.approx(-(old_w - 1), abs=1e-5)
    same = interpolate_relative_bias_table(table, (4, 4), (4, 4))
    torch.testing.assert_close(same, table, atol=0, rtol=0)


# --- FlexiViT pseudo-inverse kernel resize -----------------------------------------------------
@pytest.mark.parametrize("old, new", [(4, 6), (8, 12), (4, 8)])
def test_pinv_resize_is_exact_when_the_patch_grows(old, new):
    weight = torch.randn(16, 3, old, old)
    patches = torch.randn(10, 3, old, old)
    new_weight = resize_patch_embed_kernel(weight, new)
    assert new_weight.shape == (16, 3, new, new)
    tokens_old = F.conv2d(patches, weight, stride=old).flatten(1)
    tokens_new = F.conv2d(resize_patch(patches, new), new_weight, stride=new).flatten(1)
    torch.testing.assert_close(tokens_new, tokens_old, atol=1e-4, rtol=1e-4)


def test_pinv_resize_is_least_squares_when_the_patch_shrinks():
    old, new = 8, 4
    weight = torch.randn(5, 2, old, old, dtype=torch.float64)
    new_weight = resize_patch_embed_kernel(weight, new)
    basis = torch.eye(old * old, dtype=torch.float64).view(-1, old, old)
    resize_t = resize_patch(basis, new).reshape(old * old, new * new)  # B^T
    residual = weight.reshape(-1, old * old) - new_weight.reshape(-1, new * new) @ resize_t.T
    # the normal equations: the residual is orthogonal to every column of B^T
    assert (residual @ resize_t).abs().max() < 1e-8
    assert residual.abs().max() > 1e-3  # not exact: shrinking loses information


# --- whole models and checkpoints ---------------------------------------------------------------
def test_sincos_and_rope_are_rebuilt_for_the_new_grid():
    small = VisionTransformer.for_images(32, 8, 3, 32, 1, 2, pos_embed="sincos")
    large = VisionTransformer.for_images(48, 8, 3, 32, 1, 2, pos_embed="sincos")
    state = small.state_dict()
    changed = resize_state_dict(large, state, (4, 4), 8)
    assert changed == {}
    large.load_state_dict(state)
    torch.testing.assert_close(large.transformer.position.table(), sinusoidal_2d_grid(6, 6, 32), atol=0, rtol=0)

    rope = VisionTransformer.for_images(48, 8, 3, 32, 1, 2, pos_embed="rope_axial").transformer.position
    angles = rope.angles(torch.arange(36)[None])  # the whole new grid is accepted
    quarter = angles.size(-1) // 2
    torch.testing.assert_close(angles[0, 0, -1, :quarter], 5 * rope.freqs)  # last row is 5
    torch.testing.assert_close(angles[0, 0, -1, quarter:], 5 * rope.freqs)  # last column is 5


@pytest.mark.parametrize("pos_embed", position_names(2))
def test_checkpoint_from_another_image_and_patch_size_loads_for_every_type(pos_embed):
    old = IJEPA(**{**TINY_MODEL, "pos_embed": pos_embed, "predictor_pos_embed": pos_embed})
    checkpoint = {"state_dict": old.state_dict(), "hyper_parameters": dict(old.hparams)}
    for image_size, patch_size in ((48, 8), (32, 4)):
        new = IJEPA(
            **{
                **TINY_MODEL,
                "image_size": image_size,
                "patch_size": patch_size,
                "pos_embed": pos_embed,
                "predictor_pos_embed": pos_embed,
            }
        )
        ckpt = {k: (dict(v) if isinstance(v, dict) else v) for k, v in checkpoint.items()}
        new.on_load_checkpoint(ckpt)
        new.load_state_dict(ckpt["state_dict"], strict=True)
        grid = image_size // patch_size
        features = new.target_encoder(torch.randn(2, 3, image_size, image_size))
        assert features.shape == (2, grid * grid, 32) and torch.isfinite(features).all()
        # grid-free parameters are carried over unchanged
        key = "encoder.transformer.blocks.0.attn.qkv.weight"
        torch.testing.assert_close(ckpt["state_dict"][key], checkpoint["state_dict"][key], atol=0, rtol=0)


def test_loading_into_another_architecture_lists_the_mismatched_parameters():
    old = IJEPA(**TINY_MODEL)
    checkpoint = {"state_dict": old.state_dict(), "hyper_parameters": dict(old.hparams)}
    wider = IJEPA(**{**TINY_MODEL, "embed_dim": 64, "depth": 3})
    with pytest.raises(ValueError, match="does not fit") as info:
        wider.on_load_checkpoint(checkpoint)
    message = str(info.value)
    assert "encoder.patch_embed.proj.weight: checkpoint (32, 3, 8, 8) vs model (64, 3, 8, 8)" in message
    assert "encoder.transformer.blocks.2.attn.qkv.weight" in message  # missing block listed


def test_optimizer_moments_follow_the_resized_parameters():
    old = IJEPA(**{**TINY_MODEL, "pos_embed": "learned"})
    order = parameter_order(old)
    params = dict(old.named_parameters())
    state = {
        i: {"step": torch.tensor(5.0), "exp_avg": torch.randn_like(params[n]), "exp_avg_sq": torch.rand_like(params[n])}
        for i, n in enumerate(order)
    }
    checkpoint = {
        "state_dict": old.state_dict(),
        "hyper_parameters": dict(old.hparams),
        "optimizer_states": [{"state": state, "param_groups": []}],
    }
    new = IJEPA(**{**TINY_MODEL, "image_size": 48, "pos_embed": "learned"})
    new.on_load_checkpoint(checkpoint)
    new_params = dict(new.named_parameters())
    for i, name in enumerate(parameter_order(new)):
        assert state[i]["exp_avg"].shape == new_params[name].shape, name
        assert (state[i]["exp_avg_sq"] >= 0).all()
