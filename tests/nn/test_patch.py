import pytest
import torch

from ijepa.nn import PatchEmbed, gather_patches, grid_size


def test_patch_embed_shape_and_row_major_order():
    embed = PatchEmbed(image_size=32, patch_size=8, in_channels=3, embed_dim=16)
    images = torch.zeros(2, 3, 32, 32)
    # Light up exactly the patch at grid row 1, column 2 -> row-major index 1 * 4 + 2 = 6.
    images[:, :, 8:16, 16:24] = 1.0
    tokens = embed(images)
    assert tokens.shape == (2, 16, 16)
    bias = embed.proj.bias
    changed = (tokens - bias).abs().sum(-1) > 1e-6
    assert changed[0].nonzero().flatten().tolist() == [6]


def test_gather_patches_matches_indexing():
    tokens = torch.randn(3, 10, 4)
    indices = torch.tensor([[0, 9, 3], [5, 5, 1], [2, 8, 7]])
    out = gather_patches(tokens, indices)
    assert out.shape == (3, 3, 4)
    for b in range(3):
        for k in range(3):
            assert torch.equal(out[b, k], tokens[b, indices[b, k]])


def test_gather_patches_errors():
    tokens = torch.randn(2, 10, 4)
    with pytest.raises(ValueError, match=r"0\.\.9"):
        gather_patches(tokens, torch.tensor([[0, 10], [1, 2]]))
    with pytest.raises(ValueError, match="min=-1"):
        gather_patches(tokens, torch.tensor([[0, -1], [1, 2]]))
    with pytest.raises(ValueError, match="batch mismatch"):
        gather_patches(tokens, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        gather_patches(tokens, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer"):
        gather_patches(tokens, torch.zeros(2, 2))


def test_image_size_must_be_divisible_by_patch_size():
    with pytest.raises(ValueError, match="image_size=50 must be divisible by patch_size=8"):
        grid_size(50, 8)
    with pytest.raises(ValueError, match="patch_size must be > 0"):
        PatchEmbed(32, 0)
    assert grid_size(96, 8) == 12


def test_patch_embed_rejects_wrong_image():
    embed = PatchEmbed(32, 8, 3, 16)
    with pytest.raises(ValueError, match="image_size=32"):
        embed(torch.zeros(1, 3, 40, 40))
    with pytest.raises(ValueError, match="in_channels=3"):
        embed(torch.zeros(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        embed(torch.zeros(3, 32, 32))
