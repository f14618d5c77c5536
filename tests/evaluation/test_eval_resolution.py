"""``ijepa eval`` at another resolution: the encoder is adapted exactly as ``ijepa validate
--data.image_size ...`` adapts it (``IJEPA.load_from_checkpoint(path, image_size=...)``), the
results file says what was adapted, the feature cache keeps the sizes apart, and bad sizes are
one line naming the option."""

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.data.sources import ShapesSource
from ijepa.evaluation import EvalData, Evaluation, KNNProtocol, read_results
from ijepa.evaluation.encoders import open_encoder
from ijepa.evaluation.runner import main
from ijepa.interop import load_encoder, save_hf, save_lightning_checkpoint
from ijepa.module import IJEPA

SOURCE = {"train_size": 160, "val_size": 48}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Random-init tiny models (32 px, patches of 8) with three kinds of position encoding: a
    learned table (interpolated), sin-cos and RoPE (rebuilt for the new grid)."""
    folder = tmp_path_factory.mktemp("resolution")
    paths = {}
    for pos_embed in ("learned", "sincos", "rope_mixed"):
        torch.manual_seed(0)
        model = IJEPA(**{**TINY_MODEL, "pos_embed": pos_embed})
        paths[pos_embed] = save_lightning_checkpoint(model, folder / f"{pos_embed}.ckpt")
    return paths


def validated(path: Path, **sizes) -> IJEPA:
    """The model ``ijepa validate --data.image_size ...`` scores: Lightning's load at those sizes."""
    return IJEPA.load_from_checkpoint(str(path), map_location="cpu", **sizes).eval()


@pytest.mark.parametrize("pos_embed", ["learned", "sincos", "rope_mixed"])
def test_eval_at_twice_the_size_reads_the_features_validate_reads(checkpoints, pos_embed):
    encoder, _ = open_encoder(str(checkpoints[pos_embed]), image_size=64)
    model = validated(checkpoints[pos_embed], image_size=64)
    images = torch.randn(4, 3, 64, 64)
    assert torch.equal(encoder.block_means(images, 1)[:, 0], model.features(images))
    assert torch.equal(encoder.block_means(images, 2).flatten(1), model.features(images, last_blocks=2))
    assert torch.equal(encoder.tokens(images), model.token_features(images))
    assert encoder.image_size == 64 and encoder.adapted["evaluated"]["grid"] == [8, 8]
    assert encoder.adapted["trained"] == {"image_size": 32, "patch_size": 8, "grid": [4, 4]}
    # a learned table is interpolated (its tensors change); sin-cos and RoPE are rebuilt, nothing is stored
    changed = [line.split(":")[0] for line in encoder.adapted["changed"]]
    if pos_embed == "learned":
        assert "target_encoder.transformer.position.embedding.weight" in changed
    else:
        assert changed == []
    # the online encoder, on request, is the model's online encoder at that size
    online, _ = open_encoder(str(checkpoints[pos_embed]), "online", image_size=64)
    assert torch.equal(online.block_means(images, 1)[:, 0], model.features(images, encoder="online"))


def test_another_patch_size_resizes_the_kernel_as_validate_does(checkpoints):
    path = checkpoints["learned"]
    for sizes, side in (({"patch_size": 4}, 32), ({"image_size": 64, "patch_size": 16}, 64)):
        encoder, _ = open_encoder(str(path), image_size=sizes.get("image_size"), patch_size=sizes["patch_size"])
        model = validated(path, **sizes)
        images = torch.randn(3, 3, side, side)
        assert torch.equal(encoder.block_means(images, 1)[:, 0], model.features(images))
        assert (
            encoder.patch_size == sizes["patch_size"]
            and encoder.adapted["evaluated"]["patch_size"] == sizes["patch_size"]
        )
        kernel = "target_encoder.patch_embed.proj.weight"
        p = sizes["patch_size"]
        assert f"{kernel}: [32, 3, 8, 8] -> [32, 3, {p}, {p}]" in encoder.adapted["changed"]


def test_the_checkpoint_own_sizes_adapt_nothing(checkpoints):
    path = checkpoints["learned"]
    for sizes in ({}, {"image_size": 32}, {"image_size": 32, "patch_size": 8}):
        encoder, _ = open_encoder(str(path), **sizes)
        assert encoder.adapted is None
        images = torch.randn(2, 3, 32, 32)
        assert torch.equal(encoder.tokens(images), load_encoder(path)(images))


def test_an_evaluation_at_another_size_writes_the_adaptation_and_caches_apart(checkpoints, tmp_path):
    path, out = checkpoints["learned"], tmp_path / "out"

    def run(**sizes) -> dict:
        data = EvalData(ShapesSource(**SOURCE), batch_size=32, num_workers=0, val_fraction=0.2, **sizes)
        return Evaluation(str(path), [KNNProtocol(ks=[5])], data=data, output_dir=str(out), accelerator="cpu").run()[0]

    native = run()
    assert native["adapted"] is None and read_results(out / "knn.json")["adapted"] is None
    larger = run(image_size=64)
    written = read_results(out / "knn.json")
    assert written == json.loads(json.dumps(larger))
    assert written["adapted"]["trained"] == {"image_size": 32, "patch_size": 8, "grid": [4, 4]}
    assert written["adapted"]["evaluated"] == {"image_size": 64, "patch_size": 8, "grid": [8, 8]}
    assert written["adapted"]["interpolation"] == {"mode": "bicubic", "antialias": False}
    assert "target_encoder.transformer.position.embedding.weight: [16, 32] -> [64, 32]" in written["adapted"]["changed"]
    assert written["data"]["image_size"] == 64
    # another size, and another patch size at the same image size, are other features: never the cached ones
    assert len(larger["features"]["extracted"]) == 2
    finer = run(patch_size=4)
    assert finer["adapted"]["evaluated"] == {"image_size": 32, "patch_size": 4, "grid": [8, 8]}
    assert len(finer["features"]["extracted"]) == 2 and finer["features"]["reused"] == []
    again = run(image_size=64)
    assert again["features"]["extracted"] == [] and again["test_top1"] == larger["test_top1"]


def test_the_pixel_baseline_runs_at_any_size(tmp_path):
    data = EvalData(ShapesSource(**SOURCE), image_size=24, batch_size=32, num_workers=0, val_fraction=0.2)
    result = Evaluation("pixels", [KNNProtocol(ks=[5])], data=data, output_dir=str(tmp_path), accelerator="cpu").run()
    assert result[0]["adapted"] is None and result[0]["data"]["image_size"] == 24


def test_a_hugging_face_folder_is_evaluated_at_its_own_size_only(checkpoints, tmp_path):
    folder = save_hf(load_encoder(checkpoints["learned"]), tmp_path / "hf")
    assert open_encoder(str(folder), image_size=32)[0].adapted is None
    with pytest.raises(ValueError, match=r"^data.image_size=64: a Hugging Face folder is evaluated at its own size"):
        open_encoder(str(folder), image_size=64)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--data.image_size", "50"], "data.image_size=50 is not a multiple of the patch size 8"),
        (
            ["--data.patch_size", "5"],
            "data.image_size=32 (the checkpoint's) is not a multiple of the patch size 5",
        ),
        (["--data.image_size", "0"], "data.image_size must be >= 1, got 0."),
        (["--data.patch_size", "-8"], "data.patch_size must be >= 1, got -8."),
        (
            ["--data.patch_size", "4", "--checkpoint", "pixels", "--data.image_size", "32"],
            "data.patch_size adapts a checkpoint's encoder; the pixel baseline's patches are pixel_patch_size.",
        ),
        (["--data.num_frames", "4"], "data.num_frames=4 is for clip sources; data.source ShapesSource gives images."),
    ],
    ids=["size-not-a-multiple", "patch-does-not-divide", "zero-size", "negative-patch", "patch-for-pixels", "frames"],
)
def test_bad_sizes_are_one_line_naming_the_option(checkpoints, tmp_path, capsys, extra, expected):
    args = [
        "--checkpoint",
        str(checkpoints["sincos"]),
        "--output_dir",
        str(tmp_path),
        "--accelerator",
        "cpu",
        "--data.source",
        json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": SOURCE}),
        "--data.num_workers",
        "0",
        "--protocols",
        '[{"class_path": "ijepa.evaluation.KNNProtocol"}]',
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args + extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
