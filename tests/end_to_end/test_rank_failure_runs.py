"""A rank killed mid-run under DDP (two CPU processes, gloo): the other ends within seconds with a
message naming the last checkpoint, which is intact and resumes to the uninterrupted run's weights."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import TESTS

pytestmark = pytest.mark.slow

# checkpoints every 2 steps in a fixed folder; no probes (nothing but the steps and the saves)
OVERLAY = """
trainer:
  max_steps: 8
  check_val_every_n_epoch: 100
  logger: false
  callbacks:
    - class_path: ijepa.callbacks.EMATargetUpdate
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {folder}, every_n_train_steps: 2, save_last: true}}
data:
  source:
    class_path: ijepa.data.ShapesSource
    init_args: {{train_size: 192, val_size: 64}}
  batch_size: 32
"""


def ddp_fit(cwd, *extra):
    """``ijepa fit`` on two CPU processes in ``cwd``; the result once every process has closed its
    output (an orphaned rank keeps the pipes open), and the seconds that took."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "overlay.yaml").write_text(OVERLAY.format(folder=cwd / "ckpt"))
    args = [sys.executable, "-m", "ijepa", "fit", "--config", str(TESTS / "tiny.yaml"), "--config", "overlay.yaml"]
    args += ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(TESTS))
    start = time.perf_counter()
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return result, time.perf_counter() - start


def weights(path):
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def test_a_killed_rank_ends_the_other_with_the_checkpoint_to_resume_which_resumes_exactly(tmp_path):
    # rank 0 killed: the case no one else watches (Lightning's launcher watches rank 0's children,
    # and kills rank 0 when one of them fails; RankWatchdog then prints the same message on rank 0)
    killed = 0
    full, _ = ddp_fit(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]

    kill = json.dumps({"class_path": "ddp_checks.KillRank", "init_args": {"rank": killed, "step": 5}})
    broken, seconds = ddp_fit(tmp_path / "killed", f"--trainer.callbacks+={kill}")
    survivor = 1 - killed
    assert broken.returncode != 0
    expected = f"error: rank {survivor}: rank {killed} (pid "
    line = next((line for line in broken.stderr.splitlines() if line.startswith(expected)), None)
    assert line is not None, broken.stderr[-3000:]
    last = tmp_path / "killed" / "ckpt" / "last.ckpt"
    assert line.endswith(f"The last checkpoint, {last} (step 4), is intact: resume with --ckpt_path {last}.")
    # the survivor did not wait for a collective's timeout (30 minutes): it stopped at once
    assert seconds < 120, seconds

    resumed, _ = ddp_fit(tmp_path / "killed", f"--ckpt_path={last}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    end = weights(last)
    for name, value in weights(tmp_path / "full" / "ckpt" / "last.ckpt").items():
        assert torch.equal(end[name], value), name
