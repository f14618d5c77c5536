import math

import pytest
import torch
import torch.nn.functional as F

from ijepa.nn import Attention, AttentionPositions, Block, Predictor, VisionTransformer, apply_rotary


def make_encoder(**overrides):
    kwargs = dict(image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    kwargs.update(overrides)
    return VisionTransformer(**kwargs)


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
    with pytest.raises(ValueError, match="unknown position embedding 'bogus'"):
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
        corrupted[:, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] = images[:, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8]
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
    predictor = Predictor(grid_size=4, embed_dim=32, predictor_embed_dim=16, depth=2, num_heads=2).eval()
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
    predictor = Predictor(grid_size=4, embed_dim=32, predictor_embed_dim=16, depth=1, num_heads=2).eval()
    context = torch.randn(1, 3, 32)
    context_indices = torch.tensor([[0, 1, 2]])
    a = predictor(context, context_indices, torch.tensor([[5]]))
    b = predictor(context, context_indices, torch.tensor([[10]]))
    c = predictor(context + 1.0, context_indices, torch.tensor([[5]]))
    assert not torch.allclose(a, b, atol=1e-4)
    assert not torch.allclose(a, c, atol=1e-4)


def test_predictor_errors():
    predictor = Predictor(grid_size=4, embed_dim=32, predictor_embed_dim=16, depth=1, num_heads=2)
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
