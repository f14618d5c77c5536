"""Run-level faults of docs/reliability.md that need whole runs: divergence and SIGTERM."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TESTS, TINY_CONFIG, TINY_MODEL
from helpers import cli, every_step_config

from ijepa.checkpoint import estimated_checkpoint_bytes
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

CONFIG = str(TINY_CONFIG)


def non_finite_tensors(path):
    state = torch.load(path, weights_only=True, map_location="cpu")["state_dict"]
    return [name for name, value in state.items() if not torch.isfinite(value).all()]


def test_a_diverging_run_names_a_checkpoint_from_before_the_divergence_that_resumes_at_a_lower_lr(tmp_path):
    # lr 1e3 on the tiny model: the loss stays finite for a few steps while the update turns the
    # weights into NaN. The old guard only checked the loss, so the NaN state was saved (and the
    # save deleted the last finite checkpoint). Then it named the newest finite checkpoint, which
    # already held the diverged state: resumed at a lower lr, or at lr 0, its next step was NaN.
    folder = tmp_path / "ckpt"
    with pytest.raises(FloatingPointError, match=r"non-finite .* at step \d+") as error:
        cli(
            "fit",
            "--config",
            CONFIG,
            "--config",
            every_step_config(tmp_path, folder),
            "--model.optim.lr=1e3",
            "--trainer.max_steps=12",
            "--trainer.check_val_every_n_epoch=100",
            f"--trainer.default_root_dir={tmp_path}",
        )
    saved = sorted(folder.glob("*.ckpt"))
    assert saved, "the finite checkpoints written before the divergence must survive"
    for path in saved:
        assert non_finite_tensors(path) == [], path
    message = str(error.value)
    named, step = re.search(r"Resume from the checkpoint before the newest, (\S+) \(step (\d+)\)", message).groups()
    newest = re.search(r"; the newest, (\S+) \(step (\d+)\)", message).groups()
    assert named == str(folder / "previous-last.ckpt") and newest[0] == str(folder / "last.ckpt")
    assert int(step) < int(newest[1]) == torch.load(newest[0], weights_only=True)["global_step"]
    assert torch.load(named, weights_only=True)["global_step"] == int(step)
    # The free-space check at fit start does not underestimate what a save writes.
    assert Path(newest[0]).stat().st_size <= estimated_checkpoint_bytes(IJEPA(**TINY_MODEL))

    # The named checkpoint, resumed at the config's own lr, trains on to finite weights.
    resumed = cli(
        "fit",
        "--config",
        CONFIG,
        "--config",
        every_step_config(tmp_path, tmp_path / "resumed"),
        f"--ckpt_path={named}",
        "--model.optim.lr=2e-3",
        f"--trainer.max_steps={int(step) + 3}",
        "--trainer.check_val_every_n_epoch=100",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert resumed.trainer.global_step == int(step) + 3
    end = resumed.trainer.checkpoint_callback.last_model_path
    assert torch.load(end, weights_only=True)["global_step"] == int(step) + 3 and non_finite_tensors(end) == []


def _start_fit(tmp_path, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(TESTS))
    log = open(tmp_path / "fit.log", "w")
    command = [
        sys.executable,
        "-m",
        "ijepa",
        "fit",
        "--config",
        CONFIG,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.check_val_every_n_epoch=100",
        *args,
    ]
    return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_sigterm_saves_a_resumable_checkpoint_and_exits_non_zero(tmp_path):
    steps = 30  # one schedule for all three runs: its length is max_steps
    (tmp_path / "run").mkdir()
    # SIGTERM at the end of step 5, from the run's own process (no race with its first steps)
    sigterm_at_5 = json.dumps(
        {"class_path": "ddp_checks.SignalSelf", "init_args": {"signum": signal.SIGTERM, "step": 5}}
    )
    run = _start_fit(tmp_path / "run", f"--trainer.max_steps={steps}", f"--trainer.callbacks+={sigterm_at_5}")
    log = tmp_path / "run" / "fit.log"
    assert run.wait(timeout=300) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    saved = list((tmp_path / "run").rglob("preempted.ckpt"))
    assert len(saved) == 1, log.read_text()[-3000:]
    step = torch.load(saved[0], weights_only=True)["global_step"]
    assert step == 5, step  # Lightning stops before the next step
    assert f"--ckpt_path {saved[0]}" in log.read_text()

    # Resumed, it ends where an uninterrupted run ends, bit for bit.
    (tmp_path / "resumed").mkdir()
    (tmp_path / "straight").mkdir()
    resumed = _start_fit(tmp_path / "resumed", f"--ckpt_path={saved[0]}", f"--trainer.max_steps={steps}")
    straight = _start_fit(tmp_path / "straight", f"--trainer.max_steps={steps}")
    assert resumed.wait(timeout=300) == 0 and straight.wait(timeout=300) == 0
    ends = [
        torch.load(next((tmp_path / name).rglob("last.ckpt")), weights_only=True) for name in ("resumed", "straight")
    ]
    assert ends[0]["global_step"] == ends[1]["global_step"] == steps
    for key, value in ends[1]["state_dict"].items():
        assert torch.equal(ends[0]["state_dict"][key], value), key
