"""`ijepa submit` running its fits: a local sweep, a local job at its time limit, and a SLURM requeue
that resumes bit-identical."""

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import TESTS, TINY_CONFIG
from helpers import fake_commands

from ijepa.cli import main

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them


# The EMA and the k-NN probe on less data: what the sweep's table and the requeue test need, at the least cost.
PROBED = """
trainer:
  max_steps: 4
  callbacks:
    - class_path: ijepa.callbacks.EMATargetUpdate
    - class_path: ijepa.callbacks.KNNProbe
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true}
data:
  source:
    class_path: ijepa.data.ShapesSource
    init_args: {train_size: 128, val_size: 64}
"""


# What SLURM sets for a job of one task (srun inside sbatch).
SLURM_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "ijepa",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NODELIST": "localhost",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


def test_a_local_two_point_sweep_runs_each_point_in_its_own_folder_and_its_table_lists_their_knn(tmp_path, capsys):
    config = tmp_path / "probed.yaml"
    config.write_text(PROBED)
    folder = tmp_path / "sweep"
    points = tmp_path / "points.yaml"  # the third parses, then its model refuses start_lr above lr
    points.write_text("- {model.lr: 1.0e-3}\n- {model.lr: 2.0e-3}\n- {model.start_lr: 1.0}\n")
    with mock.patch.dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"), pytest.raises(SystemExit) as exit:
        main(
            ["submit", "--executor", "local", "--folder", str(folder), "--sweep-file", str(points)]
            + ["--", "fit", "--config", str(TINY_CONFIG), "--config", str(config)]
        )
    assert exit.value.code == 1 and "error: 1 run(s) failed: 002" in capsys.readouterr().err
    main(["submit", "--table", str(folder)])
    printed = capsys.readouterr().out
    with open(folder / "sweep_table.csv") as f:
        table = list(csv.DictReader(f))
    assert [(row["overrides"], row["state"]) for row in table] == [
        ("model.lr=0.001", "completed"),
        ("model.lr=0.002", "completed"),
        ("model.start_lr=1.0", "failed"),
    ], printed
    assert table[2]["error"].startswith("model.optim.start_lr must be <= model.optim.lr"), printed
    table = table[:2]
    assert all(0 <= float(row["val/knn_top1"]) <= 1 for row in table), printed
    assert printed.splitlines()[0].startswith("| run | job | overrides | state |") and "val/knn_top1" in printed
    assert (folder / "sweep_table.md").read_text().strip() == printed.strip()
    # each point trained in its own folder, with its own learning rate
    ends = [torch.load(next((folder / "runs" / run).rglob("last.ckpt")), weights_only=True) for run in ("000", "001")]
    assert [end["hyper_parameters"]["optim"]["lr"] for end in ends] == [1e-3, 2e-3]
    assert [end["global_step"] for end in ends] == [4, 4]


def test_a_local_job_at_its_time_limit_saves_preempted_ckpt_the_table_says_timed_out_and_submit_exits_1(
    tmp_path, capsys
):
    # submitit's local executor signals the job --signal-delay seconds before --time: here 30 s in
    folder = tmp_path / "sweep"
    args = ["submit", "--executor", "local", "--time", "1", "--signal-delay", "30", "--folder", str(folder)]
    fit = ["fit", "--config", str(TINY_CONFIG), "--trainer.max_steps=100000", "--trainer.check_val_every_n_epoch=1000"]
    with mock.patch.dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"), pytest.raises(SystemExit) as exit:
        main([*args, "--", *fit])
    err = capsys.readouterr().err
    assert exit.value.code == 1 and "error: 1 run(s) timed out: 000" in err, err
    with open(folder / "sweep_table.csv") as f:
        (row,) = csv.DictReader(f)
    saved = folder / "runs" / "000" / "lightning_logs" / "version_0" / "checkpoints" / "preempted.ckpt"
    assert row["state"] == "timed out" and row["error"].endswith(f"resume with --ckpt_path {saved}"), row
    checkpoint = torch.load(saved, weights_only=True)
    assert 0 < checkpoint["global_step"] < 100000


def _fit(folder: Path, steps: int, env: dict, *args: str) -> subprocess.Popen:
    (folder.parent / "probed.yaml").write_text(PROBED)
    command = [sys.executable, "-m", "ijepa", "fit", "--config", str(TINY_CONFIG), "--config", "../probed.yaml"]
    command += [f"--trainer.default_root_dir={folder}", "--trainer.check_val_every_n_epoch=100"]
    command += [f"--trainer.max_steps={steps}", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(TESTS), **env)
    log = open(folder / "fit.log", "a")
    return subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_sigusr1_under_slurm_saves_and_requeues_and_the_requeued_job_resumes_bit_identical(tmp_path):
    steps = 12  # 4 batches an epoch
    # scontrol records its arguments and, as SLURM does to a requeued running job, sends SIGTERM
    calls = tmp_path / "scontrol.log"
    path = fake_commands(tmp_path / "bin", scontrol=f'echo "$@" >> {calls}\nkill -TERM $PPID\n')
    slurm = dict(SLURM_TASK, PATH=path)
    (tmp_path / "run").mkdir()
    (tmp_path / "straight").mkdir()
    # SIGUSR1 at the end of step 5; the resumed job starts past it, so the same command signals once
    signal_at_5 = json.dumps(
        {"class_path": "ddp_checks.SignalSelf", "init_args": {"signum": signal.SIGUSR1, "step": 5}}
    )
    run = _fit(tmp_path / "run", steps, slurm, f"--trainer.callbacks+={signal_at_5}")
    straight = _fit(tmp_path / "straight", steps, {})
    log = tmp_path / "run" / "fit.log"
    assert run.wait(timeout=300) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert calls.read_text() == "requeue 4242\n"
    saved = torch.load(tmp_path / "run" / "hpc_ckpt_1.ckpt", weights_only=True)
    # saved in step 5's on_train_batch_end: the CLI's StepBoundaryRequeue comes after the config's callbacks
    assert saved["global_step"] == 5, saved["global_step"]

    # The requeued job: the same command and environment, resumed from the hpc checkpoint.
    requeued = _fit(tmp_path / "run", steps, slurm, f"--trainer.callbacks+={signal_at_5}")
    assert requeued.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert straight.wait(timeout=300) == 0
    assert f"Restoring states from the checkpoint path at {tmp_path / 'run' / 'hpc_ckpt_1.ckpt'}" in log.read_text()
    assert calls.read_text() == "requeue 4242\n"  # no second requeue
    ends = [
        torch.load(max((tmp_path / name).rglob("last.ckpt"), key=os.path.getmtime), weights_only=True)
        for name in ("run", "straight")
    ]
    assert ends[0]["global_step"] == ends[1]["global_step"] == steps
    for key, value in ends[1]["state_dict"].items():
        assert torch.equal(ends[0]["state_dict"][key], value), key
