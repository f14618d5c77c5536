"""DDP on two CPU processes (gloo), through the real CLI: the command the README documents."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import TESTS, knn_of_checkpoint

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

DATA = ["--data.source.train_size=192", "--data.source.val_size=64", "--data.batch_size=32"]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ddp")
    report = cwd / "ddp.json"
    callback = json.dumps({"class_path": "ddp_checks.DDPChecks", "init_args": {"output": str(report)}})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(TESTS))
    args = [
        sys.executable,
        "-m",
        "ijepa",
        "fit",
        "--config",
        str(TESTS / "tiny.yaml"),
        *DATA,
        "--trainer.strategy=ddp",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.max_steps=6",
        # SIGReg all-reduces its statistic inside the step (tests/test_regularizers.py proves the math)
        '--model.regularizers=[{"class_path": "ijepa.regularizers.SIGReg", "init_args": {"weight": 0.05, "tokens": 64}}]',
        f"--trainer.callbacks+={callback}",
    ]
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return cwd, json.loads(report.read_text()), result.stdout + result.stderr


def test_ranks_see_different_data_and_stay_in_sync(ddp_run):
    _, report, _ = ddp_run
    assert report["world_size"] == 2 and report["steps"] == 6
    assert all(report["images_differ"]) and all(report["masks_differ"])  # each rank its own share and masks
    assert len(report["online_equal"]) == 6
    assert all(report["online_equal"])  # gradients were all-reduced: identical updates
    assert all(report["target_equal"])  # EMA of identical encoders: bit-identical targets


def test_knn_probe_gathers_from_every_rank_and_matches_one_process(ddp_run, tmp_path):
    cwd, report, _ = ddp_run
    # each rank encoded half of the bank (192) and queries (64) at each of the 3 probes (step 0
    # and two validations): 3 * 128, where a probe that ran everything on every rank would be 3 * 256
    assert report["encoded_per_rank"] == [3 * 128, 3 * 128]
    knn = knn_of_checkpoint(cwd / "lightning_logs/version_0/checkpoints/last.ckpt", tmp_path)
    assert knn == pytest.approx(report["knn_top1"], abs=1e-6)
    assert torch.isfinite(torch.tensor(report["val_loss"]))
