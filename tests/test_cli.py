"""Drive the real ``ijepa`` command end to end in a temporary folder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

CONFIG = Path(__file__).with_name("tiny.yaml")


def run_cli(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONWARNINGS="ignore")
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

    for tag in ("train/lr", "train/weight_decay", "train/ema_momentum", "val/loss"):
        assert scalars(version, tag), tag
    knn = scalars(version, "val/knn_top1")
    assert knn[0][0] == 0, "the random-init probe is logged at step 0"
    # then after each of the two epochs (Lightning logs validation at the last training step index)
    assert [step for step, _ in knn] == [0, 19, 39]
    assert all(0.0 <= v <= 1.0 for _, v in knn)
    assert "val/knn_top1" in output and "random init" in output


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
