"""The position-encoding comparison table of ``docs/position_embeddings.md``, from TensorBoard logs.

Train every type and seed (about 4.5 minutes each on 2 CPU cores)::

    for seed in 0 1; do for pe in $(python -m ijepa.studies.position_table --names); do
      ijepa fit --config configs/quickstart.yaml --model.pos_embed $pe \\
          --seed_everything $seed --trainer.default_root_dir runs/pos_${pe}_s$seed --trainer.enable_progress_bar false
    done; done

(``--names`` lists the image members of the registry), then
``python -m ijepa.studies.position_table runs`` prints one row per type: the final
``train/loss`` (mean of the last 5 logged values), ``val/knn_top1`` at step 0 (random init) and at
the last step, and the gain, each as the mean over seeds and half the range between them.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ijepa.nn.position import position_names


def run_summary(log_dir: Path) -> dict[str, float]:
    """Final loss, first and last ``val/knn_top1`` of one TensorBoard run directory."""
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    knn = events.Scalars("val/knn_top1")
    return {
        "loss": statistics.mean(losses[-5:]),
        "knn_start": knn[0].value,
        "knn_end": knn[-1].value,
        "gain": knn[-1].value - knn[0].value,
        "steps": knn[-1].step + 1,
    }


def cell(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """``mean ± half-range`` of ``values`` times ``scale``."""
    scaled = [scale * v for v in values]
    return f"{statistics.mean(scaled):.{digits}f} ± {(max(scaled) - min(scaled)) / 2:.{digits}f}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", help="folder holding pos_<type>_s<seed>/lightning_logs/version_*/")
    parser.add_argument("--names", action="store_true", help="print the image members' names and exit")
    args = parser.parse_args(argv)
    if args.names:
        print(" ".join(position_names(2)))
        return {}
    if args.root is None:
        parser.error("root is required (or --names)")
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run in sorted(Path(args.root).glob("pos_*_s*")):
        match = re.fullmatch(r"pos_(.+)_s(\d+)", run.name)
        versions = sorted((run / "lightning_logs").glob("version_*"))
        if match and versions:
            rows[match.group(1)].append(run_summary(versions[-1]))
    # a run still in progress (or stopped early) would bias its row: keep complete runs only
    final_step = max((r["steps"] for runs in rows.values() for r in runs), default=0)
    for name in list(rows):
        rows[name] = [r for r in rows[name] if r["steps"] == final_step]
        if not rows[name]:
            del rows[name]
    print(
        "| encoder `pos_embed` | seeds | final `train/loss` | `val/knn_top1` step 0 (%) | final (%) | gain (points) |"
    )
    print("|---|---|---|---|---|---|")
    for name in [t for t in position_names(2) if t in rows]:
        runs = rows[name]
        print(
            f"| `{name}` | {len(runs)} | {cell([r['loss'] for r in runs], digits=4)} | "
            f"{cell([r['knn_start'] for r in runs], 100)} | {cell([r['knn_end'] for r in runs], 100)} | "
            f"{cell([r['gain'] for r in runs], 100)} |"
        )
    return dict(rows)


if __name__ == "__main__":
    main()
