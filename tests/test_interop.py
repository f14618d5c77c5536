"""Official I-JEPA checkpoints in and out, and the trained encoder in plain PyTorch."""

from unittest import mock

import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL

from ijepa.cli import IJEPACLI, main
from ijepa.data import IJEPADataModule
from ijepa.interop import load_encoder, load_official, official_to_state_dict, save_lightning_checkpoint, to_official
from ijepa.module import IJEPA

MODEL = {**TINY_MODEL, "pos_embed": "sincos", "predictor_pos_embed": "sincos", "predictor_mode": "per_block"}


def trained_like(seed: int = 0) -> IJEPA:
    torch.manual_seed(seed)
    model = IJEPA(**MODEL).eval()
    with torch.no_grad():  # online and target differ, as after training
        for p in model.target_encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model


def inputs(model: IJEPA):
    size = model.hparams.image_size
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    n = model.encoder.num_patches
    context = torch.tensor([[0, 2, 5, 7], [1, 3, 4, 6]]) % n
    targets = torch.tensor([[[8, 9], [10, 11]], [[12, 13], [14, 15]]]) % n
    return images, context, targets


def test_official_round_trip_is_lossless_for_every_key():
    model = trained_like()
    official = to_official(model)
    assert set(official) == {"encoder", "predictor", "target_encoder"}
    assert "pos_embed" in official["encoder"] and "predictor_pos_embed" in official["predictor"]
    assert (
        "blocks.0.attn.qkv.weight" in official["encoder"] and "predictor_blocks.0.mlp.fc2.bias" in official["predictor"]
    )
    again = to_official(load_official(official, MODEL["num_heads"], MODEL["predictor_num_heads"]))
    for network in official:
        assert set(again[network]) == set(official[network]), network
        for key, value in official[network].items():
            assert torch.equal(again[network][key], value), (network, key)


def test_a_loaded_official_checkpoint_reproduces_encoder_and_predictor_outputs():
    model = trained_like()
    official = to_official(model)
    # as the official training script writes it: DDP's module. prefix, optimizer and epoch entries
    official = {name: {f"module.{k}": v for k, v in part.items()} for name, part in official.items()}
    official.update(opt={}, epoch=3, loss=0.1)
    loaded = load_official(official, MODEL["num_heads"], MODEL["predictor_num_heads"]).eval()
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
    official["encoder"]["cls_token"] = torch.zeros(1, 1, MODEL["embed_dim"])
    with pytest.raises(ValueError, match=r"cannot map these official keys onto the model: \['cls_token'\]"):
        official_to_state_dict(official)
    with pytest.raises(ValueError, match="not an official I-JEPA checkpoint"):
        official_to_state_dict({"state_dict": {}})


def test_a_pos_embed_that_is_not_the_sincos_table_is_an_error_not_replaced():
    official = to_official(trained_like())
    official["encoder"]["pos_embed"] = official["encoder"]["pos_embed"].flip(-1)  # row/col halves swapped
    with pytest.raises(ValueError, match="encoder.pos_embed is not the 2D sin-cos table"):
        official_to_state_dict(official)


def test_export_refuses_what_the_official_layout_cannot_express():
    for options, what in (
        ({"pos_embed": "rope_axial"}, "position encodings"),
        ({"predictor_mode": "one_pass"}, "one_pass"),
    ):
        with pytest.raises(ValueError, match=f"official I-JEPA layout cannot express.*{what}"):
            to_official(IJEPA(**{**MODEL, **options}))


def test_load_official_at_another_image_size_keeps_the_weights():
    model = trained_like()
    size = MODEL["image_size"] + MODEL["patch_size"]
    loaded = load_official(to_official(model), MODEL["num_heads"], MODEL["predictor_num_heads"], image_size=size)
    assert loaded.encoder.grid_size == size // MODEL["patch_size"]
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


@pytest.mark.slow
def test_ijepa_fit_continues_pretraining_from_an_official_checkpoint(tmp_path):
    official = to_official(trained_like())
    torch.save(official, tmp_path / "official.pth.tar")
    path = tmp_path / "official.ckpt"
    heads = ["--num_heads", str(MODEL["num_heads"]), "--predictor_num_heads", str(MODEL["predictor_num_heads"])]
    main(["convert", str(tmp_path / "official.pth.tar"), str(path), "ckpt", *heads])
    callback = (
        '{"class_path": "ijepa.callbacks.PositionEmbeddingInterpolation", '
        f'"init_args": {{"init_checkpoint": "{path}"}}}}'
    )
    args = ["fit", "--config", str(TINY_CONFIG), "--data.source.train_size=96", "--data.source.val_size=40"]
    args += [f"--trainer.callbacks+={callback}", "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)
    fitted = cli.trainer.lightning_module.state_dict()
    # one optimizer step (and one EMA step) away from the official target encoder's weights
    start = official["target_encoder"]["blocks.0.attn.qkv.weight"]
    assert (fitted["target_encoder.transformer.blocks.0.attn.qkv.weight"] - start).abs().max() < 1e-2
    assert cli.trainer.global_step == 1
