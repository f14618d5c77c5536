"""Drive the real ``ijepa`` command end to end in a temporary folder."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY_CONFIG, tiny_datamodule
from helpers import write_stl10
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ijepa.callbacks import rankme
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

CONFIG = TINY_CONFIG


def run_cli(*args, cwd):
    env = dict(os.environ, PYTHONWARNINGS="ignore")  # OMP_NUM_THREADS: conftest.THREADS
    result = subprocess.run(
        [sys.executable, "-m", "ijepa", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def scalars(log_dir, tag):
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("run")
    output = run_cli("fit", "--config", str(CONFIG), cwd=cwd)
    return cwd, output


def test_fit_writes_checkpoint_events_and_learns(fitted_run):
    cwd, output = fitted_run
    version = cwd / "lightning_logs" / "version_0"
    checkpoints = sorted((version / "checkpoints").glob("*.ckpt"))
    assert any(c.name == "last.ckpt" for c in checkpoints), checkpoints
    assert (version / "config.yaml").is_file()
    assert list(version.glob("events.out.tfevents.*"))

    losses = [v for _, v in scalars(version, "train/loss")]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)

    for tag in ("train/lr", "train/weight_decay", "train/ema_momentum", "val/loss", "val/target_std", "val/rankme"):
        assert scalars(version, tag), tag
    knn = scalars(version, "val/knn_top1")
    assert knn[0][0] == 0, "the random-init probe is logged at step 0"
    # then after each of the two epochs (Lightning logs validation at the last training step index)
    assert [step for step, _ in knn] == [0, 19, 39]
    assert all(0.0 <= v <= 1.0 for _, v in knn)
    assert "val/knn_top1" in output and "random init" in output
    # ViT Figure 7 of the (sin-cos) position tables, at each validation
    acc = EventAccumulator(str(version), size_guidance={"images": 0})
    acc.Reload()
    assert {"positions/encoder", "positions/predictor", "jepa/masks", "jepa/loss_map"} <= set(acc.Tags()["images"])
    assert len(acc.Images("positions/encoder")) == 2


def test_checkpoint_loads_under_weights_only(fitted_run):
    cwd, _ = fitted_run
    checkpoint = torch.load(cwd / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 40
    state = checkpoint["state_dict"]
    assert any(k.startswith("target_encoder.") for k in state)
    assert checkpoint["hyper_parameters"]["embed_dim"] == 32
    # the target encoder moved away from the online encoder by EMA, but not to it
    key = "encoder.patch_embed.proj.weight"
    assert not torch.equal(state[key], state["target_" + key])


def test_validate_from_checkpoint_reports_knn(fitted_run):
    cwd, _ = fitted_run
    ckpt = cwd / "lightning_logs/version_0/checkpoints/last.ckpt"
    output = run_cli("validate", "--config", str(CONFIG), "--ckpt_path", str(ckpt), cwd=cwd)
    assert "val/knn_top1" in output and "val/loss" in output


def test_fit_and_validate_on_stl10_binary_layout(tmp_path):
    """The stl10 path end to end through the CLI, on a tiny folder in STL-10's binary layout."""
    write_stl10(tmp_path / "data")
    stl_args = [
        "--data.source=ijepa.data.STL10Source",
        f"--data.source.root={tmp_path / 'data'}",
        "--data.source.download=false",
        "--data.image_size=96",
        "--data.batch_size=10",
        "--data.masks.init_args.min_keep=4",
        "--data.masks.init_args.target_scale=[0.15, 0.2]",
        "--trainer.max_steps=4",
    ]
    output = run_cli("fit", "--config", str(CONFIG), *stl_args, cwd=tmp_path)
    assert "random init" in output
    version = tmp_path / "lightning_logs" / "version_0"
    assert len(scalars(version, "train/loss")) == 4
    assert scalars(version, "val/knn_top1")
    ckpt = version / "checkpoints" / "last.ckpt"
    output = run_cli("validate", "--config", str(CONFIG), *stl_args, "--ckpt_path", str(ckpt), cwd=tmp_path)
    assert "val/knn_top1" in output


def test_test_and_predict_from_checkpoint(fitted_run):
    cwd, _ = fitted_run
    ckpt = cwd / "lightning_logs/version_0/checkpoints/last.ckpt"
    output = run_cli("test", "--config", str(CONFIG), "--ckpt_path", str(ckpt), cwd=cwd)
    assert "test/knn_top1" in output and "test/loss" in output

    out = cwd / "predicted"
    output = run_cli(
        "predict", "--config", str(CONFIG), "--ckpt_path", str(ckpt), f"--feature_writer.output_dir={out}", cwd=cwd
    )
    written = torch.load(out / "features.pt", weights_only=True)
    features, labels = written["features"], written["labels"]
    assert features.shape == (160, 32) and labels.shape == (160,)  # the held-out split, width 32
    assert torch.isfinite(features).all() and features.std(0).min() > 0
    assert str(out / "features.pt") in output

    data = tiny_datamodule(train_size=640, val_size=160)
    data.setup("predict")
    assert labels.tolist() == torch.cat([batch.labels for batch in data.predict_dataloader()]).tolist()


def test_sigreg_keeps_the_features_from_collapsing_dimensionally(tmp_path):
    """The same tiny run with and without SIGReg: RankMe of the online encoder's pooled features
    on held-out images ends higher with it (the target encoder, at EMA 0.996 over 80 steps, is
    still mostly its init; docs/training.md shows the quickstart's 600-step version)."""
    data = tiny_datamodule(train_size=640, val_size=160)
    data.setup("fit")
    images = torch.cat([batch.images for batch in data.probe_test_dataloader()])
    final = {}
    for name, extra in (
        ("plain", []),
        (
            "sigreg",
            [
                '--model.regularizers=[{"class_path": "ijepa.regularizers.SIGReg", "init_args": {"weight": 0.2, "tokens": 256}}]'
            ],
        ),
    ):
        cwd = tmp_path / name
        cwd.mkdir()
        run_cli("fit", "--config", str(CONFIG), "--trainer.max_steps=80", *extra, cwd=cwd)
        version = cwd / "lightning_logs" / "version_0"
        assert scalars(version, "val/rankme")[0][0] == 0  # the random-init reference, logged at step 0
        if name == "sigreg":
            assert scalars(version, "train/sigreg") and scalars(version, "train/jepa_loss")
        model = IJEPA.load_from_checkpoint(version / "checkpoints" / "last.ckpt", weights_only=True).eval()
        final[name] = float(rankme(model.features(images, encoder="online")))
    assert final["sigreg"] > 1.5 * final["plain"], final
