"""The supervised reference of the learning ablation: what the same encoder reaches with labels.

A probe gain means little without a ceiling: "+6.5 k-NN points in 600 steps" is a lot on a data
set where labels buy +10 in the same steps and little where they buy +60. This study builds the
model and data of a config exactly as ``ijepa fit`` would (:func:`ijepa.cli.instantiate`), trains
the online encoder of the model with a linear head on its mean-pooled features (cross-entropy on
the labelled train split, the config's batch size, number of steps, learning-rate warm-up and
cosine and AdamW betas; ``model.optim.weight_decay``, held constant, on every weight of two or more
dimensions), and scores it with the same k-NN and linear probes as the
JEPA runs (:mod:`ijepa.callbacks.knn`, :mod:`ijepa.callbacks.linear`) at step 0 and at the end::

    python -m ijepa.studies.supervised_reference --seeds 0 1 2
    python -m ijepa.studies.supervised_reference --seeds 0 --extra '--data.source.num_objects=[1,1]'

It prints a Markdown table (the mean over seeds, and the worst seed's gain) and writes each
seed's figures to ``--output`` (JSON). The images go through the config's evaluation transform
(resize and centre crop, no augmentation: what the quickstart's training transform is too).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path
from unittest import mock

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ijepa.callbacks.knn import KNNProbe
from ijepa.callbacks.linear import LinearProbe
from ijepa.callbacks.probe import extract_features
from ijepa.cli import build_cli
from ijepa.module import IJEPA
from ijepa.schedules import warmup_cosine_schedule


def probe_scores(model: IJEPA, datamodule) -> dict[str, float]:
    """``knn_top1`` and ``linear_top1`` in [0, 1] of the model's online encoder, scored by the
    probe callbacks' own :meth:`~ijepa.callbacks.probe.Probe.score` at their defaults (bank: the
    labelled train split; queries: the held-out split)."""
    model.eval()
    bank, bank_labels = extract_features(None, model, datamodule.probe_train_dataloader(), encoder="online")
    queries, query_labels = extract_features(None, model, datamodule.probe_test_dataloader(), encoder="online")
    model.train()
    data = (bank, bank_labels, queries, query_labels, datamodule.num_classes)
    return {"knn_top1": KNNProbe().score(*data), "linear_top1": LinearProbe().score(*data)}


def train_supervised(model: IJEPA, datamodule, steps: int, seed: int) -> dict[str, float]:
    """Train ``model.encoder`` plus a linear head with labels for ``steps`` optimizer steps; the
    probe scores at step 0 and at the end, the first and the last training loss and the wall time."""
    hp, opt = model.hparams, model.optim
    encoder = model.encoder
    head = torch.nn.Linear(hp.embed_dim, datamodule.num_classes)
    params = [p for p in [*encoder.parameters(), *head.parameters()] if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=opt.lr,
        betas=opt.betas,
    )
    bank = datamodule.probe_train_dataloader()
    loader = DataLoader(
        bank.dataset,
        batch_size=datamodule.hparams.batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=bank.collate_fn,
        generator=torch.Generator().manual_seed(seed),
    )
    result = {f"{name}_0": value for name, value in probe_scores(model, datamodule).items()}
    start, step, losses = time.perf_counter(), 0, []
    while step < steps:
        for batch in loader:
            lr = warmup_cosine_schedule(step, steps, min(opt.warmup_steps, steps), opt.lr, opt.final_lr, opt.start_lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(head(encoder(batch.images).mean(1)), batch.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step == steps:
                break
    result |= {f"{name}_end": value for name, value in probe_scores(model, datamodule).items()}
    return result | {
        "loss_0": losses[0],
        "loss_end": losses[-1],
        "train_s": time.perf_counter() - start,
        "steps": steps,
    }


def table(runs: list[dict[str, float]]) -> str:
    """One Markdown row: k-NN and linear (%) at step 0 and the end, mean over seeds, and the gain
    with the worst seed's in brackets."""

    def mean(key: str) -> float:
        return 100 * statistics.mean(r[key] for r in runs)

    def gain(metric: str) -> str:
        gains = [100 * (r[f"{metric}_end"] - r[f"{metric}_0"]) for r in runs]
        return f"{statistics.mean(gains):.1f} ({min(gains):.1f})"

    return "\n".join(
        [
            "| encoder trained with labels | seeds | k-NN % step 0 / end | k-NN gain (min) | "
            "linear % step 0 / end | linear gain (min) |",
            "|---|---|---|---|---|---|",
            f"| supervised, {runs[0]['steps']} steps | {len(runs)} | {mean('knn_top1_0'):.1f} / "
            f"{mean('knn_top1_end'):.1f} | {gain('knn_top1')} | {mean('linear_top1_0'):.1f} / "
            f"{mean('linear_top1_end'):.1f} | {gain('linear_top1')} |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="default: the config's trainer.max_steps")
    parser.add_argument("--extra", default="", help="more overrides, e.g. '--data.source.num_objects=[1,1]'")
    parser.add_argument("--output", type=Path, default=Path("runs/supervised_reference.json"))
    args = parser.parse_args(argv)
    runs = []
    for seed in args.seeds:
        L.seed_everything(seed, verbose=False)
        overrides = [f"--seed_everything={seed}", "--data.num_workers=0", *shlex.split(args.extra)]
        model, datamodule, max_steps = built(args.config, overrides)
        datamodule.setup("fit")
        steps = args.steps or max_steps
        if steps < 1:
            raise ValueError(f"--steps must be >= 1 when {args.config} sets no trainer.max_steps, got {steps}.")
        runs.append({"seed": seed, **train_supervised(model, datamodule, steps, seed)})
        print(json.dumps(runs[-1]), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(runs, indent=1))
    print(table(runs))


def built(config: str, overrides: list[str]) -> tuple[IJEPA, L.LightningDataModule, int]:
    """The model and data module of ``ijepa fit --config config [overrides]`` (nothing run), and
    the config's ``trainer.max_steps`` (-1 when it sets none)."""
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["--config", config, *overrides, "--trainer.logger=false"], run=False)
    return cli.model, cli.datamodule, cli.trainer.max_steps


if __name__ == "__main__":
    main()
