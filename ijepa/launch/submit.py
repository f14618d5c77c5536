"""``ijepa submit [options] -- fit --config CONFIG [overrides]``: one ``ijepa fit`` run, or a sweep
of them as one job array, on SLURM (``--executor slurm``) or on this machine (``--executor local``),
through ``submitit``; ``ijepa submit --table FOLDER`` prints a sweep's table.

Each run trains in its own ``trainer.default_root_dir`` (``FOLDER/runs/<index>``), so runs never
share checkpoints or logs; ``FOLDER/sweep.json`` lists the runs, ``FOLDER/logs`` holds each job's
output. Requeue is Lightning's (see :mod:`ijepa.launch.requeue`): SLURM sends ``SIGUSR1``
``--signal-delay`` seconds before the time limit; submitit's own requeue is switched off. A local
job gets submitit's time-out signal then, taken as SIGTERM on SLURM: ``preempted.ckpt``, and the
table says ``timed out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lightning.fabric.accelerators.cuda import num_cuda_devices

from ijepa.launch import table
from ijepa.launch.sweep import SweepError, override_args, parse_grid, read_sweep_file

INSTALL = "pip install -e '.[cluster]'"
RESUMABLE = ("hpc_ckpt_*.ckpt", "preempted.ckpt", "last.ckpt")
# Options of a SLURM job, and their defaults there; a local job runs on this machine as it is.
SLURM_ONLY = {"nodes": 1, "gpus_per_node": 1, "partition": None, "account": None}


class SubmitError(ValueError):
    """A submission that cannot go ahead; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ijepa submit",
        description="Submit `ijepa fit` runs (one, or a sweep as one job array) to SLURM or run them here.",
        epilog="e.g. ijepa submit --nodes 2 --gpus-per-node 8 --time 1440 --grid model.optim.lr=1e-3,3e-4 "
        "-- fit --config configs/stl10_vit_small.yaml",
    )
    parser.add_argument("--executor", choices=("slurm", "local"), default="slurm")
    parser.add_argument("--folder", help="the sweep's folder (default: sweeps/<date>-<time>)")
    parser.add_argument("--nodes", type=int, help="SLURM: nodes per job (default: 1)")
    parser.add_argument(
        "--gpus-per-node", type=int, help="SLURM: GPUs per node, also the tasks (processes) per node (default: 1)"
    )
    parser.add_argument("--time", type=int, default=60, help="time limit per job, minutes")
    parser.add_argument("--partition", help="SLURM: the partition")
    parser.add_argument("--account", help="SLURM: the account")
    parser.add_argument(
        "--signal-delay",
        type=int,
        help="seconds before the time limit the job is signalled: SLURM's SIGUSR1 (requeue), the local executor's "
        "time-out (a checkpoint, then the job stops); default: a quarter of --time, at most 120",
    )
    parser.add_argument("--grid", nargs="+", metavar="KEY=V1,V2", help="a grid of overrides (cartesian product)")
    parser.add_argument("--sweep-file", help="YAML/JSON: a mapping of lists (a grid) or a list of mappings (points)")
    parser.add_argument("--table", metavar="FOLDER", help="print the table of a sweep's runs and exit")
    return parser


def check_ranges(options: argparse.Namespace) -> None:
    """Refuse a value out of its range, or a SLURM option given to the local executor; then set
    the defaults of those not given (``--signal-delay``'s from ``--time``)."""
    for flag, value, low in (("--nodes", options.nodes, 1), ("--gpus-per-node", options.gpus_per_node, 0)):
        if value is not None and value < low:
            raise SubmitError(f"{flag} must be >= {low}, got {value}.")
    if options.executor == "local":
        given = [f"--{key.replace('_', '-')}" for key in SLURM_ONLY if getattr(options, key) is not None]
        if given:
            raise SubmitError(
                f"--executor local: {', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} of SLURM "
                "jobs; a local job runs on this machine as it is (its devices: --trainer.devices after `--`). "
                "Drop them, or submit with --executor slurm."
            )
    for key, default in SLURM_ONLY.items():
        if getattr(options, key) is None:
            setattr(options, key, default)
    if options.time < 1:
        raise SubmitError(f"--time must be >= 1 (minutes), got {options.time}.")
    if options.signal_delay is None:
        options.signal_delay = default_signal_delay(options.time)
    elif not 0 < options.signal_delay < 60 * options.time:
        raise SubmitError(
            f"--signal-delay must be in [1, {60 * options.time - 1}] seconds (under --time {options.time} minutes), "
            f"got {options.signal_delay}."
        )
    if options.grid and options.sweep_file:
        raise SubmitError("--grid and --sweep-file: give one of them.")


def default_signal_delay(minutes: int) -> int:
    """Seconds before the time limit a job is signalled unless ``--signal-delay`` says: 120, or a
    quarter of a shorter ``--time``."""
    return min(120, 15 * minutes)


def points(options: argparse.Namespace) -> list[dict[str, str]]:
    if options.grid:
        return parse_grid(options.grid)
    if options.sweep_file:
        return read_sweep_file(options.sweep_file)
    return [{}]


def fit_command(command: list[str]) -> list[str]:
    if not command:
        raise SubmitError(
            "ijepa submit: no command after `--`; give the run: ijepa submit [options] -- fit --config CONFIG [overrides]."
        )
    if command[0] != "fit":
        raise SubmitError(f"ijepa submit: the command after `--` must be `fit`, got {command[0]!r}.")
    return command[1:]


def has_option(args: list[str], key: str) -> bool:
    return any(arg == f"--{key}" or arg.startswith(f"--{key}=") for arg in args)


def newest_checkpoint(root: Path) -> Path | None:
    """The newest state a run left in its folder: Lightning's ``hpc_ckpt_*`` (the requeue signal),
    ``preempted.ckpt`` (SIGTERM: a preemption, or SLURM stopping the requeued job) or ``last.ckpt``."""
    found = [path for pattern in RESUMABLE for path in root.rglob(pattern)] if root.is_dir() else []
    return max(found, key=lambda path: path.stat().st_mtime_ns, default=None)


class FitJob:
    """What one job of the array runs: ``ijepa fit`` in this process, so that SLURM's signals
    reach Lightning. ``command`` is the ``ijepa`` command's ``main`` (the CLI passes its own: this
    package does not import the CLI, which imports it); pickled by reference, it is imported in
    the job. It has no ``checkpoint`` method, so submitit never requeues it itself.

    ``timeout_signal`` (the local executor's; SLURM's jobs get none): the signal submitit's local
    executor sends ``--signal-delay`` seconds before ``--time``, taken as SIGTERM on SLURM (Lightning
    stops at the step's end, ``PreemptionCheckpoint`` writes ``preempted.ckpt``); the job then ends
    in :class:`ijepa.launch.table.RunTimedOut`, which the table reads as ``timed out``."""

    def __init__(
        self, command: Callable[[list[str]], None], args: list[str], root: str, timeout_signal: int | None = None
    ):
        self.command, self.args, self.root, self.timeout_signal = command, args, root, timeout_signal
        self.timed_out = False

    def __call__(self) -> str:
        # submitit's requeue (its handler on SUBMITIT_PREEMPT_SIGNAL, USR2 by default) is off: the
        # requeue is Lightning's, on USR1, which Lightning only takes if no handler holds it.
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)
        if self.timeout_signal is not None:
            self._before_fit = signal.getsignal(signal.SIGTERM)  # submitit's, until Lightning's takes SIGTERM
            signal.signal(self.timeout_signal, self._time_out)
        args = ["fit", *self.resumed_args()]
        sys.argv = ["ijepa", *args]  # what the job is, for LightningCLI and for anyone reading the processes
        try:
            self.command(args)
        except SystemExit as error:
            if error.code == 128 + signal.SIGTERM:
                if self.timed_out:  # a local job at its time limit: over, and saved if it was training
                    raise table.RunTimedOut(self.timed_out_message()) from error
                if self.timeout_signal is not None:  # local: nothing requeues it, so it is over
                    raise RuntimeError("ijepa fit was stopped by SIGTERM (exit status 143)") from error
                raise  # stopped (preempted, or requeued): not over, so submitit writes no result
            if error.code not in (0, None):  # a failure submitit records as one (the table's `failed`)
                raise RuntimeError(f"ijepa fit exited with status {error.code}") from error
        return self.root

    def _time_out(self, signum, frame) -> None:
        self.timed_out = True
        if signal.getsignal(signal.SIGTERM) == self._before_fit:  # fit has not started training: nothing to save
            raise SystemExit(128 + signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # Lightning's handler: a checkpoint at the step's end, exit 143

    def timed_out_message(self) -> str:
        saved = newest_checkpoint(Path(self.root))
        where = f"resume with --ckpt_path {saved}" if saved is not None else "before training, nothing saved"
        return f"stopped at --time minus --signal-delay; {where}"

    def resumed_args(self) -> list[str]:
        """A requeued job (its folder holds a checkpoint) resumes from the newest checkpoint, also
        over a ``--ckpt_path`` the run started from."""
        newest = newest_checkpoint(Path(self.root))
        if newest is None:
            return list(self.args)
        args, skip = [], False
        for arg in self.args:
            if skip or arg.startswith("--ckpt_path="):
                skip = False
                continue
            skip = arg == "--ckpt_path"
            if not skip:
                args.append(arg)
        return [*args, f"--ckpt_path={newest}"]


def executor_for(options: argparse.Namespace, logs: Path):
    try:
        import submitit  # optional (the `cluster` extra): loaded by this command only
    except ImportError as error:
        raise SubmitError(f"ijepa submit needs submitit, which is not installed: {INSTALL}") from error
    if options.executor == "local":
        executor = submitit.LocalExecutor(folder=logs)
        executor.update_parameters(timeout_min=options.time, signal_delay_s=options.signal_delay, **local_gpus())
        return executor
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        raise SubmitError(
            "--executor slurm: no SLURM cluster is reachable from this machine (no `sbatch`/`srun` on PATH); "
            "submit from a SLURM login node, or run here with --executor local."
        )
    executor = submitit.SlurmExecutor(folder=logs)
    tasks = max(options.gpus_per_node, 1)
    parameters = dict(
        job_name="ijepa",
        nodes=options.nodes,
        ntasks_per_node=tasks,
        time=options.time,
        signal_delay_s=options.signal_delay,
        # USR1 (Lightning's requeue signal) instead of submitit's USR2; the job may be requeued
        additional_parameters={"signal": f"USR1@{options.signal_delay}", "requeue": True},
    )
    if options.gpus_per_node:
        parameters["gpus_per_node"] = options.gpus_per_node
    parameters |= {key: getattr(options, key) for key in ("partition", "account") if getattr(options, key)}
    executor.update_parameters(**parameters)
    return executor


def local_gpus() -> dict:
    """The local executor's GPU parameters that leave its jobs the GPUs this process sees
    (submitit sets ``CUDA_VISIBLE_DEVICES`` to the first ``gpus_per_node``, or to none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return {"gpus_per_node": num_cuda_devices()}
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if not all(entry.isdigit() for entry in entries):
        raise SubmitError(
            f"--executor local: CUDA_VISIBLE_DEVICES={visible} names GPUs by more than their index, which submitit's "
            "local executor cannot pass on to its jobs; set it to indices (e.g. 0,1)."
        )
    indices = tuple(int(entry) for entry in entries)
    return {"gpus_per_node": len(indices), "visible_gpus": indices}


def slurm_args(options: argparse.Namespace, args: list[str]) -> list[str]:
    """The process layout Lightning must agree with SLURM's (one process per task)."""
    extra = []
    if not has_option(args, "trainer.num_nodes"):
        extra.append(f"--trainer.num_nodes={options.nodes}")
    if options.gpus_per_node and not has_option(args, "trainer.devices"):
        extra.append(f"--trainer.devices={options.gpus_per_node}")
    return extra


def local_timeout_signal() -> int:
    """The signal submitit's local executor sends ``signal_delay_s`` before its time-out (USR2,
    unless ``SUBMITIT_PREEMPT_SIGNAL`` names another)."""
    import submitit  # optional, as in executor_for

    return int(getattr(signal, f"SIG{submitit.JobEnvironment.USR_SIG}"))


def submit(
    options: argparse.Namespace,
    command: list[str],
    fit: Callable[[list[str]], None],
    check: Callable[[list[str]], str | None] | None = None,
) -> Path:
    check_ranges(options)
    args = fit_command(command)
    runs = points(options)
    for index, point in enumerate(runs if check else ()):  # all of them, before any job is queued
        problem = check([*args, *override_args(point)])
        if problem:
            which = f"run {index:03d} ({' '.join(override_args(point))})" if point else "the run"
            raise SubmitError(f"{which}: ijepa fit would refuse it: {problem}; nothing was submitted.")
    folder = Path(options.folder or Path("sweeps") / time.strftime("%Y%m%d-%H%M%S")).absolute()
    if (folder / table.MANIFEST).exists():
        raise SubmitError(f"--folder {folder} already holds a sweep ({table.MANIFEST}); choose another folder.")
    executor = executor_for(options, folder / "logs")
    timeout_signal = local_timeout_signal() if options.executor == "local" else None
    if options.executor == "slurm":
        args = [*args, *slurm_args(options, args)]
    jobs, entries = [], []
    with executor.batch():  # one job array
        for index, point in enumerate(runs):
            root = folder / "runs" / f"{index:03d}"
            # the run's own folder comes last, so it wins over one in the command or the config
            run_args = [*args, *override_args(point), f"--trainer.default_root_dir={root}"]
            jobs.append(executor.submit(FitJob(fit, run_args, str(root), timeout_signal)))
            entries.append({"run": f"{index:03d}", "overrides": point, "root": str(root), "args": ["fit", *run_args]})
    for entry, job in zip(entries, jobs):
        entry |= {"job_id": job.job_id, "result": str(job.paths.result_pickle), "stdout": str(job.paths.stdout)}
    manifest = {"executor": options.executor, "command": ["fit", *args], "runs": entries}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / table.MANIFEST).write_text(json.dumps(manifest, indent=1))
    print(f"submitted {len(jobs)} run(s) ({options.executor}) to {folder}; jobs {', '.join(j.job_id for j in jobs)}")
    if options.executor == "local":  # the runs are this process's children: wait for them
        for job in jobs:
            job.wait()
    return folder


def main(
    argv: list[str], fit: Callable[[list[str]], None], check: Callable[[list[str]], str | None] | None = None
) -> None:
    """``ijepa submit ...``; ``fit`` is the ``ijepa`` command's ``main``, which runs each job, and
    ``check`` says why ``ijepa fit`` would refuse a run's arguments (None: it would not). With
    ``--executor local`` the command exits with status 1 when a run failed or timed out."""
    split = argv.index("--") if "--" in argv else len(argv)
    options = build_parser().parse_args(argv[:split])
    try:
        if options.table:
            print(table.write_table(Path(options.table)))
            return
        folder = submit(options, argv[split + 1 :], fit, check)
        if options.executor == "local":
            print(table.write_table(folder))
            ended = table.rows(folder)
            problems = [
                f"{len(runs)} run(s) {state}: {', '.join(runs)}"
                for state in ("failed", "timed out")
                if (runs := [row["run"] for row in ended if row["state"] == state])
            ]
            if problems:
                sys.stderr.write(f"error: {'; '.join(problems)} (each one's error or checkpoint in the table)\n")
                sys.exit(1)
        else:
            print(f"table: ijepa submit --table {folder}")
    except (SubmitError, SweepError, table.TableError) as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
