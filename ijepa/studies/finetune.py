"""The fine-tuning study: what does pretraining buy when the whole encoder is then trained on
labels, against a fair scratch, and does ``ijepa finetune`` train as well as a plain loop?

For each seed the study pretrains the quickstart (``ijepa fit --config configs/quickstart.yaml``)
and fine-tunes (``configs/finetune/<data>.yaml``) with each label fraction:

* ``pretrained``: ``ijepa finetune`` from the quickstart's target encoder;
* ``plain``: the plain PyTorch loop (:mod:`ijepa.studies.plain_finetune`) over its timm export,
  the same recipe: the outsider's reference ``ijepa finetune`` is measured against;
* ``plain_scratch``: the plain loop from timm's own initialisation, with its own recipe: the
  learning-rate and layer-decay grid :data:`SCRATCH_GRID`, the point chosen per seed and label
  fraction on the validation split;
* ``scratch``: ``ijepa finetune`` from ``random`` under timm's ViT init (``model.init: timm``),
  the same steps, with the grid point ``plain_scratch`` chose (the whole grid without it): the
  fair scratch;
* ``scratch_ijepa``: ``random`` under I-JEPA's init (``model.init: ijepa``), the config's recipe:
  the scratch this study used to compare against;
* ``student``, ``probe`` (on request): the distilled half-width student; the frozen encoder with
  a linear head on the same labels and augmentation.

Every row reads test top-1 of the checkpoint with the best validation top-1 (validation every 50
steps, carved from the train split, :mod:`ijepa.finetune.data`). Gains are over the better of the
two fair scratches, per seed. Runs go one after another::

    python -m ijepa.studies.finetune run --root runs/finetune --data shapes --seeds 0 1 2 --fractions 0.1 1.0
    python -m ijepa.studies.finetune table --root runs/finetune --data shapes
    python -m ijepa.studies.finetune digits-folder runs/digits_folder   # the digits folder alone

A rerun skips what is done. ``--pretrained DIR`` takes the quickstart runs from ``DIR/<name>_s<seed>``
(``--pretrained-name``, default ``pretrain``) instead of training them. ``--fit-args`` /
``--finetune-args`` / ``--plain-args`` add overrides to every command, for a quick check of the plumbing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

import yaml

from ijepa.studies.dense import LINEAR_EVAL, Log, last_checkpoint, logged, write_config
from ijepa.studies.evaluation import commit, pixel_config
from ijepa.studies.fashion import fetch_package, write_fashion_folder
from ijepa.studies.learning import DATA, write_digits_folder

FIT_CONFIG = "configs/quickstart.yaml"
STUDENT_CONFIG = "configs/distill/quickstart_half.yaml"
FINETUNE_CONFIGS = {
    "shapes": "configs/finetune/quickstart.yaml",
    "digits": "configs/finetune/digits.yaml",
    "fashion": "configs/finetune/fashion.yaml",
}
ROWS = ("pretrained", "plain", "scratch", "plain_scratch", "scratch_ijepa", "student", "probe")
DEFAULT_ROWS = ROWS[:5]
PLAIN_ROWS = {"plain": "pretrained", "plain_scratch": "timm-init"}  # row -> the plain loop's start
FAIR_SCRATCH = ("scratch", "plain_scratch")
# the scratch's own recipe: (lr, layer decay); a scratch has no lower layers to keep, so no decay
SCRATCH_GRID = ((1e-3, 0.75), (2e-3, 1.0), (4e-3, 1.0))
# the probe trains a linear head alone: no stochastic depth, a head's learning rate
PROBE_ARGS = ("--model.trainable_blocks=0", "--model.drop_path_rate=0.0", "--model.optim.lr=0.01")
GOAL = 0.05  # pretrained at least 5 points over the fair scratch with 10% labels, on every seed
PARITY = 0.015  # ijepa finetune within 1.5 points of the plain loop on the same weights, every seed
# the frozen encoders `--evals` scores with ijepa eval's linear grid under both readouts
FROZEN = ("pretrained", "random init", "pixels")
READOUTS = {"linear": "mean", "linear_tokens": "every token"}  # results file -> readout


def results_file(run_dir: Path) -> Path | None:
    found = sorted(run_dir.glob("lightning_logs/version_*/finetune.json"))
    return found[-1] if found else None


class Study:
    """One data set's runs under ``root/<data>``."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.data = args, args.data
        self.data_root = args.root / args.data
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.folder = None
        if args.data == "digits":
            self.folder = write_digits_folder((args.root / "digits_folder").resolve())
        elif args.data == "fashion":
            self.folder = fashion_folder(args.root / "fashion_folder")
        self.log = Log(self.data_root)

    def data_args(self) -> list[str]:
        return [arg.format(folder=self.folder) for arg in DATA[self.data]]

    def pretrained_dir(self, seed) -> Path:
        if self.args.pretrained is not None:
            return self.args.pretrained / f"{self.args.pretrained_name}_s{seed}"
        return self.data_root / f"pretrain_s{seed}"

    def pretrained(self, seed: int) -> Path:
        run_dir = self.pretrained_dir(seed)
        if last_checkpoint(run_dir) is None:
            command = ["ijepa", "fit", f"--config={FIT_CONFIG}", *self.data_args(), f"--seed_everything={seed}"]
            command += [f"--trainer.default_root_dir={run_dir}", "--trainer.enable_progress_bar=false"]
            logged(command + shlex.split(self.args.fit_args), run_dir / "fit.log", self.log)
        return last_checkpoint(run_dir)

    def student(self, seed: int) -> Path:
        run_dir = self.data_root / f"student_s{seed}"
        if last_checkpoint(run_dir) is None:
            command = ["ijepa", "distill", f"--config={STUDENT_CONFIG}", f"--model.teacher={self.pretrained(seed)}"]
            command += [*self.data_args(), f"--seed_everything={seed}", f"--trainer.default_root_dir={run_dir}"]
            command += ["--trainer.enable_progress_bar=false"]
            logged(command + shlex.split(self.args.fit_args), run_dir / "distill.log", self.log)
        return last_checkpoint(run_dir)

    def finetune(self, row: str, fraction: float, seed: int) -> None:
        if row in PLAIN_ROWS:
            return None  # Study.plain runs them
        grid = self.scratch_grid(fraction, seed) if row == "scratch" else ((None, None),)
        for lr, layer_decay in grid:
            tag = "" if lr is None else f"_lr{lr:g}"
            run_dir = self.data_root / f"{row}_f{fraction:g}_s{seed}{tag}"
            if results_file(run_dir) is not None:
                continue
            start = {"pretrained": self.pretrained, "probe": self.pretrained, "student": self.student}
            checkpoint = str(start[row](seed)) if row in start else "random"
            command = [
                "ijepa",
                "finetune",
                f"--config={FINETUNE_CONFIGS[self.data]}",
                f"--model.checkpoint={checkpoint}",
            ]
            if row == "student":
                command.append("--model.architecture=null")  # the student is narrower than the config's architecture
            if row == "scratch_ijepa":
                command.append("--model.init=ijepa")
            if lr is not None:
                command += [f"--model.optim.lr={lr}", f"--model.optim.layer_decay={layer_decay}"]
            if self.folder is not None:
                command.append(f"--data.source.root={self.folder}")
            command += [f"--data.label_fraction={fraction}", f"--seed_everything={seed}", f"--data.seed={seed}"]
            command += [
                f"--model.seed={seed}",
                f"--trainer.default_root_dir={run_dir}",
                "--trainer.enable_progress_bar=false",
            ]
            command += list(PROBE_ARGS) if row == "probe" else []
            logged(command + shlex.split(self.args.finetune_args), run_dir / "finetune.log", self.log)

    def plain(self) -> None:
        """Every plain-loop run the study asks for, in one process (the images rendered once)."""
        starts = [start for row, start in PLAIN_ROWS.items() if row in self.args.rows]
        if not starts:
            return
        for seed in self.args.seeds:
            self.pretrained(seed)
        out = self.data_root / "plain"
        command = ["python", "-m", "ijepa.studies.plain_finetune", f"--config={FINETUNE_CONFIGS[self.data]}"]
        command += [f"--checkpoint={self.pretrained_dir('{seed}') / 'lightning_logs/version_0/checkpoints/last.ckpt'}"]
        command += ["--starts", *starts, "--seeds", *map(str, self.args.seeds)]
        command += ["--label-fractions", *[f"{f:g}" for f in self.args.fractions], f"--out={out}"]
        command += ["--scratch-grid", *[f"{lr:g}:{decay:g}" for lr, decay in SCRATCH_GRID]]
        command += [f"--source-root={self.folder}"] if self.folder is not None else []
        logged(command + shlex.split(self.args.plain_args), out / "plain.log", self.log)

    def scratch_grid(self, fraction: float, seed: int) -> tuple[tuple[float, float], ...]:
        """The scratch's recipe: the grid point the plain loop's scratch (the same init) scored best
        on validation for this seed and labels, when it ran; else the whole grid."""
        plain = self.data_root / "plain"
        scored = []
        for lr, decay in SCRATCH_GRID:
            path = plain / f"timm-init_lr{lr:g}_f{fraction:g}_s{seed}.json"
            if path.exists():
                scored.append((json.loads(path.read_text())["val_top1"], -lr, (lr, decay)))
        return (max(scored)[2],) if len(scored) == len(SCRATCH_GRID) else SCRATCH_GRID

    def evaluate(self, seed: int) -> None:
        """``ijepa eval``'s linear grid (``configs/eval/quickstart.yaml``'s, under the mean and
        every-token readouts) of the frozen pretrained encoder, its random init (I-JEPA's, the
        fit's step 0) and raw pixels, into ``<data>/eval_<encoder>_s<seed>``."""
        source = (
            None
            if self.folder is None
            else {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(self.folder)}}
        )
        linear = write_config(self.data_root / "linear.yaml", LINEAR_EVAL, ("LinearProtocol",), source, None)
        configs = {"pretrained": linear, "random init": linear, "pixels": pixel_config(self.data_root, str(linear))}
        checkpoints = {"pretrained": str(self.pretrained(seed)), "random init": "random", "pixels": "pixels"}
        for encoder in FROZEN:
            out = self.data_root / f"eval_{encoder.replace(' ', '_')}_s{seed}"
            if all((out / f"{name}.json").is_file() for name in READOUTS):
                continue
            command = ["ijepa", "eval", "--config", str(configs[encoder]), "--checkpoint", checkpoints[encoder]]
            command += ["--output_dir", str(out), f"--data.seed={seed}", "--cache=false"]
            if encoder == "random init":  # the fit's step 0: I-JEPA's init of the quickstart's encoder at this seed
                command += ["--architecture", FIT_CONFIG]
            if encoder != "pretrained":
                command += [
                    "--data.image_size",
                    str(yaml.safe_load(Path(FIT_CONFIG).read_text())["data"]["image_size"]),
                ]
            logged(command, out / "eval.log", self.log)

    def run(self) -> None:
        if self.args.evals:
            for seed in self.args.seeds:
                self.evaluate(seed)
        self.plain()
        for seed in self.args.seeds:
            for fraction in self.args.fractions:
                for row in self.args.rows:
                    self.finetune(row, fraction, seed)


def fashion_folder(root: Path) -> Path:
    """The Fashion-MNIST folder of :mod:`ijepa.studies.fashion` under ``root`` (written once)."""
    if not (root / "train").is_dir():
        write_fashion_folder(root, fetch_package(root.parent / "npm"))
    return root.resolve()


def records(data_root: Path) -> dict[tuple[str, float], dict[int, dict]]:
    """``{(row, fraction): {seed: result}}`` of every finished run; a grid row keeps, per seed, the
    run of the best validation top-1 (its ``lr`` noted). A result has ``test_top1``, ``val_top1``,
    ``fit_seconds`` and, for grid rows, ``lr``."""
    found: dict[tuple[str, float], dict[int, list[dict]]] = {}
    for run_dir in sorted(data_root.glob("*_f*_s*")):
        if not run_dir.is_dir():
            continue
        name, lr = (run_dir.name.split("_lr") + [None])[:2]
        row, fraction, seed = name.rsplit("_", 2)
        path = results_file(run_dir)
        if path is not None and row in ROWS:
            saved = json.loads(path.read_text())
            result = {"test_top1": saved["test_top1"], "val_top1": saved.get("best_val_top1"),
                      "fit_seconds": saved["fit_seconds"], "lr": None if lr is None else float(lr)}  # fmt: skip
            found.setdefault((row, float(fraction[1:])), {}).setdefault(int(seed[1:]), []).append(result)
    for row, start in PLAIN_ROWS.items():
        for path in sorted((data_root / "plain").glob(f"{start}_lr*_f*_s*.json")):
            saved = json.loads(path.read_text())
            result = {key: saved[key] for key in ("test_top1", "val_top1", "fit_seconds")}
            result["lr"] = saved["lr"] if row == "plain_scratch" else None
            found.setdefault((row, saved["label_fraction"]), {}).setdefault(saved["seed"], []).append(result)
    return {
        key: {seed: max(runs, key=lambda r: r["val_top1"]) for seed, runs in seeds.items()}
        for key, seeds in found.items()
    }


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.mean(values):.1f} ± {50 * (max(values) - min(values)):.1f}"


def fair_scratch(found: dict, fraction: float) -> dict[int, float]:
    """Per seed, the better test top-1 of the two fair scratches (each its own grid's best on validation)."""
    best: dict[int, float] = {}
    for row in FAIR_SCRATCH:
        for seed, result in found.get((row, fraction), {}).items():
            best[seed] = max(best.get(seed, 0.0), result["test_top1"])
    return best


def table(data_root: Path) -> str:
    found = records(data_root)
    fractions = sorted({fraction for _, fraction in found})
    lines = [
        "| labels | start | seeds | test top-1 % | per seed | over the fair scratch, per seed | lr (grid rows) | fit wall s (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fraction in fractions:
        scratch = fair_scratch(found, fraction)
        for row in ROWS:
            runs = found.get((row, fraction))
            if not runs:
                continue
            tops = [r["test_top1"] for r in runs.values()]
            per_seed = ", ".join(f"s{s} {100 * r['test_top1']:.1f}" for s, r in sorted(runs.items()))
            gains = ", ".join(
                f"s{s} {100 * (r['test_top1'] - scratch[s]):+.1f}" for s, r in sorted(runs.items()) if s in scratch
            )
            lrs = ", ".join(f"s{s} {r['lr']:g}" for s, r in sorted(runs.items()) if r["lr"] is not None) or "-"
            wall = statistics.median(r["fit_seconds"] for r in runs.values())
            labels = "all" if fraction == 1 else f"{100 * fraction:g} %"
            gain_cell = "-" if row in FAIR_SCRATCH else gains or "-"
            lines.append(
                f"| {labels} | {row} | {len(runs)} | {spread(tops)} | {per_seed} | {gain_cell} | {lrs} | {wall:.0f} |"
            )
    lines += ["", *goals(found)]
    return "\n".join(lines)


def frozen_table(data_root: Path) -> str:
    """``ijepa eval`` linear of the frozen encoders under both readouts (``--evals``), or ''."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    for encoder in FROZEN:
        for folder in sorted(data_root.glob(f"eval_{encoder.replace(' ', '_')}_s*")):
            seed = int(folder.name.rsplit("_s", 1)[1])
            for name, readout in READOUTS.items():
                if (folder / f"{name}.json").is_file():
                    found.setdefault((encoder, readout), {})[seed] = json.loads((folder / f"{name}.json").read_text())[
                        "test_top1"
                    ]
    if not found:
        return ""
    lines = ["| frozen encoder | readout | seeds | `ijepa eval` linear top-1 % | per seed |", "|---|---|---|---|---|"]
    for (encoder, readout), runs in found.items():
        per_seed = ", ".join(f"s{s} {100 * v:.1f}" for s, v in sorted(runs.items()))
        lines.append(f"| {encoder} | {readout} | {len(runs)} | {spread(list(runs.values()))} | {per_seed} |")
    return "\n".join(lines)


def goals(found: dict) -> list[str]:
    """The issue's two goals, met or not, with the per-seed figures."""
    out = []
    for fraction in sorted({fraction for _, fraction in found}):
        ours, plain = found.get(("pretrained", fraction), {}), found.get(("plain", fraction), {})
        shared = sorted(set(ours) & set(plain))
        if shared:
            gaps = [ours[s]["test_top1"] - plain[s]["test_top1"] for s in shared]
            met = all(gap >= -PARITY for gap in gaps)
            listed = ", ".join(f"s{s} {100 * g:+.1f}" for s, g in zip(shared, gaps))
            labels = "all labels" if fraction == 1 else f"{100 * fraction:g} % labels"
            out.append(
                f"Parity ({labels}; `ijepa finetune` minus the plain loop, within 1.5 every seed): {listed}: {'met' if met else 'not met'}."
            )
    tenth, scratch = found.get(("pretrained", 0.1), {}), fair_scratch(found, 0.1)
    shared = sorted(set(tenth) & set(scratch))
    if shared:
        met = all(tenth[s]["test_top1"] - scratch[s] >= GOAL for s in shared)
        out.append(
            f"Goal (pretrained >= the fair scratch + 5 points with 10 % labels on every seed): {'met' if met else 'not met'}."
        )
    return out


def provenance(data_root: Path) -> str:
    path = data_root / "run.json"
    sessions = json.loads(path.read_text()) if path.exists() else []
    lines = ["# ijepa.studies.finetune: provenance", "", f"table written at commit {commit()}", ""]
    for session in sessions:
        lines += [f"## run at commit {session['commit']}, {session['date']}", "", "```bash"]
        lines += [*session["commands"], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "table", "digits-folder"))
    parser.add_argument("folder", nargs="?", type=Path, help="digits-folder: where to write the folder")
    parser.add_argument("--root", type=Path, default=Path("runs/finetune"))
    parser.add_argument("--data", choices=tuple(FINETUNE_CONFIGS), default="shapes")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.1, 1.0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(DEFAULT_ROWS))
    parser.add_argument("--pretrained", type=Path, help="take the pretraining runs from DIR/<name>_s<seed>")
    parser.add_argument("--pretrained-name", default="pretrain")
    parser.add_argument("--fit-args", default="", help="more ijepa fit / distill overrides")
    parser.add_argument("--finetune-args", default="", help="more ijepa finetune overrides")
    parser.add_argument(
        "--plain-args", default="", help="more plain-loop options (python -m ijepa.studies.plain_finetune)"
    )
    parser.add_argument(
        "--evals", action="store_true", help="also ijepa eval linear of the frozen encoders, both readouts"
    )
    args = parser.parse_args(argv)
    if args.action == "digits-folder":
        if args.folder is None:
            raise SystemExit("digits-folder needs the folder to write, e.g. runs/digits_folder")
        print(write_digits_folder(args.folder))
        return
    if args.action == "run":
        Study(args).run()
    data_root = args.root / args.data
    if not data_root.is_dir():
        raise SystemExit(f"no study under {data_root}: run `python -m ijepa.studies.finetune run` first.")
    (data_root / "provenance.md").write_text(provenance(data_root))
    print(table(data_root))
    if frozen := frozen_table(data_root):
        print("\n" + frozen)


if __name__ == "__main__":
    main()
