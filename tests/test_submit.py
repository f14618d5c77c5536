"""``ijepa submit``: sweeps run through submitit, their table, and SLURM requeue through Lightning."""

import csv
import json
import os
import pickle
import signal
import sys
import traceback
from unittest import mock

import pytest
from conftest import TINY_CONFIG
from helpers import fake_commands

from ijepa.cli import main
from ijepa.launch import submit as launcher
from ijepa.launch.submit import FitJob, build_parser, check_ranges, executor_for
from ijepa.launch.table import RunTimedOut

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
        (
            ["--grid", "model.lr"],
            "error: --grid: 'model.lr' is not KEY=VALUE[,VALUE...] (e.g. model.optim.lr=1e-3,3e-4).",
        ),
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


@pytest.mark.parametrize(
    "flag", [["--nodes", "2"], ["--gpus-per-node", "2"], ["--partition", "gpu"], ["--account", "lab"]]
)
def test_a_slurm_option_given_to_the_local_executor_is_refused_in_one_line_before_anything_is_submitted(
    flag, tmp_path, capsys
):
    def nothing_submitted(*args):
        raise AssertionError("a job was about to be submitted")

    with mock.patch.object(launcher, "executor_for", nothing_submitted):
        err = submit_error(capsys, "--executor", "local", "--folder", str(tmp_path / "s"), *flag, "--", "fit")
    assert err.startswith(f"error: --executor local: {flag[0]} is an option of SLURM jobs;"), err
    assert "--trainer.devices" in err and len(err.splitlines()) == 1 and not (tmp_path / "s").exists()


@pytest.mark.parametrize("time, delay", [(1, 15), (4, 60), (30, 120)])
def test_the_default_signal_delay_is_a_quarter_of_the_time_at_most_120_s_and_reaches_the_local_executor(
    time, delay, tmp_path
):
    options = build_parser().parse_args(["--executor", "local", "--time", str(time)])
    check_ranges(options)  # a delay the user did not give is never refused
    parameters = executor_for(options, tmp_path / "logs").parameters
    assert (parameters["timeout_min"], parameters["signal_delay_s"]) == (time, delay)
    given = build_parser().parse_args(["--executor", "local", "--time", "1", "--signal-delay", "50"])
    check_ranges(given)
    assert executor_for(given, tmp_path / "logs").parameters["signal_delay_s"] == 50


@pytest.mark.parametrize("visible, parameters", [(None, {"gpus_per_node": 0}), ("2,3", {"visible_gpus": (2, 3)})])
def test_a_local_job_sees_the_gpus_the_submitting_shell_sees(visible, parameters, tmp_path, monkeypatch):
    # submitit's local executor sets CUDA_VISIBLE_DEVICES to the first gpus_per_node GPUs (the old default: 1)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(launcher, "num_cuda_devices", lambda: 0)  # this machine: no GPU
    options = build_parser().parse_args(["--executor", "local"])
    check_ranges(options)
    given = executor_for(options, tmp_path / "logs").parameters
    assert {key: given.get(key) for key in parameters} == parameters
    assert given["gpus_per_node"] == (len(visible.split(",")) if visible else 0)


def lightning_fit(root, when: str):
    """A fit that, as Lightning does, takes SIGTERM once training starts and then stops at the
    step's end, PreemptionCheckpoint saving preempted.ckpt; the local time-out signal comes
    ``when`` (before training, or during)."""

    def fit(args):
        if when == "before training":
            os.kill(os.getpid(), signal.SIGUSR2)
            raise AssertionError("went on after the time-out")
        stop = []
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        try:
            os.kill(os.getpid(), signal.SIGUSR2)  # submitit's local time-out
            assert stop, "the time-out did not reach Lightning's SIGTERM handler"
            root.mkdir(parents=True, exist_ok=True)
            (root / "preempted.ckpt").write_bytes(b"")
            raise SystemExit(128 + signal.SIGTERM)  # what the ijepa command exits with then
        finally:
            signal.signal(signal.SIGTERM, previous)

    return fit


@pytest.mark.parametrize("when", ["during training", "before training"])
def test_a_local_job_at_its_time_limit_saves_as_on_sigterm_and_ends_timed_out(when, tmp_path):
    root = tmp_path / "run"
    job = FitJob(lightning_fit(root, when), ["--config", CONFIG], str(root), timeout_signal=signal.SIGUSR2)
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with mock.patch("sys.argv", ["_submit.py"]), pytest.raises(RunTimedOut) as ended:
            job()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    saved = f"resume with --ckpt_path {root / 'preempted.ckpt'}" if when == "during training" else "nothing saved"
    assert str(ended.value).startswith("stopped at --time minus --signal-delay;") and saved in str(ended.value)


def test_a_timed_out_local_run_is_timed_out_in_the_table_and_local_submit_exits_1(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = []
    for index, (outcome, error) in enumerate([("success", None), ("error", RunTimedOut("stopped at ...; resume"))]):
        root = tmp_path / "runs" / str(index)
        root.mkdir(parents=True)  # the run wrote to its folder: without a result it would be `running`
        try:
            raise RuntimeError("the job") if error is None else error
        except Exception:
            trace = traceback.format_exc()
        (logs / f"{index}_result.pkl").write_bytes(pickle.dumps((outcome, str(root) if error is None else trace)))
        runs.append({"run": f"00{index}", "job_id": str(index), "overrides": {}, "root": str(root)})
        runs[-1] |= {"result": str(logs / f"{index}_result.pkl"), "stdout": str(logs / f"{index}_0_log.out")}
    (tmp_path / "sweep.json").write_text(json.dumps({"executor": "local", "runs": runs}))
    with mock.patch.object(launcher, "submit", lambda *args: tmp_path), pytest.raises(SystemExit) as exit:
        main(["submit", "--executor", "local", "--", "fit", "--config", CONFIG])
    assert exit.value.code == 1
    assert capsys.readouterr().err == ("error: 1 run(s) timed out: 001 (each one's error or checkpoint in the table)\n")
    with open(tmp_path / "sweep_table.csv") as f:
        assert [(row["state"], row["error"]) for row in csv.DictReader(f)] == [
            ("completed", ""),
            ("timed out", "stopped at ...; resume"),
        ]
