"""The fine-tuning study of issue 58: what does pretraining buy when the whole encoder is then
trained on labels, against the same ViT trained from scratch for the same steps?

For each seed the study pretrains the quickstart (``ijepa fit --config configs/quickstart.yaml``),
distils it into the half-width student (``configs/distill/quickstart_half.yaml``), then fine-tunes
(``configs/finetune/<data>.yaml``) with each label fraction:

* ``pretrained``: from the quickstart's target encoder;
* ``student``: from its distilled student (64 wide);
* ``scratch``: from ``random``, the same architecture freshly initialised (the seed's), same steps;
* ``probe``: the pretrained encoder frozen (``trainable_blocks: 0``), a linear head trained on the
  same labels and augmentation: the frozen linear probe, for reference.

Every row reads test top-1 of the checkpoint with the best validation top-1 (validation carved from
the train split, :mod:`ijepa.finetune.data`). Runs go one after another::

    python -m ijepa.studies.finetune run --root runs/finetune --data shapes --seeds 0 1 2 --fractions 0.1 1.0
    python -m ijepa.studies.finetune table --root runs/finetune --data shapes
    python -m ijepa.studies.finetune digits-folder runs/digits_folder   # the digits folder alone

A rerun skips what is done. ``--pretrained DIR`` takes the quickstart runs from ``DIR/<name>_s<seed>``
(``--pretrained-name``, default ``pretrain``) instead of training them, e.g. the levers study's
``recipe`` runs, which are the same command. ``--fit-args`` / ``--finetune-args`` add overrides to
every pretraining / fine-tuning command, for a quick check of the plumbing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from ijepa.studies.dense import Log, last_checkpoint, logged
from ijepa.studies.evaluation import commit
from ijepa.studies.learning import DATA, write_digits_folder

FIT_CONFIG = "configs/quickstart.yaml"
STUDENT_CONFIG = "configs/distill/quickstart_half.yaml"
FINETUNE_CONFIGS = {"shapes": "configs/finetune/quickstart.yaml", "digits": "configs/finetune/digits.yaml"}
ROWS = ("pretrained", "student", "scratch", "probe")
# the probe trains a linear head alone: no stochastic depth, a head's learning rate
PROBE_ARGS = ("--model.trainable_blocks=0", "--model.drop_path_rate=0.0", "--model.optim.lr=0.01")
GOAL = 0.05  # issue 58: pretrained at least 5 points over scratch with 10% labels, on every seed


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
        self.log = Log(self.data_root)

    def data_args(self) -> list[str]:
        return [arg.format(folder=self.folder) for arg in DATA[self.data]]

    def pretrained(self, seed: int) -> Path:
        if self.args.pretrained is not None:
            run_dir = self.args.pretrained / f"{self.args.pretrained_name}_s{seed}"
        else:
            run_dir = self.data_root / f"pretrain_s{seed}"
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
        run_dir = self.data_root / f"{row}_f{fraction:g}_s{seed}"
        if results_file(run_dir) is not None:
            return
        start = {"pretrained": self.pretrained, "probe": self.pretrained, "student": self.student}
        checkpoint = str(start[row](seed)) if row in start else "random"
        command = ["ijepa", "finetune", f"--config={FINETUNE_CONFIGS[self.data]}", f"--model.checkpoint={checkpoint}"]
        if row == "student":
            command.append("--model.architecture=null")  # the student is narrower than the config's architecture
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

    def run(self) -> None:
        for seed in self.args.seeds:
            for fraction in self.args.fractions:
                for row in self.args.rows:
                    self.finetune(row, fraction, seed)


def records(data_root: Path) -> dict[tuple[str, float], dict[int, dict]]:
    """``{(row, fraction): {seed: finetune.json}}`` of every finished run."""
    found: dict[tuple[str, float], dict[int, dict]] = {}
    for run_dir in sorted(data_root.glob("*_f*_s*")):
        row, fraction, seed = run_dir.name.rsplit("_", 2)
        path = results_file(run_dir)
        if path is not None and row in ROWS:
            found.setdefault((row, float(fraction[1:])), {})[int(seed[1:])] = json.loads(path.read_text())
    return found


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.mean(values):.1f} ± {50 * (max(values) - min(values)):.1f}"


def table(data_root: Path) -> str:
    found = records(data_root)
    fractions = sorted({fraction for _, fraction in found})
    lines = [
        "| labels | start | seeds | test top-1 % | per seed | over scratch, per seed | fine-tune wall s (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for fraction in fractions:
        scratch = found.get(("scratch", fraction), {})
        for row in ROWS:
            runs = found.get((row, fraction))
            if not runs:
                continue
            tops = [r["test_top1"] for r in runs.values()]
            per_seed = ", ".join(f"s{s} {100 * r['test_top1']:.1f}" for s, r in sorted(runs.items()))
            gains = ", ".join(
                f"s{s} {100 * (r['test_top1'] - scratch[s]['test_top1']):+.1f}"
                for s, r in sorted(runs.items())
                if s in scratch
            )
            wall = statistics.median(r["fit_seconds"] for r in runs.values())
            labels = "all" if fraction == 1 else f"{100 * fraction:g} %"
            gain_cell = "-" if row == "scratch" else gains or "-"
            lines.append(f"| {labels} | {row} | {len(runs)} | {spread(tops)} | {per_seed} | {gain_cell} | {wall:.0f} |")
    tenth = found.get(("pretrained", 0.1), {})
    scratch = found.get(("scratch", 0.1), {})
    shared = sorted(set(tenth) & set(scratch))
    if shared:
        met = all(tenth[s]["test_top1"] - scratch[s]["test_top1"] >= GOAL for s in shared)
        lines += [
            "",
            f"Goal (pretrained >= scratch + 5 points with 10 % labels on every seed): {'met' if met else 'not met'}.",
        ]
    return "\n".join(lines)


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
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--pretrained", type=Path, help="take the pretraining runs from DIR/<name>_s<seed>")
    parser.add_argument("--pretrained-name", default="pretrain")
    parser.add_argument("--fit-args", default="", help="more ijepa fit / distill overrides")
    parser.add_argument("--finetune-args", default="", help="more ijepa finetune overrides")
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


if __name__ == "__main__":
    main()
