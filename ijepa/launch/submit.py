"""``ijepa submit [options] -- fit --config CONFIG [overrides]``: one ``ijepa fit`` run, or a sweep
of them as one job array, on SLURM (``--executor slurm``) or on this machine (``--executor local``),
through ``submitit``; ``ijepa submit --table FOLDER`` prints a sweep's table.

Each run trains in its own ``trainer.default_root_dir`` (``FOLDER/runs/<index>``), so runs never
share checkpoints or logs; ``FOLDER/sweep.json`` lists the runs, ``FOLDER/logs`` holds each job's
output. Requeue is Lightning's (see :mod:`ijepa.launch.requeue`): SLURM sends ``SIGUSR1``
``--signal-delay`` seconds before the time limit; submitit's own requeue is switched off.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ijepa.launch import table
from ijepa.launch.sweep import SweepError, override_args, parse_grid, read_sweep_file

INSTALL = "pip install -e '.[cluster]'"
RESUMABLE = ("hpc_ckpt_*.ckpt", "preempted.ckpt", "last.ckpt")


class SubmitError(ValueError):
    """A submission that cannot go ahead; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ijepa submit",
        description="Submit `ijepa fit` runs (one, or a sweep as one job array) to SLURM or run them here.",
        epilog="e.g. ijepa submit --nodes 2 --gpus-per-node 8 --time 1440 --grid model.lr=1e-3,3e-4 "
        "-- fit --config configs/stl10_vit_small.yaml",
    )
    parser.add_argument("--executor", choices=("slurm", "local"), default="slurm")
    parser.add_argument("--folder", help="the sweep's folder (default: sweeps/<date>-<time>)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=1, help="also the tasks (processes) per node")
    parser.add_argument("--time", type=int, default=60, help="time limit per job, minutes")
    parser.add_argument("--partition")
    parser.add_argument("--account")
    parser.add_argument(
        "--signal-delay", type=int, default=120, help="seconds before the time limit SLURM sends SIGUSR1 (requeue)"
    )
    parser.add_argument("--grid", nargs="+", metavar="KEY=V1,V2", help="a grid of overrides (cartesian product)")
    parser.add_argument("--sweep-file", help="YAML/JSON: a mapping of lists (a grid) or a list of mappings (points)")
    parser.add_argument("--table", metavar="FOLDER", help="print the table of a sweep's runs and exit")
    return parser


def check_ranges(options: argparse.Namespace) -> None:
    for flag, value, low in (("--nodes", options.nodes, 1), ("--gpus-per-node", options.gpus_per_node, 0)):
        if value < low:
            raise SubmitError(f"{flag} must be >= {low}, got {value}.")
    if options.time < 1:
        raise SubmitError(f"--time must be >= 1 (minutes), got {options.time}.")
    if not 0 < options.signal_delay < 60 * options.time:
        raise SubmitError(
            f"--signal-delay must be in [1, {60 * options.time - 1}] seconds (under --time {options.time} minutes), "
            f"got {options.signal_delay}."
        )
    if options.grid and options.sweep_file:
        raise SubmitError("--grid and --sweep-file: give one of them.")


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
    the job. It has no ``checkpoint`` method, so submitit never requeues it itself."""

    def __init__(self, command: Callable[[list[str]], None], args: list[str], root: str):
        self.command, self.args, self.root = command, args, root

    def __call__(self) -> str:
        # submitit's requeue (its handler on SUBMITIT_PREEMPT_SIGNAL, USR2 by default) is off: the
        # requeue is Lightning's, on USR1, which Lightning only takes if no handler holds it.
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)
        args = ["fit", *self.resumed_args()]
        sys.argv = ["ijepa", *args]  # what the job is, for LightningCLI and for anyone reading the processes
        try:
            self.command(args)
        except SystemExit as error:
            if error.code == 128 + signal.SIGTERM:
                raise  # stopped (preempted, or requeued): not over, so submitit writes no result
            if error.code not in (0, None):  # a failure submitit records as one (the table's `failed`)
                raise RuntimeError(f"ijepa fit exited with status {error.code}") from error
        return self.root

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
        executor.update_parameters(timeout_min=options.time, gpus_per_node=options.gpus_per_node)
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


def slurm_args(options: argparse.Namespace, args: list[str]) -> list[str]:
    """The process layout Lightning must agree with SLURM's (one process per task)."""
    extra = []
    if not has_option(args, "trainer.num_nodes"):
        extra.append(f"--trainer.num_nodes={options.nodes}")
    if options.gpus_per_node and not has_option(args, "trainer.devices"):
        extra.append(f"--trainer.devices={options.gpus_per_node}")
    return extra


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
    if options.executor == "slurm":
        args = [*args, *slurm_args(options, args)]
    jobs, entries = [], []
    with executor.batch():  # one job array
        for index, point in enumerate(runs):
            root = folder / "runs" / f"{index:03d}"
            # the run's own folder comes last, so it wins over one in the command or the config
            run_args = [*args, *override_args(point), f"--trainer.default_root_dir={root}"]
            jobs.append(executor.submit(FitJob(fit, run_args, str(root))))
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
    ``--executor local`` the command exits with status 1 when a run failed."""
    split = argv.index("--") if "--" in argv else len(argv)
    options = build_parser().parse_args(argv[:split])
    try:
        if options.table:
            print(table.write_table(Path(options.table)))
            return
        folder = submit(options, argv[split + 1 :], fit, check)
        if options.executor == "local":
            print(table.write_table(folder))
            failed = [row["run"] for row in table.rows(folder) if row["state"] == "failed"]
            if failed:
                sys.stderr.write(
                    f"error: {len(failed)} run(s) failed: {', '.join(failed)} (their error in the table)\n"
                )
                sys.exit(1)
        else:
            print(f"table: ijepa submit --table {folder}")
    except (SubmitError, SweepError, table.TableError) as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
