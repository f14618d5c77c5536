"""The table of a sweep (``ijepa submit --table FOLDER``): each run's overrides, state and final
``val/*`` metrics, printed as markdown and written to ``FOLDER/sweep_table.{md,csv}``.

The state comes from the files the runs left: submitit's result file (``completed``, ``failed``,
or ``timed out``: a local job stopped at its time limit, :class:`RunTimedOut`), else, on SLURM,
the scheduler's state (``sacct``, through submitit), else ``running`` once the run has written
anything to its folder, ``pending`` before. The metrics are the
last value of every ``val/*`` scalar in the run's TensorBoard event files (or ``metrics.csv`` of a
``CSVLogger``), over every version folder (a requeued run logs to a new one).
"""

from __future__ import annotations

import csv
import io
import json
import pickle
import shutil
from pathlib import Path

MANIFEST = "sweep.json"
SLURM_STATES = {
    "PENDING": "pending",
    "REQUEUED": "pending",
    "RUNNING": "running",
    "COMPLETED": "completed",
    "TIMEOUT": "timed out",
}


class RunTimedOut(RuntimeError):
    """How a local job ends when submitit's time-out signal stopped it (``ijepa.launch.submit.FitJob``):
    its result file then holds this error, which the table shows as ``timed out``."""


TIMED_OUT = f"{RunTimedOut.__module__}.{RunTimedOut.__qualname__}: "  # the last line of such a job's traceback


class TableError(ValueError):
    """A folder that holds no sweep; the message names it."""


def last_error(run: dict) -> str:
    """The line that says why a run failed: the last ``error: ...`` line the ``ijepa`` command
    wrote to the job's stderr, else the last line of the traceback submitit kept (a timed-out
    run's message: where it saved its state)."""
    result = Path(run["result"])
    trace = ""
    if result.is_file():
        with open(result, "rb") as f:
            _, trace = pickle.load(f)
    if last_line(trace).startswith(TIMED_OUT):
        return last_line(trace).removeprefix(TIMED_OUT)
    stderr = Path(run.get("stdout", "")).with_suffix(".err") if run.get("stdout") else None
    if stderr is not None and stderr.is_file():
        lines = [line.strip() for line in stderr.read_text(errors="replace").splitlines() if line.strip()]
        own = [line for line in lines if line.startswith("error: ")]
        if own:
            return own[-1].removeprefix("error: ")
    return last_line(trace) or "-"


def last_line(trace) -> str:
    lines = [line.strip() for line in str(trace).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_state(run: dict, executor: str) -> str:
    result = Path(run["result"])
    if result.is_file():
        with open(result, "rb") as f:
            outcome, trace = pickle.load(f)
        if outcome == "success":
            return "completed"
        return "timed out" if last_line(trace).startswith(TIMED_OUT) else "failed"
    if executor == "slurm" and shutil.which("sacct"):
        try:
            import submitit  # optional (the `cluster` extra)

            state = submitit.SlurmJob(folder=Path(result).parent, job_id=run["job_id"]).state
        except Exception:  # submitit missing, sacct failing: the files tell
            state = "UNKNOWN"
        if state != "UNKNOWN":
            return SLURM_STATES.get(state.split()[0], "failed")
    root = Path(run["root"])
    return "running" if root.is_dir() and any(root.iterdir()) else "pending"


def final_metrics(root: Path) -> dict[str, float]:
    """The last value (by step, then time) of every ``val/*`` scalar the run logged."""
    last: dict[str, tuple[int, float, float]] = {}
    if not root.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # slow import: table only

    for path in sorted(root.rglob("events.out.tfevents.*")):
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            if tag.startswith("val/"):
                for event in events.Scalars(tag):
                    key = (event.step, event.wall_time, event.value)
                    last[tag] = max(last.get(tag, key), key)
    for path in sorted(root.rglob("metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                for tag, value in row.items():
                    if tag.startswith("val/") and value:
                        key = (int(row.get("step") or 0), 0.0, float(value))
                        last[tag] = max(last.get(tag, key), key)
    return {tag: value for tag, (_, _, value) in sorted(last.items())}


def rows(folder: Path) -> list[dict[str, str]]:
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise TableError(f"--table {folder}: no sweep here (no {MANIFEST}; the folder given to ijepa submit --folder).")
    manifest = json.loads(manifest_path.read_text())
    found = []
    for run in manifest["runs"]:
        metrics = final_metrics(Path(run["root"]))
        overrides = " ".join(f"{key}={value}" for key, value in run["overrides"].items())
        row = {"run": run["run"], "job": run["job_id"], "overrides": overrides or "-"}
        row["state"] = run_state(run, manifest["executor"])
        if row["state"] in ("failed", "timed out"):
            row["error"] = last_error(run).replace("|", "/")  # a markdown cell
        found.append(row | {tag: f"{value:.4f}" for tag, value in metrics.items()})
    return found


def write_table(folder: Path) -> str:
    """The sweep's table as markdown; also written to ``sweep_table.md`` and ``sweep_table.csv``."""
    table = rows(folder)
    columns = list(dict.fromkeys(key for row in table for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(column, "") for column in columns) + " |" for row in table]
    markdown = "\n".join(lines)
    (folder / "sweep_table.md").write_text(markdown + "\n")
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(table)
    (folder / "sweep_table.csv").write_text(text.getvalue())
    return markdown
