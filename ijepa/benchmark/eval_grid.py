"""What a grid of evaluation heads costs against one head:
``python -m ijepa.benchmark.eval_grid [--config configs/quickstart.yaml] [--steps 15]``.

``ijepa eval`` trains a whole grid of heads (learning rate x weight decay x feature choice) in one
pass: each batch goes through the frozen encoder once and every head reads those features
(:meth:`ijepa.evaluation.protocols.HeadGridProtocol.evaluate`). This times one training step of
the ``augment: true`` path (encode a batch, then forward, backward and optimizer step of the
heads) for

* the linear protocol with 1 head, with 8 (4 learning rates x 2 weight decays), and with the
  eval config's linear grid (``configs/eval/quickstart.yaml``: 40 heads);
* the attentive protocol with 1 head and with the eval config's grid (8 heads);
* the cached-features path (no encoder, heads only) of the linear protocol with 1 and 8 heads.

The encoder is the config's target encoder as ``ijepa fit`` builds it, at random init (the time
does not depend on the weights), on random images of its size; data loading and augmentation are
not timed. Every setting runs one step per round, in interleaved rounds, so drift in the machine's
speed hits them alike; the ratio to one head is the median of the per-round ratios. Prints a
markdown table and one JSON line (``EVALGRID {...}``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from types import SimpleNamespace

import torch
import yaml
from lightning.fabric import Fabric

from ijepa.benchmark import time_calls
from ijepa.cli import instantiate
from ijepa.evaluation.context import encode
from ijepa.evaluation.encoders import ViTEncoder
from ijepa.evaluation.protocols import AttentiveProtocol, HeadGridProtocol, LinearProtocol


def eval_config_protocols(path: str) -> tuple[dict, LinearProtocol, AttentiveProtocol]:
    """The eval config's data options and its first linear and attentive protocols."""
    with open(path) as f:
        config = yaml.safe_load(f)
    found = {}
    for entry in config.get("protocols") or []:
        name = entry["class_path"].rpartition(".")[2]
        for cls in (LinearProtocol, AttentiveProtocol):
            if name == cls.__name__ and cls not in found:
                found[cls] = cls(**(entry.get("init_args") or {}))
    missing = [cls.__name__ for cls in (LinearProtocol, AttentiveProtocol) if cls not in found]
    if missing:
        raise ValueError(f"--eval-config {path} has no {' or '.join(missing)} under protocols: nothing to time.")
    return config.get("data") or {}, found[LinearProtocol], found[AttentiveProtocol]


def grid_step(protocol: HeadGridProtocol, ctx, width: int, device: torch.device, batch, total: int):
    """``step(i)``: one training step of ``protocol``'s grids (its own
    :class:`~ijepa.classifiers.HeadGridTrainer`, as ``HeadGridProtocol.evaluate`` takes it), on
    ``batch(i) = (features, labels)``."""
    grids, trainer = protocol.trainer(ctx, width, total)

    def step(i: int) -> None:
        trainer.step(*batch(i))

    return step, len(grids) * len(protocol.points)


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data, eval_linear, eval_attentive = eval_config_protocols(args.eval_config)
    model, datamodule = instantiate(args.config)
    encoder = ViTEncoder(model.target_encoder).to(device)
    del model  # the predictor and the online encoder take no part
    fabric = Fabric(accelerator=device.type, devices=1, precision=args.precision)
    batch_size = args.batch_size or data.get("batch_size") or datamodule.hparams.batch_size
    size = encoder.image_size
    # what grids() and trainer() read of a context
    ctx = SimpleNamespace(encoder=encoder, num_classes=args.num_classes, seed=0, fabric=SimpleNamespace(device=device))

    generator = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(batch_size, 3, size, size, generator=generator).to(device),
            torch.randint(0, args.num_classes, (batch_size,), generator=generator).to(device),
        )
        for _ in range(2)
    ]

    def encoded(kind: str, blocks: int):
        def batch(i: int):
            images, labels = batches[i % len(batches)]
            features = encode(fabric, encoder, images, kind, blocks)
            return (features.flatten(1) if kind == "blocks" else features), labels

        return batch

    # The cached path holds the split's features on the CPU and moves each batch to the device.
    cached = [(encoded("blocks", 1)(i)[0].cpu(), labels) for i, (_, labels) in enumerate(batches)]

    def from_cache(i: int):
        features, labels = cached[i % len(cached)]
        return features.to(device), labels

    linear_1 = LinearProtocol(lrs=[1e-2], weight_decays=[0.0], optimizer=eval_linear.optimizer)
    linear_8 = LinearProtocol(lrs=[1e-3, 3e-3, 1e-2, 3e-2], weight_decays=[0.0, 5e-4], optimizer=eval_linear.optimizer)
    attentive_1 = AttentiveProtocol(
        lrs=eval_attentive.lrs[:1],
        weight_decays=eval_attentive.weight_decays[:1],
        depth=eval_attentive.depth,
        num_heads=eval_attentive.num_heads,
        num_queries=eval_attentive.num_queries,
        optimizer=eval_attentive.optimizer,
    )
    # name: (label, protocol, batches, the 1-head setting it is compared with)
    plan = {
        "linear_1": ("linear", linear_1, None, "linear_1"),
        "linear_8": ("linear, 4 lrs x 2 wds", linear_8, None, "linear_1"),
        "linear_eval": ("linear, eval config's grid", eval_linear, None, "linear_1"),
        "attentive_1": ("attentive", attentive_1, None, "attentive_1"),
        "attentive_eval": ("attentive, eval config's grid", eval_attentive, None, "attentive_1"),
        "cached_linear_1": ("linear, cached features (heads only)", linear_1, from_cache, "cached_linear_1"),
        "cached_linear_8": ("linear, cached features (heads only)", linear_8, from_cache, "cached_linear_1"),
    }
    total = args.warmup + args.steps + 1
    steps, heads = {}, {}
    for name, (_, protocol, batch, _) in plan.items():
        batch = batch or encoded(protocol.feature_kind, protocol.blocks_needed)
        try:
            steps[name], heads[name] = grid_step(protocol, ctx, encoder.width, device, batch, total)
        except ValueError as error:  # a grid of the eval config that does not fit this config's encoder
            raise ValueError(f"--eval-config {args.eval_config} on --config {args.config}: {error}") from error

    times = {name: [] for name in plan}
    for step in steps.values():
        time_calls(step, args.warmup, 0, device)
    for i in range(args.warmup, args.warmup + args.steps):  # interleaved: one step of every setting per round
        for name, step in steps.items():
            times[name] += time_calls(lambda _, step=step, i=i: step(i), 0, 1, device)

    settings = {}
    for name, (label, protocol, batch, reference) in plan.items():
        ratios = [t / r for t, r in zip(times[name], times[reference])]
        settings[name] = {
            "label": label,
            "protocol": protocol.kind,
            "features": "cached" if batch else "encoded",
            "heads": heads[name],
            "ms": 1e3 * statistics.median(times[name]),
            "over_one_head": statistics.median(ratios),
        }
    return {
        "config": args.config,
        "eval_config": args.eval_config,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
        "precision": args.precision,
        "batch_size": batch_size,
        "image_size": size,
        "encoder": {"depth": encoder.depth, "width": encoder.width},
        "num_classes": args.num_classes,
        "steps_timed": args.steps,
        "torch": torch.__version__,
        "settings": settings,
    }


def format_table(result: dict) -> str:
    encoder = result["encoder"]
    lines = [
        f"{result['config']} target encoder (depth {encoder['depth']}, width {encoder['width']}) on "
        f"{result['device']}, {result['precision']}, batch {result['batch_size']} of {result['image_size']} px, "
        f"{result['steps_timed']} interleaved steps",
        "",
        "| setting | heads | ms per step (median) | ratio to 1 head |",
        "|---|---:|---:|---:|",
    ]
    for row in result["settings"].values():
        lines.append(f"| {row['label']} | {row['heads']} | {row['ms']:.1f} | {row['over_one_head']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m ijepa.benchmark.eval_grid",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default="configs/quickstart.yaml", help="the ijepa fit config of the encoder")
    parser.add_argument(
        "--eval-config",
        "--eval_config",
        dest="eval_config",
        default="configs/eval/quickstart.yaml",
        help="the ijepa eval config whose linear and attentive grids are timed",
    )
    parser.add_argument("--steps", type=int, default=15, help="timed steps of every setting, one per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--batch-size",
        "--batch_size",
        dest="batch_size",
        type=int,
        default=None,
        help="images per step (default: the eval config's data.batch_size)",
    )
    parser.add_argument("--num-classes", "--num_classes", dest="num_classes", type=int, default=10)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    args = parser.parse_args(argv)
    for value, name in (
        (args.steps, "--steps"),
        (args.batch_size, "--batch-size"),
        (args.num_classes, "--num-classes"),
    ):
        if value is not None and value < 1:
            parser.error(f"{name} must be >= 1, got {value}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    result = run(args)
    print(format_table(result))
    print("EVALGRID " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
