"""The distillation study of issue 45: the quickstart's encoder (width 128) distilled into a
student of half its width, against the teacher and against the same student pretrained from
scratch for the same steps.

Rows: ``teacher`` (``configs/quickstart.yaml``, seed 0), ``distilled`` (``ijepa distill --config
configs/distill/quickstart_half.yaml`` with that teacher: the JEPA step), ``scratch`` (the quickstart with
``--model.embed_dim 64``: the student's architecture, I-JEPA with EMA) and ``features`` (the
student matching every teacher token, ``--model.objective features``). Each run is scored by
``ijepa eval``'s k-NN and linear protocols (``configs/eval/quickstart.yaml``'s) with its seed as
``data.seed``. Runs go one after another::

    python -m ijepa.studies.distill run --root runs/distill --seeds 0 1 2
    python -m ijepa.studies.distill table --root runs/distill

A rerun skips what is done. ``--fit-args`` / ``--eval-args`` add overrides to every run (a quick
check of the plumbing: ``--fit-args "--trainer.max_steps=4" --eval-args "--data.source.train_size=256"``).
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ijepa.evaluation.runner import read_results
from ijepa.studies.dense import LINEAR_EVAL, Log, last_checkpoint, logged, write_config
from ijepa.studies.learning import cell, run_summary

TEACHER_CONFIG = "configs/quickstart.yaml"
STUDENT_CONFIG = "configs/distill/quickstart_half.yaml"
ROWS = ("teacher", "distilled", "features", "scratch")
EVAL_FILES = {"eval_knn": ("knn.json", "test_top1"), "eval_linear": ("linear.json", "test_top1")}


def fit(folder: Path, command: list[str], seed: int, extra: tuple[str, ...], log: Log) -> Path:
    """The run in ``folder`` (skipped if done); its last checkpoint."""
    timing = folder / "wall_time.json"
    if not (last_checkpoint(folder) and timing.exists()):
        command = [
            *command,
            f"--seed_everything={seed}",
            f"--trainer.default_root_dir={folder}",
            "--trainer.enable_progress_bar=false",
            *extra,
        ]
        wall_s = logged(command, folder / "fit.log", log)
        timing.write_text(json.dumps({"wall_s": wall_s}) + "\n")
    return last_checkpoint(folder)


def evaluate(folder: Path, checkpoint: Path, config: Path, seed: int, extra: list[str], log: Log) -> None:
    out = folder / "eval"
    if all((out / name).is_file() for name, _ in EVAL_FILES.values()):
        return
    command = ["ijepa", "eval", "--config", str(config), "--checkpoint", str(checkpoint), "--output_dir", str(out)]
    logged([*command, f"--data.seed={seed}", "--cache=false", *extra], folder / "eval.log", log)


def run(args: argparse.Namespace) -> None:
    args.root.mkdir(parents=True, exist_ok=True)
    config = write_config(args.root / "eval.yaml", LINEAR_EVAL, ("KNNProtocol", "LinearProtocol"), None, None)
    fit_extra, eval_extra = tuple(shlex.split(args.fit_args)), shlex.split(args.eval_args)
    log = Log(args.root)
    teacher_dir = args.root / "teacher_s0"
    teacher = fit(teacher_dir, ["ijepa", "fit", f"--config={TEACHER_CONFIG}"], 0, fit_extra, log)
    evaluate(teacher_dir, teacher, config, 0, eval_extra, log)
    for seed in args.seeds:
        runs = {
            "distilled": ["ijepa", "distill", f"--config={STUDENT_CONFIG}", f"--model.teacher={teacher.resolve()}"],
            "features": [
                "ijepa",
                "distill",
                f"--config={STUDENT_CONFIG}",
                f"--model.teacher={teacher.resolve()}",
                "--model.objective=features",
            ],
            "scratch": ["ijepa", "fit", f"--config={TEACHER_CONFIG}", "--model.embed_dim=64"],
        }
        for row, command in runs.items():
            folder = args.root / f"{row}_s{seed}"
            evaluate(folder, fit(folder, command, seed, fit_extra, log), config, seed, eval_extra, log)


def record(folder: Path) -> dict[str, float]:
    found = dict(run_summary(folder) or {})
    for key, (name, field) in EVAL_FILES.items():
        path = folder / "eval" / name
        if path.is_file() and (value := read_results(path).get(field)) is not None:
            found[key] = value
    return found


def table(root: Path) -> str:
    """Mean ± half the range over seeds, %."""
    columns = {
        "in-fit k-NN, end": "knn_top1_end",
        "in-fit linear, end": "linear_top1_end",
        "`ijepa eval` k-NN": "eval_knn",
        "`ijepa eval` linear": "eval_linear",
    }
    lines = ["| row | width | seeds | " + " | ".join(columns) + " | fit wall s |", "|---" * (len(columns) + 4) + "|"]
    for row in ROWS:
        runs = [record(folder) for folder in sorted(root.glob(f"{row}_s*"))]
        runs = [found for found in runs if found]
        if not runs:
            continue
        cells = [
            cell([r[key] for r in runs if key in r]) if any(key in r for r in runs) else "-" for key in columns.values()
        ]
        walls = sorted(r["wall_s"] for r in runs if "wall_s" in r)
        wall = f"{walls[len(walls) // 2]:.0f}" if walls else "-"
        width = 128 if row == "teacher" else 64
        lines.append(f"| {row} | {width} | {len(runs)} | " + " | ".join(cells) + f" | {wall} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ijepa.studies.distill", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("--root", type=Path, default=Path("runs/distill"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--fit-args", default="", help="more overrides for every ijepa fit / distill")
    parser.add_argument("--eval-args", default="", help="more ijepa eval overrides")
    args = parser.parse_args(argv)
    if args.action == "run":
        run(args)
    print(table(args.root))


if __name__ == "__main__":
    main()
