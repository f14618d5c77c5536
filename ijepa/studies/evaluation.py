"""The tables of ``docs/evaluation.md``: every ``ijepa eval`` protocol on a quickstart checkpoint,
its random-init encoder and raw pixels, next to the in-``fit`` monitors of the same run::

    python -m ijepa.studies.evaluation run --root runs/evaluation     # fit (if needed) + every evaluation
    python -m ijepa.studies.evaluation table --root runs/evaluation   # the markdown table
    python -m ijepa.studies.evaluation run --preset video_quickstart --root runs/evaluation_video

``--preset`` picks the training config and its evaluation config: ``quickstart``
(``configs/quickstart.yaml``, ``configs/eval/quickstart.yaml``), ``video_quickstart`` or
``video_motion`` (``configs/<preset>.yaml``, ``configs/eval/<preset>.yaml``). ``run`` trains the
config in ``<root>/quickstart`` unless a checkpoint is already there, writes the same model at its
initialisation (``seed_everything`` of the config, so the encoder the step-0 probes score) as
``<root>/random_init.ckpt``, and runs ``ijepa eval`` on both and on ``pixels``, one after another
(two at once on 2 cores spoil the wall times). Raw pixels have one "block": their linear grid
drops ``last_blocks: 4``. ``table`` also writes ``<root>/provenance.md``: the commit, the date,
the commands and every protocol's selected head.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ijepa.cli import instantiate
from ijepa.interop import save_lightning_checkpoint

PRESETS = {
    name: (f"configs/{name}.yaml", f"configs/eval/{name}.yaml")
    for name in ("quickstart", "video_quickstart", "video_motion")
}
ENCODERS = ("trained", "random_init", "pixels")
MONITORS = {
    "val/knn_top1": "in-fit k-NN monitor (k=20, full bank)",
    "val/linear_top1": "in-fit linear monitor (L-BFGS)",
    "val/attentive_top1": "in-fit attentive monitor (one head)",
}


def quickstart_checkpoint(root: Path) -> Path:
    return root / "quickstart" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def pixel_config(root: Path, eval_config: str) -> Path:
    """The evaluation config for raw pixels: the linear grid on one block (pixels have no others),
    and no logistic regression (L-BFGS in float64 on 6,912 values per image takes over 10 minutes
    a sweep on 2 CPU cores)."""
    config = yaml.safe_load(Path(eval_config).read_text())
    config["protocols"] = [
        p for p in config["protocols"] if not p["class_path"].endswith(("LogRegProtocol", "LowShotProtocol"))
    ]
    for protocol in config["protocols"]:
        if protocol["class_path"].endswith("LinearProtocol"):
            protocol["init_args"]["last_blocks"] = [1]
    path = root / "pixels.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def timed(command: list[str], cwd: Path | None = None) -> float:
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True)
    return time.perf_counter() - start


def run(root: Path, preset: str = "quickstart") -> None:
    fit_config, eval_config = PRESETS[preset]
    root.mkdir(parents=True, exist_ok=True)
    log = {"commit": commit(), "date": datetime.date.today().isoformat(), "preset": preset, "commands": []}
    checkpoint = quickstart_checkpoint(root)
    if not checkpoint.is_file():
        (root / "quickstart").mkdir(exist_ok=True)
        command = ["ijepa", "fit", "--config", str(Path(fit_config).resolve())]
        log["fit_seconds"] = timed(command, cwd=root / "quickstart")
        log["commands"].append(" ".join(command))
    random_init = root / "random_init.ckpt"
    model, _ = instantiate(fit_config)  # the config's seed_everything: the step-0 weights
    save_lightning_checkpoint(model, random_init)
    sources = {
        "trained": (str(checkpoint), eval_config),
        "random_init": (str(random_init), eval_config),
        "pixels": ("pixels", str(pixel_config(root, eval_config))),
    }
    for name, (source, config) in sources.items():
        command = [
            "ijepa",
            "eval",
            "--config",
            config,
            "--checkpoint",
            source,
            "--output_dir",
            str(root / "eval" / name),
        ]
        if name == "pixels":
            command += ["--data.image_size", str(model.hparams.image_size)]
            if model.hparams.num_frames:
                command += ["--data.num_frames", str(model.hparams.num_frames)]
        log[f"{name}_seconds"] = timed(command)
        log["commands"].append(" ".join(command))
    (root / "run.json").write_text(json.dumps(log, indent=2) + "\n")


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def monitors(root: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the in-fit probes of the quickstart run."""
    events = EventAccumulator(str(root / "quickstart" / "lightning_logs" / "version_0"))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in MONITORS if tag in events.Tags()["scalars"]}


def results(root: Path, name: str) -> list[dict]:
    folder = root / "eval" / name
    order = ("knn", "logreg", "linear", "attentive", "low_shot")
    found = {json.loads(p.read_text())["name"]: json.loads(p.read_text()) for p in folder.glob("*.json")}
    return [found[key] for key in order if key in found]


def rows(root: Path) -> list[tuple[str, list[str], str]]:
    """``(protocol, [score per encoder], seconds on the trained encoder)``."""
    table = {name: results(root, name) for name in ENCODERS}
    out = []
    for trained in table["trained"]:
        if trained["test_top1"] is not None:
            found = {name: {r["name"]: r for r in table[name]} for name in ENCODERS}
            scores = [
                f"{100 * found[name][trained['name']]['test_top1']:.1f}" if trained["name"] in found[name] else "-"
                for name in ENCODERS
            ]
            out.append((f"`{trained['name']}` ({len(trained['heads'])} heads)", scores, f"{trained['seconds']:.0f}"))
            continue
        for setting_index, setting in enumerate(trained["settings_results"]):
            scores = []
            for name in ENCODERS:
                other = {r["name"]: r for r in table[name]}.get(trained["name"])
                entry = other["settings_results"][setting_index] if other else None
                scores.append(f"{100 * entry['mean']:.1f} ± {100 * entry['std']:.1f}" if entry else "-")
            seconds = f"{trained['seconds']:.0f}" if setting_index == 0 else "(same)"
            out.append((f"`low_shot` {setting['name']} ({len(setting['test_top1'])} tries)", scores, seconds))
    values = monitors(root)
    for tag, label in MONITORS.items():
        steps = values.get(tag, {})
        if steps:
            out.append((label, [f"{100 * steps[max(steps)]:.1f}", f"{100 * steps[min(steps)]:.1f}", "-"], "-"))
    return out


def table(root: Path) -> str:
    lines = [
        "| protocol | trained checkpoint | its random init | raw pixels | seconds (checkpoint) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {label} | {' | '.join(scores)} | {seconds} |" for label, scores, seconds in rows(root)]
    return "\n".join(lines)


def provenance(root: Path) -> str:
    log = json.loads((root / "run.json").read_text())
    lines = ["# ijepa.studies.evaluation: provenance", "", f"commit {log['commit']}, {log['date']}", ""]
    lines += ["```bash", *log["commands"], "```", ""]
    for name in ENCODERS:
        lines.append(f"## {name} ({log.get(f'{name}_seconds', 0):.0f} s)")
        for result in results(root, name):
            if result["test_top1"] is not None:
                lines.append(
                    f"- {result['name']}: selected {result['selected']} (val {100 * result['val_top1']:.2f}), "
                    f"test {100 * result['test_top1']:.2f}, {result['seconds']:.0f} s"
                )
            else:
                for setting in result["settings_results"]:
                    tries = ", ".join(f"{100 * t:.1f}" for t in setting["test_top1"])
                    lines.append(
                        f"- low_shot {setting['name']}: {setting['images']} images, tries {tries}, "
                        f"C {setting['selected_C']}"
                    )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("--root", type=Path, default=Path("runs/evaluation"))
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quickstart")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.action == "run":
        run(args.root, args.preset)
    text = table(args.root)
    (args.root / "table.md").write_text(text + "\n")
    (args.root / "provenance.md").write_text(provenance(args.root))
    print(text)


if __name__ == "__main__":
    main()
