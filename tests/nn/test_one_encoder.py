"""One encoder class for images and clips, one init sequence, and the flat clip table's name."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_MODEL, save_tiny_checkpoint
from torch import nn

import ijepa.nn.video as video
from ijepa.interop.encoder import load_encoder
from ijepa.module import IJEPA
from ijepa.nn import PatchEmbed, Predictor, VisionTransformer, build_position_encoding
from ijepa.nn.position import POSITION_ENCODINGS, LearnedFlat3DPosition, position_names
from ijepa.nn.video import TubeletEmbed
from ijepa.nn.vit import Transformer

# A depth-1 clip encoder's state dict as checkpoints have always held it (learned_3d, 4 frames of
# 16 px, 2 x 8 x 8 tubelets, width 32): key for key, shape for shape.
CLIP_CHECKPOINT_KEYS = {
    "patch_embed.proj.weight": (32, 3, 2, 8, 8),
    "patch_embed.proj.bias": (32,),
    "transformer.position.embedding.weight": (8, 32),
    "transformer.blocks.0.norm1.weight": (32,),
    "transformer.blocks.0.norm1.bias": (32,),
    "transformer.blocks.0.attn.qkv.weight": (96, 32),
    "transformer.blocks.0.attn.qkv.bias": (96,),
    "transformer.blocks.0.attn.proj.weight": (32, 32),
    "transformer.blocks.0.attn.proj.bias": (32,),
    "transformer.blocks.0.norm2.weight": (32,),
    "transformer.blocks.0.norm2.bias": (32,),
    "transformer.blocks.0.mlp.fc1.weight": (128, 32),
    "transformer.blocks.0.mlp.fc1.bias": (128,),
    "transformer.blocks.0.mlp.fc2.weight": (32, 128),
    "transformer.blocks.0.mlp.fc2.bias": (32,),
    "transformer.norm.weight": (32,),
    "transformer.norm.bias": (32,),
}
CLIP_OPTIONS = dict(num_frames=4, image_size=16, tubelet_size=2, patch_size=8, in_channels=3, embed_dim=32)


def image_encoder(**options) -> VisionTransformer:
    return VisionTransformer.for_images(16, 8, 3, 32, 2, 2, **options)


def clip_encoder(**options) -> VisionTransformer:
    return VisionTransformer.for_clips(4, 16, 2, 8, 3, 32, 2, 2, **options)


def test_images_and_clips_are_one_encoder_class_that_differs_only_in_its_embedding():
    image, clip = image_encoder().eval(), clip_encoder().eval()
    assert type(image) is type(clip) is VisionTransformer and not hasattr(video, "VideoVisionTransformer")
    assert isinstance(image.patch_embed, PatchEmbed) and isinstance(clip.patch_embed, TubeletEmbed)
    assert (image.grid, clip.grid) == ((2, 2), (2, 2, 2))  # one spelling, a tuple, for both
    assert (image.is_clip_encoder, clip.is_clip_encoder) == (False, True)
    for encoder, inputs in ((image, torch.randn(2, 3, 16, 16)), (clip, torch.randn(2, 3, 4, 16, 16))):
        with torch.no_grad():
            blocks = encoder.block_outputs(inputs, 2)
            assert torch.equal(blocks[-1], encoder(inputs))
            assert torch.equal(encoder.pooled_features(inputs, 2), torch.cat([b.mean(dim=1) for b in blocks], -1))


def test_a_per_call_patch_size_is_for_image_encoders_only():
    with pytest.raises(ValueError, match=r"patch_size=4: per-call patch sizes \(FlexiViT, data.train_patch_sizes\)"):
        clip_encoder()(torch.randn(1, 3, 4, 16, 16), patch_size=4)
    assert image_encoder().pooled_features(torch.randn(1, 3, 16, 16), patch_size=4).shape == (1, 32)


def reference_init(network: nn.Module, rescale_residuals: bool, learned_inputs=()) -> None:
    """I-JEPA's init written out independently of ``ijepa.nn.vit.init_network``: trunc-normal(0.02)
    Linear and Conv2d weights with zero biases and unit LayerNorms, in module order (a tubelet's
    Conv3d keeps PyTorch's default); then the learned inputs; then the position encoding's own
    draw; then the residual projections of layer l divided by sqrt(2 l)."""
    for module in network.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    for parameter in learned_inputs:
        nn.init.trunc_normal_(parameter, std=0.02)
    network.transformer.position.reset_parameters()
    if rescale_residuals:
        with torch.no_grad():
            for layer, block in enumerate(network.transformer.blocks, start=1):
                block.attn.proj.weight.div_(math.sqrt(2 * layer))
                block.mlp.fc2.weight.div_(math.sqrt(2 * layer))


def assert_same_weights(built: nn.Module, reference: nn.Module) -> None:
    ours, theirs = built.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert [key for key in ours if not torch.equal(ours[key], theirs[key])] == []


CASES = [(name, 2) for name in position_names(2)] + [(name, 3) for name in position_names(3)]


@pytest.mark.parametrize("rescale", [True, False])
@pytest.mark.parametrize("pos_embed, dims", CASES)
def test_encoders_and_predictor_share_the_documented_init_bit_for_bit(pos_embed, dims, rescale):
    embed = (lambda: PatchEmbed(16, 8, 3, 32)) if dims == 2 else (lambda: TubeletEmbed(**CLIP_OPTIONS))
    grid = (2, 2, 2)[-dims:]
    torch.manual_seed(0)
    encoder = VisionTransformer(embed(), 2, 2, pos_embed=pos_embed, rescale_residuals=rescale)
    torch.manual_seed(0)
    reference = nn.Module()  # built in the encoder's order, so the same random numbers meet the same tensors
    reference.patch_embed = embed()
    reference.transformer = Transformer(32, 2, 2, build_position_encoding(pos_embed, grid, 32, 2))
    reference_init(reference, rescale)
    assert_same_weights(encoder, reference)

    torch.manual_seed(0)
    predictor = Predictor(grid, 32, 16, 2, 2, pos_embed=pos_embed, rescale_residuals=rescale)
    torch.manual_seed(0)
    reference = nn.Module()
    reference.input_proj = nn.Linear(32, 16)
    reference.mask_token = nn.Parameter(torch.zeros(1, 1, 16))
    reference.transformer = Transformer(16, 2, 2, build_position_encoding(pos_embed, grid, 16, 2))
    reference.output_proj = nn.Linear(16, 32)
    reference_init(reference, rescale, [reference.mask_token])
    assert_same_weights(predictor, reference)


def test_learned_3d_is_the_former_name_of_the_flat_clip_table():
    assert "learned_3d" not in POSITION_ENCODINGS and "learned_flat_3d" in position_names(3)
    with pytest.warns(FutureWarning, match="position encoding 'learned_3d' is now called 'learned_flat_3d'"):
        torch.manual_seed(0)
        old = build_position_encoding("learned_3d", (2, 3, 3), 16)
    torch.manual_seed(0)
    new = build_position_encoding("learned_flat_3d", (2, 3, 3), 16)
    assert type(old) is LearnedFlat3DPosition and old.name == "learned_flat_3d"
    assert torch.equal(old.embedding.weight, new.embedding.weight)
    assert {key: tuple(value.shape) for key, value in old.state_dict().items()} == {"embedding.weight": (18, 16)}
    factorised = build_position_encoding("learned_2d", (3, 3), 16)  # unlike the flat table: one row per axis value
    assert {key: tuple(value.shape) for key, value in factorised.state_dict().items()} == {
        "row": (3, 16),
        "col": (3, 16),
    }


def test_a_clip_checkpoint_saved_with_learned_3d_loads_with_identical_weights(tmp_path):
    generator = torch.Generator().manual_seed(0)
    state = {
        f"target_encoder.{key}": torch.randn(shape, generator=generator) for key, shape in CLIP_CHECKPOINT_KEYS.items()
    }
    hyper_parameters = {**CLIP_OPTIONS, "depth": 1, "num_heads": 2, "pos_embed": "learned_3d"}
    torch.save({"hyper_parameters": hyper_parameters, "state_dict": state}, tmp_path / "old.ckpt")
    with pytest.warns(FutureWarning, match="'learned_3d' is now called 'learned_flat_3d'"):
        encoder = load_encoder(tmp_path / "old.ckpt")
    loaded = encoder.state_dict()
    assert loaded.keys() == CLIP_CHECKPOINT_KEYS.keys()
    assert [key for key in loaded if not torch.equal(loaded[key], state[f"target_encoder.{key}"])] == []


def test_an_ijepa_checkpoint_with_pos_embed_learned_3d_loads_with_identical_weights(tmp_path):
    options = {**TINY_MODEL, "image_size": 16, "num_frames": 4, "tubelet_size": 2}
    model = IJEPA(**options, pos_embed="learned_flat_3d", predictor_pos_embed="learned_flat_3d")
    save_tiny_checkpoint(model, tmp_path / "new.ckpt")
    checkpoint = torch.load(tmp_path / "new.ckpt", weights_only=False)
    checkpoint["hyper_parameters"].update(pos_embed="learned_3d", predictor_pos_embed="learned_3d")  # as saved before
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with pytest.warns(FutureWarning, match="'learned_3d' is now called 'learned_flat_3d'"):
        loaded = IJEPA.load_from_checkpoint(tmp_path / "old.ckpt", map_location="cpu")
    saved = model.state_dict()
    assert loaded.state_dict().keys() == saved.keys()
    assert [key for key, value in loaded.state_dict().items() if not torch.equal(value, saved[key])] == []
