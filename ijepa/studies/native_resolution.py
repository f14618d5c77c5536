"""Fixed grid, FlexiViT or native resolution: which pretraining probes best at other image and
patch sizes, for the same wall time?

    python -m ijepa.studies.native_resolution --seconds 180 --seeds 0 1

For each recipe and seed it pretrains the quickstart (``configs/quickstart.yaml``) for the same
wall time: a short pilot run times the recipe's training step, and the run gets as many steps as
fit in ``--seconds`` (each recipe's schedules complete, so none is cut mid-decay). The recipes:

* ``fixed``: every image 48 px at patch 8 (6x6 grid), the quickstart as it is;
* ``flexivit``: ``configs/resolution/flexivit.yaml``, a patch size per batch from 6, 8, 12;
* ``native``: ``configs/resolution/native_resolution.yaml``, images of 3 to 6 patches per side, packed.

Validation and probes are off during training; afterwards the last checkpoint is loaded at each
``--image-sizes`` (patch 8) and each ``--patch-sizes`` (48 px), adapted on load as
``ijepa validate`` would (:func:`ijepa.studies.resolution.load_at`), and scored with the k-NN
probe of :class:`ijepa.callbacks.KNNProbe`. Prints a Markdown table (mean and half-range over the
seeds) and writes every value to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import lightning as L
import torch

from ijepa.cli import IJEPACLI
from ijepa.data.datamodule import IJEPADataModule
from ijepa.data.sources import source_from_config
from ijepa.legacy import upgrade_data_hparams
from ijepa.masks import MultiBlockMasks
from ijepa.module import IJEPA
from ijepa.studies.resolution import knn_top1, load_at

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = {
    "fixed": [],
    "flexivit": ["--config", str(CONFIGS / "resolution" / "flexivit.yaml")],
    "native": ["--config", str(CONFIGS / "resolution" / "native_resolution.yaml")],
}
# training only: the EMA update and the last checkpoint (no validation, no probes)
CALLBACKS = json.dumps(
    [
        {
            "class_path": "ijepa.callbacks.EMATargetUpdate",
            "init_args": {"momentum": 0.99, "final_momentum": 1.0},
        },
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
    ]
)


class StepTimer(L.Callback):
    """Seconds of each training batch (optimizer step included), for the pilot run."""

    def __init__(self):
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)


def fit(recipe: str, seed: int, steps: int, folder: Path, extra: list[str] = ()) -> IJEPACLI:
    args = ["fit", "--config", str(CONFIGS / "quickstart.yaml"), *RECIPES[recipe], f"--seed_everything={seed}"]
    args += [f"--trainer.callbacks={CALLBACKS}", "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0"]
    args += [
        f"--trainer.max_steps={steps}",
        f"--trainer.default_root_dir={folder}",
        "--trainer.enable_progress_bar=false",
    ]
    args += ["--trainer.enable_model_summary=false", *extra]
    with mock.patch("sys.argv", ["ijepa"]):
        return IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)


def seconds_per_step(recipe: str, seed: int, folder: Path, steps: int = 30, skip: int = 10) -> float:
    """Median seconds of a training step of ``recipe`` (a pilot run; the first ``skip`` steps
    warm up)."""
    timer = '{"class_path": "ijepa.studies.native_resolution.StepTimer"}'
    cli = fit(recipe, seed, steps, folder / f"pilot_{recipe}_{seed}", [f"--trainer.callbacks+={timer}"])
    # by name: under `python -m` this module is __main__, and the CLI built the importable class
    times = next(c for c in cli.trainer.callbacks if type(c).__name__ == "StepTimer").times
    return statistics.median(times[skip:])


def probe(path: Path, image_sizes: list[int], patch_sizes: list[int]) -> dict[str, float]:
    """k-NN top-1 of a checkpoint at each image size (its patch size) and each patch size (its
    image size)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    data = {
        k: v
        for k, v in upgrade_data_hparams(checkpoint["datamodule_hyper_parameters"]).items()
        if not k.startswith("_")
    }
    for key in ("source", "probe_source"):
        if data.get(key) is not None:
            data[key] = source_from_config(data[key])
    # the probe reads plain images: no FlexiViT or native batches, masks unused (min_keep=1)
    data.update(num_workers=0, masks=MultiBlockMasks(min_keep=1), train_patch_sizes=None, native_sides=None)
    data.update(token_budget=None, token_drop=0)
    base_size, base_patch = data["image_size"], checkpoint["hyper_parameters"]["patch_size"]
    scores = {}
    for key, image_size, patch_size in [(f"{s}px", s, base_patch) for s in image_sizes] + [
        (f"p{p}", base_size, p) for p in patch_sizes
    ]:
        datamodule = IJEPADataModule(**{**data, "image_size": image_size, "patch_size": patch_size})
        datamodule.setup("validate")
        scores[key] = knn_top1(load_at(checkpoint, image_size, patch_size), datamodule)
    return scores


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180.0, help="training wall time of every run")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--image-sizes", nargs="+", type=int, default=[32, 48, 64])
    parser.add_argument("--patch-sizes", nargs="+", type=int, default=[6, 12])
    parser.add_argument("--output", default="native_resolution.json")
    parser.add_argument("--pilot-steps", type=int, default=30)
    args = parser.parse_args(argv)

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for recipe in args.recipes:
            for seed in args.seeds:
                step_time = seconds_per_step(recipe, seed, folder, args.pilot_steps, skip=args.pilot_steps // 3)
                steps = max(int(args.seconds / step_time), 1)
                start = time.perf_counter()
                cli = fit(recipe, seed, steps, folder / f"{recipe}_{seed}")
                wall = time.perf_counter() - start
                scores = probe(
                    Path(cli.trainer.checkpoint_callback.last_model_path), args.image_sizes, args.patch_sizes
                )
                results[f"{recipe}/{seed}"] = {"steps": steps, "step_s": step_time, "fit_s": wall, **scores}
                print(f"{recipe:9s} seed {seed}: {steps} steps ({step_time:.3f} s/step, fit {wall:.0f} s) {scores}")
    columns = [f"{s}px" for s in args.image_sizes] + [f"p{p}" for p in args.patch_sizes]
    header = "| recipe | steps | " + " | ".join(columns) + " |"
    lines = [header, "|---|---|" + "---|" * len(columns)]
    for recipe in args.recipes:
        runs = [results[f"{recipe}/{seed}"] for seed in args.seeds]
        cells = []
        for column in columns:
            values = [100 * run[column] for run in runs]
            cells.append(f"{statistics.mean(values):.1f} ± {(max(values) - min(values)) / 2:.1f}")
        steps = "/".join(str(run["steps"]) for run in runs)
        lines.append(f"| {recipe} | {steps} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    with open(args.output, "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
