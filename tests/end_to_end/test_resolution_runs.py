"""The CLI across resolutions: a checkpoint trained at one image size runs at another, and
``ijepa fit`` trains across patch sizes (FlexiViT) and on packed native-resolution batches.

In-process (``IJEPACLI(args=...)``) rather than a subprocess per run, to stay inside the
suite's time budget; ``test_cli_runs.py`` covers the real console entry point.
"""

import json
import logging
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import ROOT, TINY_CONFIG

from ijepa.cli import IJEPACLI
from ijepa.data import IJEPADataModule
from ijepa.module import IJEPA
from ijepa.nn import position_names

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

CONFIG = str(TINY_CONFIG)
SMALL_DATA = ["--data.source.train_size=96", "--data.source.val_size=40", "--trainer.max_steps=2"]


def run(*args):
    with mock.patch("sys.argv", ["ijepa"]):  # pytest's own arguments are not the CLI's
        cli = IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=list(args))
    return cli.trainer


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One 2-step checkpoint at 32 px per position type (same type in encoder and predictor)."""
    root = tmp_path_factory.mktemp("resolution")
    paths = {}
    for pos_embed in position_names(2):
        trainer = run(
            "fit",
            "--config",
            CONFIG,
            *SMALL_DATA,
            f"--model.pos_embed={pos_embed}",
            f"--model.predictor_pos_embed={pos_embed}",
            f"--trainer.default_root_dir={root / pos_embed}",
        )
        paths[pos_embed] = Path(trainer.checkpoint_callback.last_model_path)
    return paths


@pytest.mark.parametrize("pos_embed", position_names(2))
def test_validate_at_another_image_size_reports_knn(checkpoints, pos_embed, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    trainer = run(
        "validate",
        "--config",
        CONFIG,
        *SMALL_DATA,
        "--data.image_size=48",
        f"--ckpt_path={checkpoints[pos_embed]}",
        f"--trainer.default_root_dir={tmp_path}",
    )
    model = trainer.lightning_module
    assert model.hparams.image_size == 48 and model.hparams.pos_embed == pos_embed  # type from the checkpoint
    assert model.encoder.grid == (6, 6)
    knn = trainer.callback_metrics["val/knn_top1"]
    assert 0.0 <= float(knn) <= 1.0 and torch.isfinite(trainer.callback_metrics["val/loss"])
    adapted = "Checkpoint adapted from image_size=32, patch_size=8 (grid 4x4) to image_size=48" in caplog.text
    grid_sized = bool(model.encoder.position.state_resizers((4, 4)))  # learned, learned_2d, relative_bias
    assert adapted == grid_sized


def test_fit_continues_at_a_new_image_and_patch_size(checkpoints, tmp_path):
    # resume (optimizer moments resized with their parameters) at 48 px, then validate at patch 4
    ckpt = checkpoints["learned"]
    trainer = run(
        "fit",
        "--config",
        CONFIG,
        *SMALL_DATA,
        "--data.image_size=48",
        "--trainer.max_steps=4",
        f"--ckpt_path={ckpt}",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert trainer.global_step == 4
    table = trainer.lightning_module.encoder.transformer.position.embedding.weight
    assert table.shape == (36, 32)
    moments = trainer.optimizers[0].state[table]
    assert moments["exp_avg"].shape == (36, 32)
    trainer = run(
        "validate",
        "--config",
        CONFIG,
        *SMALL_DATA,
        "--model.patch_size=4",
        f"--ckpt_path={trainer.checkpoint_callback.last_model_path}",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert trainer.lightning_module.encoder.patch_embed.proj.weight.shape == (32, 3, 4, 4)
    assert "val/knn_top1" in trainer.callback_metrics


def test_init_checkpoint_starts_a_new_run_from_weights_at_another_resolution(checkpoints, tmp_path):
    ckpt = checkpoints["learned_2d"]
    callback = (
        '{"class_path": "ijepa.callbacks.PositionEmbeddingInterpolation", '
        f'"init_args": {{"init_checkpoint": "{ckpt}", "mode": "bilinear"}}}}'
    )
    trainer = run(
        "fit",
        "--config",
        CONFIG,
        *SMALL_DATA,
        "--data.image_size=48",
        "--model.pos_embed=learned_2d",
        "--model.predictor_pos_embed=learned_2d",
        f"--trainer.callbacks+={callback}",
        "--trainer.max_steps=1",
        f"--trainer.default_root_dir={tmp_path}",
    )
    model = trainer.lightning_module
    assert model.position_interpolation == {"mode": "bilinear", "antialias": False}
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    # a parameter the grid does not touch started from the checkpoint (one optimizer step away)
    key = "target_encoder.transformer.blocks.0.attn.qkv.weight"
    start = saved[key]
    now = model.state_dict()[key]
    assert (now - start).abs().max() < 1e-2
    assert model.encoder.transformer.position.row.shape == (6, 32)


def test_resolution_study_script_matches_the_cli_probe(checkpoints, tmp_path):
    from ijepa.studies.resolution import main

    paths = [str(checkpoints["learned"]), str(checkpoints["rope_axial"])]
    results = main([*paths, "--image-sizes", "32", "48", "--patch-sizes", "16", "--output", str(tmp_path / "r.json")])
    assert set(results) == {"learned", "rope_axial"} and set(results["learned"]) == {32, 48}
    trainer = run(
        "validate",
        "--config",
        CONFIG,
        *SMALL_DATA,
        "--data.image_size=48",
        f"--ckpt_path={paths[0]}",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert results["learned"][48][0] == pytest.approx(float(trainer.callback_metrics["val/knn_top1"]), abs=1e-6)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["patch_resize_error"]["16"] < 1e-5  # upsampling the patch is exact


@pytest.mark.parametrize("pos_embed", ["learned", "relative_bias"])
def test_load_from_checkpoint_at_another_size(checkpoints, pos_embed):
    # load_from_checkpoint overwrites the saved hyperparameters with its keyword arguments; the
    # training grid comes from the checkpoint's "resolution" record instead
    model = IJEPA.load_from_checkpoint(checkpoints[pos_embed], weights_only=True, image_size=64, patch_size=4)
    assert model.encoder.grid == (16, 16)
    assert model.features(torch.randn(2, 3, 64, 64)).shape == (2, 32)


def test_ijepa_fit_trains_across_patch_sizes(tmp_path):
    args = ["fit", "--config", str(TINY_CONFIG), "--data.source.train_size=96", "--data.source.val_size=40"]
    args += ["--data.train_patch_sizes=[4, 8]", "--trainer.max_steps=6", f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)
    assert cli.trainer.global_step == 6
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


@pytest.mark.parametrize("overlay", ["native_resolution.yaml", "flexivit.yaml"])
def test_the_resolution_flexible_configs_train(tmp_path, overlay):
    args = [
        "fit",
        "--config",
        str(ROOT / "configs" / "quickstart.yaml"),
        "--config",
        str(ROOT / "configs" / "resolution" / overlay),
    ]
    args += ["--data.source.train_size=256", "--data.source.val_size=64", "--data.batch_size=32"]
    args += ["--trainer.max_steps=8", "--trainer.check_val_every_n_epoch=1", f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)
    assert cli.trainer.global_step == 8
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and torch.isfinite(metrics["val/loss"])
    assert "val/rankme" in metrics  # the collapse monitor reads the packed validation batches


def test_ijepa_fit_trains_on_packed_native_resolution_batches(tmp_path):
    args = ["fit", "--config", str(TINY_CONFIG), "--data.source.train_size=96", "--data.source.val_size=40"]
    args += ["--data.native_sides=[3, 4]", "--data.token_drop=0.2", "--model.pos_embed=rope_axial"]
    args += ["--trainer.max_steps=4", f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)
    assert cli.trainer.global_step == 4
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_resolution_eval_study_evaluates_every_encoding_at_every_size(checkpoints, tmp_path):
    from PIL import Image

    from ijepa.data.sources import ShapesSource
    from ijepa.evaluation import EvalData, Evaluation, KNNProtocol
    from ijepa.studies.resolution_eval import main

    config = tmp_path / "eval.yaml"
    config.write_text(
        "data:\n  source:\n    class_path: ijepa.data.ShapesSource\n    init_args: {train_size: 160, val_size: 60}\n"
        "  batch_size: 32\n  num_workers: 0\n  val_fraction: 0.2\nprotocols:\n"
        "  - class_path: ijepa.evaluation.KNNProtocol\n    init_args: {ks: [5]}\n"
        "  - class_path: ijepa.evaluation.LogRegProtocol\n    init_args: {Cs: [1.0]}\n"
    )
    paths = [str(checkpoints["learned"]), str(checkpoints["rope_axial"])]
    scores = main(
        [*paths, "--config", str(config), "--scales", "0.5", "1", "1.5", "--output-dir", str(tmp_path / "runs")]
        + ["--output", str(tmp_path / "r.json"), "--figure", str(tmp_path / "r.png")]
    )
    assert set(scores) == {"knn", "logreg"}
    for protocol in scores.values():
        assert set(protocol) == {"learned", "rope_axial"}
        assert all(set(by_size) == {"16", "32", "48"} for by_size in protocol.values())
    assert json.loads((tmp_path / "r.json").read_text())["scores"] == scores
    assert Image.open(tmp_path / "r.png").size[0] > 0
    assert (
        main(["--merge", str(tmp_path / "r.json"), str(tmp_path / "r.json")])["knn"]["learned"]["48"]
        == [scores["knn"]["learned"]["48"][0]] * 2
    )  # two files side by side: every score twice
    # each figure is what ijepa eval prints for that checkpoint at that size
    data = EvalData(ShapesSource(train_size=160, val_size=60), 48, batch_size=32, num_workers=0, val_fraction=0.2)
    alone = Evaluation(paths[0], [KNNProtocol(ks=[5])], data=data, output_dir=str(tmp_path / "alone"), cache=False)
    assert alone.run()[0]["test_top1"] == scores["knn"]["learned"]["48"][0]
