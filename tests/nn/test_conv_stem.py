"""The convolutional stem (``model.stem: conv``, Xiao et al. 2021): tokens on the patch grid for
every image position member, a receptive field that covers the patch, and a clear refusal from
everything that needs a patch projection's kernel."""

import itertools

import pytest
import torch
import yaml
from conftest import ROOT, TINY_CLIP_MODEL, TINY_MODEL
from helpers import one_line
from torch.nn.modules.batchnorm import _BatchNorm

from ijepa.cli import IJEPACLI
from ijepa.data import IJEPADataModule
from ijepa.data.batch import GridBatch
from ijepa.interop import load_encoder, save_lightning_checkpoint, to_official
from ijepa.interop.convert import main as convert_main
from ijepa.interop.huggingface import encoder_to_hf
from ijepa.interop.timm_vit import encoder_to_timm
from ijepa.module import IJEPA
from ijepa.nn.packing import PACKABLE_POSITIONS, pack_images
from ijepa.nn.patch import PatchEmbed
from ijepa.nn.position import POSITION_ENCODINGS
from ijepa.nn.stem import ConvStem, stem_widths
from ijepa.nn.vit import VisionTransformer

# The image members, by how the registry marks them (clip members have 3-axis grids).
IMAGE_POSITIONS = [name for name, cls in POSITION_ENCODINGS.items() if cls.dims == 2]
CONV = {**TINY_MODEL, "stem": "conv"}  # 32 px, patch 8: a 4 x 4 grid, width 32
KERNEL = "needs a patch projection's kernel, and this encoder has a convolutional stem"


def images(size: int = 32, count: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", IMAGE_POSITIONS)
def test_conv_stem_grid_equals_the_patch_grid_for_every_position_family(name):
    torch.manual_seed(0)
    conv = VisionTransformer.for_images(32, 8, 3, 32, 1, 2, pos_embed=name, stem="conv")
    patch = VisionTransformer.for_images(32, 8, 3, 32, 1, 2, pos_embed=name)
    assert isinstance(conv.patch_embed, ConvStem) and isinstance(patch.patch_embed, PatchEmbed)
    assert conv.grid == patch.grid == (4, 4) and conv.num_patches == patch.num_patches == 16
    assert conv.embed_dim == 32 and type(conv.position) is type(patch.position)
    x = images()
    assert conv.patch_embed(x).shape == patch.patch_embed(x).shape == (2, 16, 32)
    assert conv(x).shape == (2, 16, 32) and torch.isfinite(conv(x)).all()
    indices = torch.tensor([[0, 5, 10, 15], [3, 6, 9, 12]])
    assert conv(x, indices).shape == (2, 4, 32)


# (patch_size, embed_dim) -> widths: embed_dim / 2^(k-1) doubling, at least 16 (Xiao et al.'s ViT-B: 96 ... 768)
WIDTHS = {(4, 64): (32, 64), (8, 128): (32, 64, 128), (16, 64): (16, 16, 32, 64), (16, 768): (96, 192, 384, 768)}


@pytest.mark.parametrize("patch_size, embed_dim, widths", [(*sizes, widths) for sizes, widths in WIDTHS.items()])
def test_conv_stem_has_one_stride_2_convolution_per_factor_of_2_widening_to_the_width(patch_size, embed_dim, widths):
    assert stem_widths(patch_size, embed_dim) == widths
    stem = ConvStem(patch_size * 3, patch_size, 3, embed_dim)
    convs = [stage.conv for stage in stem.stages]
    assert [c.out_channels for c in convs] == list(widths)
    assert all(c.kernel_size == (3, 3) and c.stride == (2, 2) and c.padding == (1, 1) for c in convs)
    assert stem.pointwise.kernel_size == (1, 1) and stem.pointwise.out_channels == embed_dim
    # no BatchNorm: the EMA target encoder copies parameters only, a buffer would stay at its init
    assert not list(stem.buffers()) and not any(isinstance(m, _BatchNorm) for m in stem.modules())


def test_conv_stem_token_sees_its_whole_patch_and_up_to_p_minus_1_pixels_above_and_left():
    torch.manual_seed(0)
    p, side = 8, 6
    stem = ConvStem(p * side, p, 3, 32)
    x = images(p * side, count=1).requires_grad_()
    r, c = 2, 3
    stem(x)[0, r * side + c].square().sum().backward()
    seen = x.grad[0].abs().sum(0) > 0  # [H, W]
    expected = torch.zeros_like(seen)
    expected[p * r - (p - 1) : p * r + p, p * c - (p - 1) : p * c + p] = True
    assert torch.equal(seen, expected)
    # every pixel of its own patch reaches the token: a one-pixel change there changes it
    for dy, dx in ((0, 0), (p - 1, p - 1), (3, 5)):
        changed = x.detach().clone()
        changed[0, :, p * r + dy, p * c + dx] += 1.0
        with torch.no_grad():
            assert not torch.allclose(stem(changed)[0, r * side + c], stem(x.detach())[0, r * side + c])


@pytest.mark.parametrize("p, side", [(8, 4), (4, 5), (16, 2)])
def test_conv_in_patch_token_sees_exactly_its_own_patch_and_equals_the_stem_on_that_patch_alone(p, side):
    torch.manual_seed(0)
    stem = ConvStem(p * side, p, 3, 32, within_patch=True)
    x = images(p * side, count=2).requires_grad_()
    r, c = side - 1, side // 2
    stem(x)[1, r * side + c].square().sum().backward()
    seen = x.grad[1].abs().sum(0) > 0  # [H, W]
    expected = torch.zeros_like(seen)
    expected[p * r : p * r + p, p * c : p * c + p] = True
    assert torch.equal(seen, expected) and x.grad[0].abs().sum() == 0
    # each token is the whole-image stem run on an image that is its patch alone
    with torch.no_grad():
        tokens = stem(x)
        whole = ConvStem(p, p, 3, 32)
        whole.load_state_dict(stem.state_dict())
        for b, (i, j) in itertools.product((0, 1), ((0, 0), (r, c), (side - 1, side - 1))):
            alone = x[b : b + 1, :, p * i : p * i + p, p * j : p * j + p]
            torch.testing.assert_close(tokens[b, i * side + j], whole(alone)[0, 0], rtol=1e-5, atol=1e-6)


def test_the_conv_stem_ablation_runs_the_stem_inside_each_patch_and_conv_stays_whole_image():
    torch.manual_seed(0)
    in_patch = VisionTransformer.for_images(32, 8, 3, 32, 1, 2, stem="conv_in_patch")
    whole = VisionTransformer.for_images(32, 8, 3, 32, 1, 2, stem="conv")
    assert in_patch.patch_embed.within_patch and not whole.patch_embed.within_patch
    assert yaml.safe_load((ROOT / "configs" / "ablations" / "conv_stem.yaml").read_text())["model"]["stem"] == (
        "conv_in_patch"
    )


def test_conv_stem_tokens_are_row_major_as_patch_embed_tokens():
    torch.manual_seed(0)
    p, side = 8, 4
    stem = ConvStem(p * side, p, 3, 32)
    x = images(p * side, count=1)
    r, c = 1, 2
    changed = x.clone()
    changed[0, :, p * r, p * c] += 1.0  # a patch's top-left pixel: only its own token reaches it
    with torch.no_grad():
        moved = (stem(changed) - stem(x)).abs().sum(-1)[0] > 0
    assert moved.nonzero().flatten().tolist() == [r * side + c]


@pytest.mark.parametrize("patch_size", [2, 6, 12, 24])
def test_conv_stem_refuses_a_patch_size_that_is_not_a_power_of_two_of_at_least_4(patch_size):
    with pytest.raises(ValueError, match=rf"^patch_size={patch_size}: stem='conv' needs a power of two >= 4"):
        VisionTransformer.for_images(48, patch_size, 3, 32, 1, 2, stem="conv")


def test_an_unknown_stem_is_refused_with_the_choices():
    with pytest.raises(
        ValueError, match=r"^stem must be one of \('patch', 'conv', 'conv_in_patch'\), got 'convolution'\.$"
    ):
        IJEPA(**{**TINY_MODEL, "stem": "convolution"})


def test_conv_stem_refuses_clips():
    options = {**TINY_CLIP_MODEL, "pos_embed": "sincos_3d", "predictor_pos_embed": "sincos_3d", "stem": "conv"}
    match = r"^stem='conv' is for images; clips \(num_frames=4 > 0\) are embedded by tubelets"
    with pytest.raises(ValueError, match=match):
        IJEPA(**options)


def test_conv_stem_refuses_flexivit_patch_sizes():
    torch.manual_seed(0)
    model = IJEPA(**CONV)
    x = images()
    match = rf"^a per-call patch_size=4 \(FlexiViT, data.train_patch_sizes\) {KERNEL}"
    with pytest.raises(ValueError, match=match):
        model.encoder(x, patch_size=4)
    with pytest.raises(ValueError, match=match):
        model.encoder.patch_embed(x, patch_size=4)
    context, targets = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([[[20, 21]], [[40, 41]]])
    with pytest.raises(ValueError, match=match):  # a data.train_patch_sizes batch cut at 4 px
        model.jepa_loss(GridBatch(x, context, targets, patch_size=4))


def test_conv_stem_refuses_packed_native_resolution_batches():
    model = IJEPA(**{**CONV, "pos_embed": PACKABLE_POSITIONS[0]})
    packed = pack_images([torch.randn(3, 32, 32), torch.randn(3, 16, 24)], 8, (4, 4))
    with pytest.raises(ValueError, match=rf"^a packed batch \(NaViT, data.native_sides\) {KERNEL}"):
        model.target_encoder.forward_packed(packed)


def test_conv_stem_export_is_refused_in_one_line_for_every_format(tmp_path, capsys):
    model = IJEPA(**CONV).eval()
    folders = rf"^exporting to Hugging Face or timm \(a ViT with a patch projection\) {KERNEL}"
    for export in (encoder_to_hf, encoder_to_timm):
        with pytest.raises(ValueError, match=folders):
            export(model)
    official = r"official I-JEPA layout cannot express stem 'conv' \(the official ViT has a patch projection\)"
    with pytest.raises(ValueError, match=official):
        to_official(model)
    checkpoint = save_lightning_checkpoint(model, tmp_path / "run.ckpt")
    for to in ("hf", "timm", "official"):
        line = one_line(capsys, convert_main, [str(checkpoint), str(tmp_path / f"out_{to}"), to])
        assert "convolutional stem" in line or "stem 'conv'" in line
    # what needs no patch projection works: the encoder in plain PyTorch, the same stem
    loaded = load_encoder(checkpoint)
    assert isinstance(loaded.patch_embed, ConvStem)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images()), model.target_encoder(images()))


def test_conv_stem_checkpoint_loads_at_another_image_size():
    torch.manual_seed(0)
    old = IJEPA(**{**CONV, "pos_embed": "learned"})
    checkpoint = {"state_dict": old.state_dict(), "hyper_parameters": dict(old.hparams)}
    new = IJEPA(**{**CONV, "pos_embed": "learned", "image_size": 48})
    new.on_load_checkpoint(checkpoint)  # the position table is interpolated 4x4 -> 6x6
    new.load_state_dict(checkpoint["state_dict"], strict=True)
    for key, value in old.state_dict().items():
        if ".patch_embed." in key:  # the stem's weights do not depend on the image size
            torch.testing.assert_close(new.state_dict()[key], value, atol=0, rtol=0)
    features = new.target_encoder(images(48))
    assert features.shape == (2, 36, 32) and torch.isfinite(features).all()


def test_conv_stem_checkpoint_refuses_another_patch_size_on_load():
    old = IJEPA(**CONV)
    checkpoint = {"state_dict": old.state_dict(), "hyper_parameters": dict(old.hparams)}
    new = IJEPA(**{**CONV, "patch_size": 4})
    with pytest.raises(ValueError, match=r"^patch_size=4: the checkpoint was trained at patch_size=8, and a conv stem"):
        new.on_load_checkpoint(checkpoint)


def test_ijepa_with_a_conv_stem_trains_and_its_target_encoder_has_the_same_stem():
    torch.manual_seed(0)
    model = IJEPA(**CONV).train()
    assert "stem" in IJEPA.ARCHITECTURE and model.hparams.stem == "conv"
    target = model.target_encoder.patch_embed
    assert isinstance(target, ConvStem) and repr(target) == repr(model.encoder.patch_embed)
    for key, value in model.encoder.patch_embed.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value, atol=0, rtol=0)
    assert not any(p.requires_grad for p in target.parameters())
    context = torch.tensor([[0, 1, 2, 4, 5], [10, 11, 14, 15, 9]])
    targets = torch.tensor([[[8, 9], [12, 13]], [[0, 1], [2, 3]]])
    loss = model.jepa_loss(GridBatch(images(), context, targets))
    assert torch.isfinite(loss)
    loss.backward()
    for name, parameter in model.encoder.patch_embed.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert all(p.grad is None for p in target.parameters())


def test_conv_stem_overlay_changes_only_the_stem_of_the_quickstart(tmp_path):
    configs = ROOT / "configs"
    args = ["--config", str(configs / "quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}"]
    quickstart = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)
    conv = IJEPACLI(
        IJEPA, IJEPADataModule, run=False, args=args + ["--config", str(configs / "ablations" / "conv_stem.yaml")]
    )
    assert isinstance(conv.model.encoder.patch_embed, ConvStem)
    assert conv.model.encoder.grid == quickstart.model.encoder.grid
    differ = {k for k in conv.model.hparams if conv.model.hparams[k] != quickstart.model.hparams.get(k)}
    assert differ == {"stem"}


def test_the_in_patch_stem_is_refused_under_its_own_name():
    with pytest.raises(ValueError, match=r"^patch_size=6: stem='conv_in_patch' needs a power of two >= 4"):
        VisionTransformer.for_images(48, 6, 3, 32, 1, 2, stem="conv_in_patch")
