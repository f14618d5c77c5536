"""Official I-JEPA checkpoints in and out, and the trained encoder in plain PyTorch."""

from unittest import mock

import pytest
import torch
from conftest import TINY_CONFIG
from helpers import INTEROP_MODEL, trained_like

from ijepa.cli import IJEPACLI, main
from ijepa.data import IJEPADataModule
from ijepa.interop import load_encoder, load_official, official_to_state_dict, save_lightning_checkpoint, to_official
from ijepa.interop.official import NETWORKS, RESUME_ENTRIES
from ijepa.module import IJEPA


def inputs(model: IJEPA):
    size = model.hparams.image_size
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    n = model.encoder.num_patches
    context = torch.tensor([[0, 2, 5, 7], [1, 3, 4, 6]]) % n
    targets = torch.tensor([[[8, 9], [10, 11]], [[12, 13], [14, 15]]]) % n
    return images, context, targets


@pytest.mark.parametrize("module_prefix", [True, False])
def test_official_round_trip_is_lossless_for_every_key(module_prefix):
    model = trained_like()
    official = to_official(model, module_prefix)
    assert set(official) == set(NETWORKS) | set(RESUME_ENTRIES)
    prefix = "module." if module_prefix else ""
    assert f"{prefix}pos_embed" in official["encoder"] and f"{prefix}predictor_pos_embed" in official["predictor"]
    assert f"{prefix}blocks.0.attn.qkv.weight" in official["encoder"]
    assert f"{prefix}predictor_blocks.0.mlp.fc2.bias" in official["predictor"]
    again = to_official(
        load_official(official, INTEROP_MODEL["num_heads"], INTEROP_MODEL["predictor_num_heads"]), module_prefix
    )
    for network in NETWORKS:
        assert set(again[network]) == set(official[network]), network
        for key, value in official[network].items():
            assert torch.equal(again[network][key], value), (network, key)


class DistributedDataParallel(torch.nn.Module):
    """What the official train.py wraps each network in when world_size > 1: keys gain `module.`."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module


def official_network(state: dict) -> torch.nn.Module:
    """A module with the official network's parameter names and shapes (all of its entries are
    parameters: pos_embed and mask_token too), as the official ViT builds them."""
    root = torch.nn.Module()
    for key, value in state.items():
        *path, name = key.removeprefix("module.").split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]
        module.register_parameter(name, torch.nn.Parameter(torch.zeros_like(value)))
    return root


def official_resume(checkpoint: dict, distributed: bool) -> int:
    """The official src/helper.py load_checkpoint's reads, each strict, in its order; returns the
    epoch it resumes at. It catches every exception and restarts at epoch 0 from random weights,
    so here any missing entry or mismatched key is an error instead."""
    epoch = checkpoint["epoch"]
    networks = {name: official_network(checkpoint[name]) for name in NETWORKS}

    def params(network, decay):  # the official init_opt's four groups
        return [p for n, p in network.named_parameters() if (("bias" not in n) and len(p.shape) != 1) == decay]

    encoder, predictor = networks["encoder"], networks["predictor"]
    opt = torch.optim.AdamW(
        [
            {"params": params(encoder, True)},
            {"params": params(predictor, True)},
            {"params": params(encoder, False), "WD_exclude": True, "weight_decay": 0},
            {"params": params(predictor, False), "WD_exclude": True, "weight_decay": 0},
        ]
    )
    for name, network in networks.items():
        wrapped = DistributedDataParallel(network) if distributed else network
        wrapped.load_state_dict(checkpoint[name])  # strict, as the official call
        for key, value in checkpoint[name].items():
            assert torch.equal(wrapped.state_dict()[key], value), (name, key)
    opt.load_state_dict(checkpoint["opt"])
    torch.amp.GradScaler("cpu").load_state_dict(checkpoint["scaler"])  # bfloat16 runs
    for group in opt.param_groups:  # the loaded optimizer steps
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    opt.step()
    assert opt.param_groups[2]["WD_exclude"] and opt.param_groups[2]["weight_decay"] == 0
    return epoch


def test_ijepa_convert_official_writes_a_file_the_official_train_script_resumes_from(tmp_path):
    ckpt = save_lightning_checkpoint(trained_like(), tmp_path / "run.ckpt")
    main(["convert", str(ckpt), str(tmp_path / "ddp.pth.tar"), "official"])
    main(["convert", str(ckpt), str(tmp_path / "one.pth.tar"), "official", "--module_prefix", "false"])
    assert official_resume(torch.load(tmp_path / "ddp.pth.tar", weights_only=True), distributed=True) == 0
    assert official_resume(torch.load(tmp_path / "one.pth.tar", weights_only=True), distributed=False) == 0


def test_a_loaded_official_checkpoint_reproduces_encoder_and_predictor_outputs():
    model = trained_like()
    official = to_official(model)  # as the official training script writes it: module. prefix, opt, epoch
    official.update(epoch=3, loss=0.1)
    loaded = load_official(official, INTEROP_MODEL["num_heads"], INTEROP_MODEL["predictor_num_heads"]).eval()
    images, context, targets = inputs(model)
    with torch.no_grad():
        for network in ("encoder", "target_encoder"):
            torch.testing.assert_close(getattr(loaded, network)(images), getattr(model, network)(images))
        features = model.encoder(images, context)
        torch.testing.assert_close(
            loaded.predictor(features, context, targets), model.predictor(features, context, targets)
        )


def test_unmapped_keys_are_listed_and_nothing_is_loaded():
    official = to_official(trained_like())
    official["encoder"]["cls_token"] = torch.zeros(1, 1, INTEROP_MODEL["embed_dim"])
    with pytest.raises(ValueError, match=r"cannot map these official keys onto the model: \['cls_token'\]"):
        official_to_state_dict(official)
    with pytest.raises(ValueError, match="not an official I-JEPA checkpoint"):
        official_to_state_dict({"state_dict": {}})


def test_a_pos_embed_that_is_not_the_sincos_table_is_an_error_not_replaced():
    official = to_official(trained_like(), module_prefix=False)
    official["encoder"]["pos_embed"] = official["encoder"]["pos_embed"].flip(-1)  # row/col halves swapped
    with pytest.raises(ValueError, match="encoder.pos_embed is not the 2D sin-cos table"):
        official_to_state_dict(official)


def test_export_refuses_what_the_official_layout_cannot_express():
    for options, what in (
        ({"pos_embed": "rope_axial"}, "position encodings"),
        ({"predictor_mode": "one_pass"}, "one_pass"),
    ):
        with pytest.raises(ValueError, match=f"official I-JEPA layout cannot express.*{what}"):
            to_official(IJEPA(**{**INTEROP_MODEL, **options}))


def test_load_official_at_another_image_size_keeps_the_weights():
    model = trained_like()
    size = INTEROP_MODEL["image_size"] + INTEROP_MODEL["patch_size"]
    loaded = load_official(
        to_official(model), INTEROP_MODEL["num_heads"], INTEROP_MODEL["predictor_num_heads"], image_size=size
    )
    assert loaded.encoder.grid == (size // INTEROP_MODEL["patch_size"],) * 2
    torch.testing.assert_close(loaded.encoder.patch_embed.proj.weight, model.encoder.patch_embed.proj.weight)


def test_load_encoder_gives_a_plain_module_in_three_lines(tmp_path):
    model = trained_like()
    path = save_lightning_checkpoint(model, tmp_path / "run.ckpt")

    encoder = load_encoder(path)  # the documented use: load, then call
    images = inputs(model)[0]
    features = encoder.pooled_features(images)

    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())
    assert type(encoder).__module__ == "ijepa.nn.vit"  # plain PyTorch, no Lightning
    with torch.no_grad():
        torch.testing.assert_close(encoder(images), model.target_encoder(images))
        torch.testing.assert_close(features, model.target_encoder.pooled_features(images))
        torch.testing.assert_close(load_encoder(path, "online")(images), model.encoder(images))
    with pytest.raises(ValueError, match="encoder must be 'target' or 'online'"):
        load_encoder(path, "ema")


def test_a_loaded_encoder_exports_with_torch_export_and_computes_what_it_computes_eagerly(tmp_path):
    model = trained_like()
    encoder = load_encoder(save_lightning_checkpoint(model, tmp_path / "run.ckpt"))
    images = inputs(model)[0]
    batch = torch.export.Dim("batch")
    program = torch.export.export(encoder, (images,), dynamic_shapes=({0: batch},))
    more = torch.cat([images, images.flip(0), images])  # another batch size
    with torch.no_grad():
        torch.testing.assert_close(program.module()(more), encoder(more))


@pytest.mark.parametrize(
    "options",
    [{}, {"num_frames": 4, "pos_embed": "sincos_3d", "predictor_pos_embed": "sincos_3d"}],
    ids=["image", "clip"],
)
def test_load_encoder_builds_the_encoder_ijepa_builds(tmp_path, options):
    torch.manual_seed(0)
    model = IJEPA(**{**INTEROP_MODEL, **options}).eval()
    path = save_lightning_checkpoint(model, tmp_path / "run.ckpt")
    for which, network in (("target", model.target_encoder), ("online", model.encoder)):
        loaded = load_encoder(path, which)
        assert type(loaded) is type(network) and repr(loaded) == repr(network)
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in network.state_dict().items())


def test_fit_refuses_a_weights_only_conversion_as_ckpt_path_and_names_init_checkpoint(tmp_path):
    ckpt = save_lightning_checkpoint(trained_like(), tmp_path / "run.ckpt")
    main(["convert", str(ckpt), str(tmp_path / "weights.ckpt"), "ckpt"])
    args = ["fit", "--config", str(TINY_CONFIG), f"--ckpt_path={tmp_path / 'weights.ckpt'}"]
    args += [f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch("sys.argv", ["ijepa"]), pytest.raises(ValueError) as error:
        IJEPACLI(IJEPA, IJEPADataModule, args=args)
    first = str(error.value).splitlines()[0]
    assert f"ckpt_path='{tmp_path / 'weights.ckpt'}' is a weights-only conversion" in first
    assert "PositionEmbeddingInterpolation callback's init_checkpoint" in first
