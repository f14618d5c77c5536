"""``ijepa submit``: sweeps run through submitit, their table, and SLURM requeue through Lightning."""

import csv
import json
import os
import pickle
import signal
import sys
from unittest import mock

import pytest
from conftest import TINY_CONFIG
from helpers import fake_commands

from ijepa.cli import main
from ijepa.launch.submit import FitJob

CONFIG = str(TINY_CONFIG)  # a config that exists: submit parses every run's arguments first


def submit_error(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["submit", *args])
    assert exit.value.code == 2
    return capsys.readouterr().err


def test_a_slurm_sweep_is_one_job_array_with_the_resources_and_usr1_before_the_time_limit(tmp_path, capsys):
    # sbatch records the script it is given and answers as SLURM does; sacct does not exist here
    path = fake_commands(
        tmp_path / "bin",
        sbatch=f'cp "$1" {tmp_path}/job.sh\necho "Submitted batch job 777"\n',
        srun="exit 1\n",
    )
    points = tmp_path / "points.yaml"
    points.write_text("- {model.lr: 1.0e-3}\n- {model.lr: 3.0e-4, data.batch_size: 64}\n")
    folder = tmp_path / "sweep"
    args = ["--nodes", "2", "--gpus-per-node", "4", "--time", "30", "--partition", "gpu", "--account", "lab"]
    with mock.patch.dict(os.environ, PATH=path):
        main(["submit", *args, "--folder", str(folder), "--sweep-file", str(points), "--", "fit", "--config", CONFIG])
        capsys.readouterr()
        main(["submit", "--table", str(folder)])
    script = (tmp_path / "job.sh").read_text()
    for line in (
        "--array=0-1",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--time=30",
        "--partition=gpu",
        "--account=lab",
        "--signal=USR1@120",
        "--requeue",
    ):
        assert f"#SBATCH {line}" in script, line
    assert "USR2" not in script  # submitit's own requeue signal is not asked for
    runs = json.loads((folder / "sweep.json").read_text())["runs"]
    assert [run["job_id"] for run in runs] == ["777_0", "777_1"]
    assert [run["args"] for run in runs] == [
        ["fit", "--config", CONFIG, "--trainer.num_nodes=2", "--trainer.devices=4", "--model.lr=0.001"]
        + [f"--trainer.default_root_dir={folder / 'runs' / '000'}"],
        ["fit", "--config", CONFIG, "--trainer.num_nodes=2", "--trainer.devices=4", "--model.lr=0.0003"]
        + ["--data.batch_size=64", f"--trainer.default_root_dir={folder / 'runs' / '001'}"],
    ]
    with open(folder / "sweep_table.csv") as f:  # submitted, not started: no sacct here to ask
        assert [row["state"] for row in csv.DictReader(f)] == ["pending", "pending"]


def test_a_requeued_job_resumes_from_the_newest_checkpoint_of_its_folder_and_submitit_does_not_requeue(tmp_path):
    root = tmp_path / "run"
    seen = []

    def fit(args):
        seen.append((args, signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)))

    job = FitJob(fit, ["--config", CONFIG, "--ckpt_path", "start.ckpt"], str(root))
    previous = {signum: signal.signal(signum, lambda *_: None) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        with mock.patch("sys.argv", ["_submit.py"]):
            job()  # first start: the command as given
            (root / "lightning_logs" / "version_0" / "checkpoints").mkdir(parents=True)
            for index, name in enumerate(["lightning_logs/version_0/checkpoints/last.ckpt", "hpc_ckpt_1.ckpt"]):
                (root / name).write_bytes(b"")
                os.utime(root / name, ns=(index, index))
            job()  # requeued: the newest state its folder holds
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert [args for args, *_ in seen] == [
        ["fit", "--config", CONFIG, "--ckpt_path", "start.ckpt"],
        ["fit", "--config", CONFIG, f"--ckpt_path={root / 'hpc_ckpt_1.ckpt'}"],
    ]
    # Lightning installs its USR1 handler only where none is; submitit's on USR2 would requeue too
    assert all(usr1 == usr2 == signal.SIG_DFL for _, usr1, usr2 in seen)


def test_submit_without_submitit_names_the_extra_to_install(capsys):
    with mock.patch.dict(sys.modules, submitit=None):  # import submitit raises ImportError
        err = submit_error(capsys, "--executor", "local", "--", "fit", "--config", CONFIG)
    assert err == "error: ijepa submit needs submitit, which is not installed: pip install -e '.[cluster]'\n"


def test_submit_to_slurm_without_a_cluster_names_the_executor_flag_and_the_local_one(tmp_path, capsys):
    with mock.patch.dict(os.environ, PATH=str(tmp_path)):  # no sbatch, no srun
        err = submit_error(capsys, "--folder", str(tmp_path / "s"), "--", "fit", "--config", CONFIG)
    assert err.startswith("error: --executor slurm: no SLURM cluster is reachable from this machine")
    assert "--executor local" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "model.lr"], "error: --grid: 'model.lr' is not KEY=VALUE[,VALUE...] (e.g. model.lr=1e-3,3e-4)."),
        (["--grid", "model.lr=1e-3,"], "error: --grid: 'model.lr=1e-3,' is not KEY=VALUE[,VALUE...]"),
        (["--grid", "model.lr=1", "model.lr=2"], "error: --grid: model.lr is given twice"),
        (["--sweep-file", "missing.yaml"], "error: --sweep-file missing.yaml: no such file."),
        (["--nodes", "0"], "error: --nodes must be >= 1, got 0."),
        (["--time", "1", "--signal-delay", "60"], "error: --signal-delay must be in [1, 59] seconds"),
    ],
)
def test_a_bad_sweep_or_resource_is_one_line_naming_the_flag(args, message, capsys):
    err = submit_error(capsys, "--executor", "local", *args, "--", "fit", "--config", CONFIG)
    assert err.startswith(message) and len(err.splitlines()) == 1, err


def test_a_sweep_file_of_neither_shape_is_an_error_naming_it_and_both_shapes(tmp_path, capsys):
    sweep = tmp_path / "sweep.json"
    sweep.write_text('{"model.lr": 0.001}')
    err = submit_error(capsys, "--executor", "local", "--sweep-file", str(sweep), "--", "fit", "--config", CONFIG)
    assert err.startswith(f"error: --sweep-file {sweep}: must be a mapping of KEY: [values] (a grid) or a list")


@pytest.mark.parametrize("command", [[], ["--"], ["--", "validate", "--config", CONFIG]])
def test_submit_without_a_fit_command_says_how_to_give_one(command, capsys):
    err = submit_error(capsys, "--executor", "local", *command)
    assert err.startswith("error: ijepa submit: ") and "fit" in err and len(err.splitlines()) == 1, err


def test_a_table_of_a_folder_without_a_sweep_names_the_folder(tmp_path, capsys):
    err = submit_error(capsys, "--table", str(tmp_path))
    assert (
        err == f"error: --table {tmp_path}: no sweep here (no sweep.json; the folder given to ijepa submit --folder).\n"
    )


def test_the_table_tells_failed_running_and_pending_runs_from_the_files_they_left(tmp_path, capsys):
    runs = []
    for index, outcome in enumerate(["error", None, None]):
        root = tmp_path / "runs" / str(index)
        result = tmp_path / "logs" / f"{index}_result.pkl"
        result.parent.mkdir(exist_ok=True)
        if outcome:
            result.write_bytes(pickle.dumps((outcome, "Traceback ...\nRuntimeError: ijepa fit exited with status 2\n")))
        runs.append({"run": str(index), "job_id": str(index), "overrides": {"model.lr": index}, "root": str(root)})
        runs[-1] |= {"result": str(result), "stdout": str(tmp_path / "logs" / f"{index}_0_log.out")}
    # the failed job's stderr: the ijepa command's own line, among others
    (tmp_path / "logs" / "0_0_log.err").write_text("Seed set to 0\nerror: model: start_lr must be <= lr | see\nbye\n")
    # run 1 has started: a CSVLogger's metrics, the newest row of each val/* metric is the final one
    (tmp_path / "runs" / "1" / "csv").mkdir(parents=True)
    (tmp_path / "runs" / "1" / "csv" / "metrics.csv").write_text("step,val/knn_top1\n2,0.25\n4,0.5\n")
    (tmp_path / "sweep.json").write_text(json.dumps({"executor": "local", "runs": runs}))
    main(["submit", "--table", str(tmp_path)])
    with open(tmp_path / "sweep_table.csv") as f:
        table = [(row["state"], row["val/knn_top1"], row["error"]) for row in csv.DictReader(f)]
    assert table == [
        ("failed", "", "model: start_lr must be <= lr / see"),
        ("running", "0.5000", ""),
        ("pending", "", ""),
    ], capsys.readouterr().out
    (tmp_path / "logs" / "0_0_log.err").unlink()  # no stderr: the traceback's last line
    main(["submit", "--table", str(tmp_path)])
    assert "| RuntimeError: ijepa fit exited with status 2 |" in (tmp_path / "sweep_table.md").read_text()


def test_a_key_ijepa_fit_does_not_accept_is_refused_before_anything_is_submitted(tmp_path, capsys):
    folder = tmp_path / "sweep"
    err = submit_error(
        capsys,
        "--executor",
        "local",
        "--folder",
        str(folder),
        "--grid",
        "model.lr=1e-3",
        "model.lrr=2,3",
        "--",
        "fit",
        "--config",
        CONFIG,
    )
    assert err.startswith("error: run 000 (--model.lr=1e-3 --model.lrr=2): ijepa fit would refuse it: ")
    assert "model.lrr" in err and err.endswith("; nothing was submitted.\n") and not folder.exists()
    err = submit_error(capsys, "--executor", "local", "--folder", str(folder), "--", "fit", "--config", "nope.yaml")
    assert err.startswith("error: the run: ijepa fit would refuse it: ") and "nope.yaml" in err
