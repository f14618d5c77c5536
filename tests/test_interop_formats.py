"""Hugging Face IJepaModel and timm VisionTransformer in and out, and the `ijepa convert` command.

transformers and timm are test dependencies (the dev extra): these tests import them directly and
do not skip."""

import json
import os
from pathlib import Path

import pytest
import timm
import torch
from conftest import TINY_MODEL
from transformers import IJepaConfig, IJepaForImageClassification, IJepaModel

from ijepa.cli import main
from ijepa.interop import (
    encoder_to_hf,
    encoder_to_timm,
    ijepa_from_encoder,
    load_encoder,
    load_hf,
    save_hf,
    save_lightning_checkpoint,
    save_timm,
    to_hub_layout,
    to_official,
)
from ijepa.module import IJEPA
from ijepa.nn.position import AdditivePosition, NonePosition, position_names
from ijepa.nn.position.registry import POSITION_ENCODINGS
from ijepa.nn.vit import VisionTransformer

SIZES = {"image_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
HF_SIZES = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
EXPORTABLE = tuple(
    name
    for name in position_names(2)
    if issubclass(POSITION_ENCODINGS[name], AdditivePosition) or POSITION_ENCODINGS[name] is NonePosition
)
NOT_EXPORTABLE = tuple(name for name in position_names(2) if name not in EXPORTABLE)


def images(n: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(7))


def trained_encoder(pos_embed: str, seed: int = 0) -> VisionTransformer:
    """An encoder whose every parameter (biases and LayerNorms too) is away from its init."""
    torch.manual_seed(seed)
    encoder = VisionTransformer.for_images(**SIZES, pos_embed=pos_embed).eval()
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return encoder


def random_hf(seed: int = 0, **config) -> IJepaModel:
    torch.manual_seed(seed)
    model = IJepaModel(IJepaConfig(**{**HF_SIZES, **config})).eval()
    with torch.no_grad():  # HF zero-inits biases and unit-inits LayerNorms: move them so the test sees them
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_not_exportable_members_are_exactly_those_acting_inside_the_network():
    assert set(EXPORTABLE) >= {"learned", "learned_2d", "sincos", "none"}
    assert set(NOT_EXPORTABLE) >= {"rope_axial", "rope_mixed", "peg", "relative_bias"}


def test_a_random_hf_ijepa_model_loaded_into_our_encoder_gives_the_same_outputs():
    hf = random_hf()
    encoder = load_hf(hf.state_dict(), hf.config.to_dict())
    x = images()
    with torch.no_grad():
        expected = hf(pixel_values=x).last_hidden_state
        torch.testing.assert_close(encoder(x), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(encoder.pooled_features(x), expected.mean(dim=1), rtol=1e-5, atol=1e-5)
    assert encoder.position.name == "learned"  # a random table is not the sin-cos one
    assert encoder.transformer.norm.eps == hf.config.layer_norm_eps  # 1e-12 in IJepaConfig, kept


def test_hf_folders_and_both_key_layouts_load_to_the_same_encoder(tmp_path):
    hf = random_hf(seed=1)
    hf.save_pretrained(tmp_path)  # whatever layout the installed transformers writes
    from_folder = load_hf(tmp_path)
    state = hf.state_dict()
    hub = to_hub_layout(state)  # the transformers 4 / Hub layout
    assert any(key.startswith("encoder.layer.0.attention.attention.query") for key in hub)
    from_hub = load_hf(hub, hf.config.to_dict())
    x = images()
    with torch.no_grad():
        expected = hf(pixel_values=x).last_hidden_state
        torch.testing.assert_close(from_folder(x), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(from_hub(x), expected, rtol=1e-5, atol=1e-5)


def test_a_sincos_position_table_is_recognised_and_loaded_as_sincos(tmp_path):
    save_hf(trained_encoder("sincos"), tmp_path)
    assert load_hf(tmp_path).position.name == "sincos"
    assert load_hf(tmp_path, pos_embed="learned").position.name == "learned"


@pytest.mark.parametrize("pos_embed", EXPORTABLE)
def test_our_encoder_exported_to_hf_gives_the_same_outputs_there(tmp_path, pos_embed):
    encoder = trained_encoder(pos_embed)
    save_hf(encoder, tmp_path)
    hf, info = IJepaModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    x = images()
    with torch.no_grad():
        out = hf.eval()(pixel_values=x).last_hidden_state
        torch.testing.assert_close(out, encoder(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.mean(dim=1), encoder.pooled_features(x), rtol=1e-5, atol=1e-5)
        again = load_hf(tmp_path)  # and back into ours
        torch.testing.assert_close(again(x), encoder(x), rtol=1e-5, atol=1e-5)
    processor = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert processor["size"] == {"shortest_edge": 32} and processor["crop_size"] == {"height": 32, "width": 32}


@pytest.mark.parametrize("pos_embed", EXPORTABLE)
def test_our_encoder_exported_to_timm_gives_the_same_outputs_there(tmp_path, pos_embed):
    encoder = trained_encoder(pos_embed)
    save_timm(encoder, tmp_path)
    from_folder = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    args, state = encoder_to_timm(encoder)  # the other route: create_model plus load_state_dict
    built = timm.create_model("vit_base_patch16_224", pretrained=False, **args).eval()
    built.load_state_dict(state, strict=True)
    x = images()
    with torch.no_grad():
        for model in (from_folder, built):
            torch.testing.assert_close(model.forward_features(x), encoder(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model(x), encoder.pooled_features(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos_embed", NOT_EXPORTABLE)
def test_position_types_that_are_not_a_table_are_refused_on_export(tmp_path, pos_embed):
    encoder = trained_encoder(pos_embed)
    for export in (lambda: save_hf(encoder, tmp_path / "hf"), lambda: save_timm(encoder, tmp_path / "timm")):
        with pytest.raises(ValueError, match=f"pos_embed '{pos_embed}' acts through .* cannot be written as a table"):
            export()
    assert not (tmp_path / "hf").exists() and not (tmp_path / "timm").exists()  # nothing half-written


def test_hf_round_trip_ours_to_hf_is_lossless_for_every_key():
    hf = random_hf(seed=2, image_size=32)
    hub = to_hub_layout(hf.state_dict())
    config, again = encoder_to_hf(load_hf(hub, hf.config.to_dict()))
    assert set(again) == set(hub)
    for key, value in hub.items():
        assert torch.equal(again[key], value), key
    assert config["layer_norm_eps"] == hf.config.layer_norm_eps and config["intermediate_size"] == 64


def test_unmapped_hf_keys_are_listed_and_heads_are_dropped_only_when_asked():
    torch.manual_seed(0)
    classifier = IJepaForImageClassification(IJepaConfig(**HF_SIZES, num_labels=5)).eval()
    state, config = classifier.state_dict(), classifier.config.to_dict()
    with pytest.raises(ValueError, match=r"cannot map these IJepaModel keys.*'classifier.bias', 'classifier.weight'"):
        load_hf(state, config)
    encoder = load_hf(state, config, drop=("classifier.",))
    x = images()
    with torch.no_grad():
        expected = classifier.ijepa(pixel_values=x).last_hidden_state
        torch.testing.assert_close(encoder(x), expected, rtol=1e-5, atol=1e-5)


def test_incomplete_or_foreign_hf_inputs_are_errors():
    hf = random_hf()
    state, config = hf.state_dict(), hf.config.to_dict()
    missing = {k: v for k, v in state.items() if not k.startswith("layers.1.mlp.fc2")}
    with pytest.raises(ValueError, match=r"lacks these parameters.*transformer\.blocks\.1\.mlp\.fc2"):
        load_hf(missing, config)
    no_key = {k: v for k, v in state.items() if "layers.0.attention.k_proj.weight" not in k}
    with pytest.raises(ValueError, match=r"encoder.layer.0: attention weight lacks \['key'\]"):
        load_hf(no_key, config)
    with pytest.raises(ValueError, match="hidden_act must be 'gelu'"):
        load_hf(state, {**config, "hidden_act": "gelu_new"})
    with pytest.raises(ValueError, match="needs its config"):
        load_hf(state)


def test_what_timm_or_hf_cannot_hold_is_refused():
    hf_imported = load_hf(random_hf().state_dict(), random_hf().config.to_dict())  # LayerNorm eps 1e-12
    with pytest.raises(ValueError, match="timm's ViT LayerNorms use eps=1e-06"):
        encoder_to_timm(hf_imported)
    clips = IJEPA(**{**TINY_MODEL, "num_frames": 4, "pos_embed": "sincos_3d", "predictor_pos_embed": "sincos_3d"})
    with pytest.raises(ValueError, match="only image encoders"):
        encoder_to_hf(clips)


def test_an_hf_encoder_becomes_an_ijepa_model_fit_can_continue(tmp_path):
    hf = random_hf(seed=3, layer_norm_eps=1e-6)
    encoder = load_hf(hf.state_dict(), hf.config.to_dict())
    predictor = {key: value for key, value in TINY_MODEL.items() if key.startswith("predictor_")}
    model = ijepa_from_encoder(encoder, **predictor)
    x = images()
    with torch.no_grad():
        for network in (model.encoder, model.target_encoder):
            torch.testing.assert_close(network(x), encoder(x))
    path = save_lightning_checkpoint(model, tmp_path / "from_hf.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(load_encoder(path)(x), encoder(x))
    with pytest.raises(ValueError, match=r"\['embed_dim'\] are read from the encoder"):
        ijepa_from_encoder(encoder, embed_dim=64)
    with pytest.warns(UserWarning, match="LayerNorms use eps=1e-6; the encoder's use 1e-12"):
        ijepa_from_encoder(load_hf(random_hf().state_dict(), random_hf().config.to_dict()))


def test_ijepa_convert_writes_each_format_from_a_fit_checkpoint(tmp_path, capsys):
    model = IJEPA(
        **{**TINY_MODEL, "pos_embed": "sincos", "predictor_pos_embed": "sincos", "predictor_mode": "per_block"}
    )
    ckpt = save_lightning_checkpoint(model.eval(), tmp_path / "run.ckpt")
    x = images(size=TINY_MODEL["image_size"])
    main(["convert", str(ckpt), str(tmp_path / "hf"), "hf"])
    main(["convert", str(ckpt), str(tmp_path / "timm"), "timm", "--encoder", "online"])
    main(["convert", str(ckpt), str(tmp_path / "official.pth.tar"), "official"])
    assert "ckpt " in capsys.readouterr().out
    hf = IJepaModel.from_pretrained(tmp_path / "hf").eval()
    vit = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    official = torch.load(tmp_path / "official.pth.tar", weights_only=True)
    with torch.no_grad():
        torch.testing.assert_close(hf(pixel_values=x).last_hidden_state, model.target_encoder(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vit(x), model.encoder.pooled_features(x), rtol=1e-5, atol=1e-5)
    expected = to_official(model)
    for network in ("encoder", "predictor", "target_encoder"):
        assert all(torch.equal(official[network][k], v) for k, v in expected[network].items()), network

    # and back: official -> ckpt needs the head counts; hf -> ckpt gets a fresh predictor
    with pytest.raises(SystemExit):
        main(["convert", str(tmp_path / "official.pth.tar"), str(tmp_path / "o.ckpt"), "ckpt"])
    assert "needs --num_heads and --predictor_num_heads" in capsys.readouterr().err
    heads = ["--num_heads", str(TINY_MODEL["num_heads"]), "--predictor_num_heads", "2"]
    main(["convert", str(tmp_path / "official.pth.tar"), str(tmp_path / "o.ckpt"), "ckpt", *heads])
    main(["convert", str(tmp_path / "hf"), str(tmp_path / "h.ckpt"), "ckpt", "--predictor_num_heads", "2"])
    with torch.no_grad():
        torch.testing.assert_close(load_encoder(tmp_path / "o.ckpt")(x), model.target_encoder(x))
        torch.testing.assert_close(load_encoder(tmp_path / "h.ckpt", "online")(x), model.target_encoder(x))


def convert_error(capsys, *args: str) -> str:
    """The one line ``ijepa convert`` prints on stderr before exiting with status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["convert", *map(str, args)])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture
def fit_checkpoint(tmp_path):
    model = IJEPA(
        **{**TINY_MODEL, "pos_embed": "sincos", "predictor_pos_embed": "sincos", "predictor_mode": "per_block"}
    )
    return save_lightning_checkpoint(model.eval(), tmp_path / "run.ckpt")


def test_ijepa_convert_refuses_an_existing_destination_of_every_format_unless_overwrite(
    tmp_path, capsys, fit_checkpoint
):
    for to, name in (("ckpt", "w.ckpt"), ("official", "o.pth.tar"), ("hf", "hf"), ("timm", "timm")):
        destination = tmp_path / name
        main(["convert", str(fit_checkpoint), str(destination), to])
        written = sorted((p.name, p.stat().st_mtime_ns) for p in [destination, *destination.glob("*")])
        err = convert_error(capsys, fit_checkpoint, destination, to)
        assert err == f"ijepa convert: error: destination {destination} exists; pass --overwrite to replace it."
        assert sorted((p.name, p.stat().st_mtime_ns) for p in [destination, *destination.glob("*")]) == written
        main(["convert", str(fit_checkpoint), str(destination), to, "--overwrite", "true"])
    # a file where a folder is written (or the reverse) is refused even with --overwrite
    err = convert_error(capsys, fit_checkpoint, tmp_path / "w.ckpt", "hf", "--overwrite", "true")
    assert f"destination {tmp_path / 'w.ckpt'} is a file; hf writes a folder" in err
    err = convert_error(capsys, fit_checkpoint, tmp_path / "hf", "official", "--overwrite", "true")
    assert f"destination {tmp_path / 'hf'} is a folder; official writes a file" in err


def test_ijepa_convert_never_writes_onto_its_source_even_with_overwrite(tmp_path, capsys, fit_checkpoint):
    original = fit_checkpoint.read_bytes()
    link, hard = tmp_path / "link.ckpt", tmp_path / "hard.ckpt"
    link.symlink_to(fit_checkpoint)
    os.link(fit_checkpoint, hard)
    main(["convert", str(fit_checkpoint), str(tmp_path / "hf"), "hf"])
    for source, destination, to in (
        (fit_checkpoint, fit_checkpoint, "ckpt"),
        (fit_checkpoint, link, "ckpt"),
        (link, hard, "official"),
        (tmp_path / "hf", tmp_path / "hf", "hf"),
    ):
        for overwrite in ("false", "true"):
            err = convert_error(capsys, source, destination, to, "--overwrite", overwrite)
            assert f"destination {destination} is the source {source}" in err
    assert fit_checkpoint.read_bytes() == original


def test_ijepa_convert_names_each_unreadable_source_in_one_line(tmp_path, capsys, fit_checkpoint):
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(fit_checkpoint.read_bytes()[: fit_checkpoint.stat().st_size // 2])
    picture = tmp_path / "picture.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    empty = tmp_path / "empty.pth.tar"
    empty.write_bytes(b"")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(1)}, other)
    for source in (truncated, picture, empty):
        err = convert_error(capsys, source, tmp_path / "out", "hf")
        assert err.startswith(f"ijepa convert: error: {source} is not a readable PyTorch checkpoint"), err
    err = convert_error(capsys, other, tmp_path / "out", "hf")
    assert f"{other} is neither an ijepa Lightning checkpoint" in err and "nor an official" in err
    err = convert_error(capsys, tmp_path / "missing.ckpt", tmp_path / "out", "hf")
    assert "does not exist" in err and "missing.ckpt" in err

    def hf_folder(name: str) -> Path:
        folder = tmp_path / name
        save_hf(trained_encoder("learned"), folder)
        return folder

    not_json = hf_folder("not_json")
    (not_json / "config.json").write_text("{hidden_size: 32")
    no_weights = hf_folder("no_weights")
    (no_weights / "model.safetensors").unlink()
    bad_weights = hf_folder("bad_weights")
    (bad_weights / "model.safetensors").write_bytes(b"not safetensors")
    no_sizes = hf_folder("no_sizes")
    (no_sizes / "config.json").write_text(json.dumps({"model_type": "ijepa"}))
    for source, expected in (
        (not_json, f"{not_json / 'config.json'} is not JSON"),
        (no_weights, f"{no_weights} holds no model.safetensors"),
        (bad_weights, f"{bad_weights / 'model.safetensors'} is not a readable safetensors file"),
        (no_sizes, f"{no_sizes / 'config.json'} lacks ['hidden_size'"),
        (tmp_path, f"{tmp_path} is a folder without config.json"),
    ):
        assert expected in convert_error(capsys, source, tmp_path / "out.ckpt", "ckpt"), expected


def test_the_hf_preprocessor_is_the_evaluation_transform(tmp_path, fit_checkpoint):
    from PIL import Image
    from torchvision.transforms import v2
    from transformers import AutoImageProcessor

    from ijepa.data import IJEPADataModule
    from ijepa.data.transforms import ResizeCentreCrop, ToNormalizedFloat

    main(["convert", str(fit_checkpoint), str(tmp_path / "hf"), "hf"])
    size = TINY_MODEL["image_size"]
    steps = {type(step): step for step in IJEPADataModule(image_size=size).eval_transform().transforms}
    resize, crop = steps[ResizeCentreCrop].resize, steps[ResizeCentreCrop].crop
    mean, std = steps[ToNormalizedFloat].mean_std
    written = json.loads((tmp_path / "hf" / "preprocessor_config.json").read_text())
    assert written["size"] == {"shortest_edge": resize.size[0]} and written["do_center_crop"]
    assert written["crop_size"] == {"height": crop.size[0], "width": crop.size[1]}
    assert written["resample"] == 2 and v2.InterpolationMode(resize.interpolation) == v2.InterpolationMode.BILINEAR
    assert (written["image_mean"], written["image_std"]) == (list(mean), list(std))
    # a 32 x 48 picture: resized (to itself) and centre-cropped by both, where squashing would not crop
    pixels = torch.randint(0, 256, (size, size * 3 // 2, 3), dtype=torch.uint8, generator=torch.Generator())
    picture = Image.fromarray(pixels.numpy())
    processor = AutoImageProcessor.from_pretrained(tmp_path / "hf")
    ours = IJEPADataModule(image_size=size).eval_transform()(picture)
    theirs = processor(images=picture, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
