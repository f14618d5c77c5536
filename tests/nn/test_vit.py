import math

import pytest
import torch
import torch.nn.functional as F

from ijepa.nn import (
    Attention,
    AttentionPositions,
    Block,
    Predictor,
    VisionTransformer,
    apply_rotary,
)
from ijepa.nn.position import POSITION_ENCODINGS, position_names
from ijepa.nn.predictor import block_attention_mask


def make_encoder(**overrides):
    kwargs = dict(image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    kwargs.update(overrides)
    return VisionTransformer.for_images(**kwargs)


def test_encoder_shapes_on_indices_and_full_grid():
    encoder = make_encoder()
    images = torch.randn(2, 3, 32, 32)
    assert encoder(images, torch.tensor([[0, 1, 2], [13, 14, 15]])).shape == (2, 3, 32)
    assert encoder(images).shape == (2, 16, 32)


def test_encoder_errors_name_the_parameter():
    encoder = make_encoder()
    images = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="batch mismatch"):
        encoder(images, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"patch_indices out of range: valid patch indices are 0\.\.15"):
        encoder(images, torch.tensor([[0, 16], [1, 2]]))
    with pytest.raises(ValueError, match="image_size=30 must be divisible by patch_size=8"):
        make_encoder(image_size=30)
    with pytest.raises(ValueError, match="num_heads=3 must be a positive divisor of the width 32"):
        make_encoder(num_heads=3)
    with pytest.raises(ValueError, match="unknown position encoding 'bogus'; valid names: learned, learned_2d, none, "):
        make_encoder(pos_embed="bogus")


def test_encoder_on_gathered_indices_equals_encoder_on_cropped_sequence():
    """Processing indices is not full-grid attention with masking: other patches do not exist."""
    encoder = make_encoder().eval()
    images = torch.randn(1, 3, 32, 32)
    context = torch.tensor([[0, 1, 4, 5]])
    out = encoder(images, context)
    # Destroy every pixel outside the context patches: output must not change.
    corrupted = torch.randn_like(images)
    for i in context[0].tolist():
        r, c = divmod(i, 4)
        corrupted[:, :, r * 8 : (r + 1) * 8, c * 8 : (c + 1) * 8] = images[
            :, :, r * 8 : (r + 1) * 8, c * 8 : (c + 1) * 8
        ]
    assert torch.allclose(encoder(corrupted, context), out, atol=1e-6)
    # ...but changing a context patch does change it.
    corrupted[:, :, :8, :8] += 1.0
    assert not torch.allclose(encoder(corrupted, context), out, atol=1e-4)


def test_positions_follow_the_gathered_indices():
    images = torch.randn(1, 3, 32, 32)
    idx = torch.tensor([[0, 5, 10]])
    perm = torch.tensor([[10, 0, 5]])
    for name in ("learned", "sincos", "none"):
        encoder = make_encoder(pos_embed=name).eval()
        out = encoder(images, idx)
        out_perm = encoder(images, perm)
        # Any encoder whose positions follow indices is equivariant to reordering the tokens.
        assert torch.allclose(out_perm, out[:, [2, 0, 1]], atol=1e-5), name


def test_position_changes_output_unless_none():
    images = torch.randn(1, 3, 32, 32)
    tokens_same_pixels = images.clone()
    # Put the same pixels at two different positions: with position information, outputs differ.
    tokens_same_pixels[:, :, 0:8, 0:8] = tokens_same_pixels[:, :, 24:32, 24:32]
    for name, should_differ in (("learned", True), ("sincos", True), ("none", False)):
        encoder = make_encoder(pos_embed=name, depth=1).eval()
        out = encoder(tokens_same_pixels, torch.tensor([[0, 15]]))
        differ = not torch.allclose(out[0, 0], out[0, 1], atol=1e-5)
        assert differ == should_differ, name


def test_encoder_gradients_flow():
    encoder = make_encoder()
    out = encoder(torch.randn(2, 3, 32, 32), torch.tensor([[0, 3], [5, 6]]))
    out.pow(2).mean().backward()
    missing = [n for n, p in encoder.named_parameters() if p.grad is None]
    assert missing == []


def test_attention_matches_manual_softmax():
    torch.manual_seed(1)
    attn = Attention(dim=16, num_heads=4).eval()
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    weights = (q @ k.transpose(-1, -2) / math.sqrt(4)).softmax(-1)
    manual = attn.proj((weights @ v).transpose(1, 2).reshape(2, 5, 16))
    assert torch.allclose(attn(x), manual, atol=1e-5)


def test_attention_bias_hook():
    attn = Attention(dim=8, num_heads=2).eval()
    x = torch.randn(1, 3, 8)
    # A large finite negative bias on key 2 removes it: output equals attention over keys 0-1.
    bias = torch.zeros(1, 2, 3, 3)
    bias[..., 2] = -1e4
    out = attn(x, AttentionPositions(bias=bias))
    q, k, v = attn.qkv(x).view(1, 3, 3, 2, 4).permute(2, 0, 3, 1, 4)
    expected = F.scaled_dot_product_attention(q, k[:, :, :2], v[:, :, :2])
    expected = attn.proj(expected.transpose(1, 2).reshape(1, 3, 8))
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.isfinite(out).all()


def test_apply_rotary_is_a_relative_rotation():
    head_dim = 8
    freqs = 1.0 / 100 ** (torch.arange(head_dim // 2) / (head_dim // 2))

    def rope(pos):
        angles = torch.tensor(pos, dtype=torch.float32)[:, None] * freqs
        return angles.cos()[None, None], angles.sin()[None, None]

    q = torch.randn(1, 1, 1, head_dim)
    k = torch.randn(1, 1, 1, head_dim)
    # norm preserved: a true rotation of every channel pair
    cos, sin = rope([3.0])
    assert torch.allclose(apply_rotary(q, cos, sin).norm(), q.norm(), atol=1e-5)

    # score depends only on the offset m - n
    def score(m, n):
        return float((apply_rotary(q, *rope([m])) * apply_rotary(k, *rope([n]))).sum())

    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def test_block_is_pre_norm_residual():
    block = Block(16, 2).eval()
    x = torch.randn(2, 4, 16)
    expected = x + block.attn(block.norm1(x))
    expected = expected + block.mlp(block.norm2(expected))
    assert torch.allclose(block(x), expected, atol=1e-6)


def test_predictor_shapes_and_block_independence():
    predictor = Predictor(grid=4, embed_dim=32, predictor_embed_dim=16, depth=2, num_heads=2).eval()
    context = torch.randn(2, 6, 32)
    context_indices = torch.tensor([[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15]])
    targets = torch.tensor([[[8, 9], [14, 15]], [[0, 1], [2, 3]]])
    out = predictor(context, context_indices, targets)
    assert out.shape == (2, 2, 2, 32)
    # [B, Kt] targets give [B, Kt, D]
    assert predictor(context, context_indices, targets[:, 0]).shape == (2, 2, 32)
    # Each block is predicted in its own sequence: moving block 1 leaves block 0's prediction alone.
    moved = targets.clone()
    moved[:, 1] = torch.tensor([[6, 7], [6, 7]])
    out_moved = predictor(context, context_indices, moved)
    assert torch.allclose(out_moved[:, 0], out[:, 0], atol=1e-6)
    assert not torch.allclose(out_moved[:, 1], out[:, 1], atol=1e-4)


def test_predictor_depends_on_target_positions_and_context():
    predictor = Predictor(grid=4, embed_dim=32, predictor_embed_dim=16, depth=1, num_heads=2).eval()
    context = torch.randn(1, 3, 32)
    context_indices = torch.tensor([[0, 1, 2]])
    a = predictor(context, context_indices, torch.tensor([[5]]))
    b = predictor(context, context_indices, torch.tensor([[10]]))
    c = predictor(context + 1.0, context_indices, torch.tensor([[5]]))
    assert not torch.allclose(a, b, atol=1e-4)
    assert not torch.allclose(a, c, atol=1e-4)


def test_predictor_errors():
    predictor = Predictor(grid=4, embed_dim=32, predictor_embed_dim=16, depth=1, num_heads=2)
    context = torch.randn(2, 3, 32)
    ci = torch.tensor([[0, 1, 2], [0, 1, 2]])
    with pytest.raises(ValueError, match=r"target_indices out of range: valid patch indices are 0\.\.15"):
        predictor(context, ci, torch.tensor([[[16]], [[1]]]))
    with pytest.raises(ValueError, match="target_indices must have shape"):
        predictor(context, ci, torch.tensor([[[1]]]))
    with pytest.raises(ValueError, match="context_indices"):
        predictor(context, ci[:, :2], torch.tensor([[5], [6]]))
    with pytest.raises(ValueError, match=r"context must have shape \[B, Kc, 32\]"):
        predictor(torch.randn(2, 3, 16), ci, torch.tensor([[5], [6]]))


# --- the one-pass predictor ------------------------------------------------------------------

# one_pass refuses members that mix tokens after a block
ONE_PASS_TYPES = [name for name in position_names(2) if "after_block" not in POSITION_ENCODINGS[name].hooks()]


def test_block_attention_mask_structure():
    mask = block_attention_mask(num_context=2, num_blocks=2, num_targets=3)
    c, b1, b2 = [0, 1], [2, 3, 4], [5, 6, 7]
    assert mask.shape == (8, 8) and mask.dtype == torch.bool
    assert mask[:, c].all()  # everyone sees the context
    assert not mask[c][:, b1 + b2].any()  # the context sees no query
    assert mask[b1][:, b1].all() and mask[b2][:, b2].all()
    assert not mask[b1][:, b2].any() and not mask[b2][:, b1].any()


def _one_pass_inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    context = torch.randn(2, 5, 32, generator=generator)
    context_indices = torch.tensor([[0, 1, 2, 3, 4], [11, 12, 13, 14, 15]])
    # blocks may overlap each other (as I-JEPA's target blocks do): block 1 and 2 share patch 9
    targets = torch.tensor([[[8, 9], [9, 10], [5, 6]], [[0, 1], [4, 5], [1, 2]]])
    return context, context_indices, targets


@pytest.mark.parametrize("pos_embed", ONE_PASS_TYPES)
def test_one_pass_predicts_each_block_as_if_alone(pos_embed):
    torch.manual_seed(0)
    predictor = Predictor(4, 32, 16, depth=2, num_heads=2, pos_embed=pos_embed, mode="one_pass").eval()
    if pos_embed in ("learned", "learned_2d", "relative_bias"):
        with torch.no_grad():  # non-zero tables, so positions matter
            for p in predictor.position.parameters():
                p.normal_()
    context, context_indices, targets = _one_pass_inputs()
    together = predictor(context, context_indices, targets)
    assert together.shape == (2, 3, 2, 32)
    for block in range(targets.size(1)):
        alone = predictor(context, context_indices, targets[:, block])
        torch.testing.assert_close(together[:, block], alone, atol=2e-6, rtol=1e-5)


def test_one_pass_equals_per_block_at_depth_one_and_differs_deeper():
    # With one block of layers the context's hidden state enters only as keys/values computed
    # from the inputs, so the two modes are the same function; deeper, the per-block context
    # has attended to the queries and the modes differ.
    context, context_indices, targets = _one_pass_inputs()
    for depth, same in ((1, True), (2, False)):
        torch.manual_seed(0)
        per_block = Predictor(4, 32, 16, depth=depth, num_heads=2).eval()
        one_pass = Predictor(4, 32, 16, depth=depth, num_heads=2, mode="one_pass").eval()
        with torch.no_grad():  # O(1) weights: at init the context's change is below float noise
            for p in per_block.parameters():
                p.normal_(0, 0.3)
        one_pass.load_state_dict(per_block.state_dict())
        a, b = per_block(context, context_indices, targets), one_pass(context, context_indices, targets)
        assert torch.allclose(a, b, atol=1e-5) == same


def test_one_pass_gradients_and_errors():
    predictor = Predictor(4, 32, 16, depth=2, num_heads=2, pos_embed="rope_mixed", mode="one_pass")
    context, context_indices, targets = _one_pass_inputs()
    context.requires_grad_(True)
    predictor(context, context_indices, targets).square().mean().backward()
    assert context.grad.abs().sum() > 0
    assert all(p.grad is not None for p in predictor.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="predictor mode must be one of"):
        Predictor(4, 32, 16, num_heads=2, mode="joint")
    with pytest.raises(ValueError, match="acts per token, not 'peg'"):
        Predictor(4, 32, 16, num_heads=2, pos_embed="peg", mode="one_pass")


@pytest.mark.parametrize("with_bias", [False, True])
def test_block_layout_attention_equals_the_masked_attention(with_bias):
    from ijepa.nn import BlockLayout, block_layout_attention

    generator = torch.Generator().manual_seed(0)
    batch, heads, c, m, t, hd = 3, 2, 5, 3, 4, 8
    k_len = c + m * t
    q, k, v = (torch.randn(batch, heads, k_len, hd, generator=generator) for _ in range(3))
    bias = torch.randn(batch, heads, k_len, k_len, generator=generator) if with_bias else None
    mask = block_attention_mask(c, m, t)
    masked_bias = mask if bias is None else bias.masked_fill(~mask, float("-inf"))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=masked_bias)
    torch.testing.assert_close(
        block_layout_attention(q, k, v, BlockLayout(c, m, t), bias), expected, atol=1e-6, rtol=1e-5
    )


def test_positions_are_added_by_the_transformer_alone():
    # One place adds absolute positions (Transformer.last_block_outputs), so an encoder, the
    # predictor and the clip encoder cannot add them twice or forget them.
    from conftest import ROOT

    calls = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "ijepa").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ".add_to_tokens(" in line
    ]
    assert len(calls) == 1 and calls[0].startswith("ijepa/nn/vit.py"), calls
