"""What a grid of segmentation heads costs against one head:
``python -m ijepa.benchmark.eval_dense [--config configs/quickstart.yaml] [--eval-config configs/eval/dense_shapes.yaml] [--steps 15]``.

``ijepa eval``'s segmentation protocol trains its whole grid of heads (learning rate x weight
decay) in one pass (:class:`~ijepa.evaluation.SegmentationProtocol`): each batch's patch tokens
are computed once and every head reads them. This times one training step, as
:mod:`ijepa.benchmark.eval_grid` times the classification grids, for

* the step with the encoder (``augment: true``: encode a batch to patch tokens, then forward,
  backward and optimizer step of the heads) with 1 head and with the eval config's grid (8 heads);
* the heads alone, on cached patch tokens (``augment: false``), with 1 and 8 heads: there the
  bilinear upsampling of every head's logits to the masks and its per-pixel cross-entropy are
  the whole step, so this ratio is nearer the number of heads.

The encoder is the config's target encoder at random init, on random images and random masks
(with ignored pixels) of its size; data loading is not timed. Every setting runs one step per
round, in interleaved rounds; the ratio to one head is the median of the per-round ratios. Prints
a markdown table and one JSON line (``EVALDENSE {...}``).
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
from ijepa.benchmark.eval_grid import grid_step
from ijepa.cli import instantiate
from ijepa.data.batch import IGNORE_INDEX
from ijepa.evaluation.cache import last_blocks_of
from ijepa.evaluation.context import encode
from ijepa.evaluation.dense import SegmentationProtocol
from ijepa.evaluation.encoders import ViTEncoder


def eval_config_segmentation(path: str) -> tuple[dict, SegmentationProtocol]:
    """The eval config's data options and its first segmentation protocol."""
    with open(path) as f:
        config = yaml.safe_load(f)
    for entry in config.get("protocols") or []:
        if entry["class_path"].rpartition(".")[2] == SegmentationProtocol.__name__:
            return config.get("data") or {}, SegmentationProtocol(**(entry.get("init_args") or {}))
    raise ValueError(f"--eval-config {path} has no SegmentationProtocol under protocols: nothing to time.")


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data, eval_segmentation = eval_config_segmentation(args.eval_config)
    model, datamodule = instantiate(args.config)
    encoder = ViTEncoder(model.target_encoder).to(device)
    del model
    fabric = Fabric(accelerator=device.type, devices=1, precision=args.precision)
    batch_size = args.batch_size or data.get("batch_size") or datamodule.hparams.batch_size
    size, blocks = encoder.image_size, eval_segmentation.last_blocks
    if blocks > encoder.depth:
        raise ValueError(
            f"--eval-config {args.eval_config}: last_blocks {blocks} > the encoder's depth {encoder.depth}."
        )
    ctx = SimpleNamespace(encoder=encoder, seed=0, fabric=SimpleNamespace(device=device))

    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):
        images = torch.randn(batch_size, 3, size, size, generator=generator)
        masks = torch.randint(0, args.num_classes, (batch_size, size, size), generator=generator)
        masks[torch.rand(batch_size, size, size, generator=generator) < 0.05] = IGNORE_INDEX
        batches.append((images.to(device), masks.to(device)))

    def encoded(i: int):
        images, masks = batches[i % len(batches)]
        return last_blocks_of(encode(fabric, encoder, images, "patches", blocks), "patches", blocks), masks

    cached = [(encoded(i)[0].cpu(), masks) for i, (_, masks) in enumerate(batches)]

    def from_cache(i: int):
        features, masks = cached[i % len(cached)]
        return features.to(device), masks

    def like(protocol: SegmentationProtocol, lrs, weight_decays) -> SegmentationProtocol:
        options = {key: getattr(protocol, key) for key in ("last_blocks", "batch_norm", "optimizer")}
        return SegmentationProtocol(lrs=lrs, weight_decays=weight_decays, **options)

    one = like(eval_segmentation, eval_segmentation.lrs[:1], eval_segmentation.weight_decays[:1])
    for protocol in (one, eval_segmentation):
        protocol._classes = args.num_classes  # what evaluate() reads from the masks
    # name: (label, protocol, batches, the 1-head setting it is compared with)
    plan = {
        "segmentation_1": ("segmentation, encoder + heads", one, encoded, "segmentation_1"),
        "segmentation_eval": (
            "segmentation, eval config's grid, encoder + heads",
            eval_segmentation,
            encoded,
            "segmentation_1",
        ),
        "cached_segmentation_1": (
            "segmentation, cached patch tokens (heads only)",
            one,
            from_cache,
            "cached_segmentation_1",
        ),
        "cached_segmentation_eval": (
            "segmentation, eval config's grid, cached patch tokens (heads only)",
            eval_segmentation,
            from_cache,
            "cached_segmentation_1",
        ),
    }
    total = args.warmup + args.steps + 1
    steps, heads = {}, {}
    for name, (_, protocol, batch, _) in plan.items():
        steps[name], heads[name] = grid_step(protocol, ctx, encoder.width, device, batch, total)

    times = {name: [] for name in plan}
    for step in steps.values():
        time_calls(step, args.warmup, 0, device)
    for i in range(args.warmup, args.warmup + args.steps):  # interleaved: one step of every setting per round
        for name, step in steps.items():
            times[name] += time_calls(lambda _, step=step, i=i: step(i), 0, 1, device)

    settings = {}
    for name, (label, _, batch, reference) in plan.items():
        ratios = [t / r for t, r in zip(times[name], times[reference])]
        settings[name] = {
            "label": label,
            "features": "cached" if batch is from_cache else "encoded",
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
        "encoder": {"depth": encoder.depth, "width": encoder.width, "grid": list(encoder.token_grid)},
        "num_classes": args.num_classes,
        "last_blocks": blocks,
        "steps_timed": args.steps,
        "torch": torch.__version__,
        "settings": settings,
    }


def format_table(result: dict) -> str:
    encoder = result["encoder"]
    lines = [
        f"{result['config']} target encoder (depth {encoder['depth']}, width {encoder['width']}, "
        f"{encoder['grid'][0]} x {encoder['grid'][1]} tokens) on {result['device']}, {result['precision']}, batch "
        f"{result['batch_size']} of {result['image_size']} px, {result['num_classes']} classes, "
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
        prog="python -m ijepa.benchmark.eval_dense",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default="configs/quickstart.yaml", help="the ijepa fit config of the encoder")
    parser.add_argument(
        "--eval-config",
        "--eval_config",
        dest="eval_config",
        default="configs/eval/dense_shapes.yaml",
        help="the ijepa eval config whose segmentation grid is timed",
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
    parser.add_argument(
        "--num-classes", "--num_classes", dest="num_classes", type=int, default=11, help="mask classes (background too)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    args = parser.parse_args(argv)
    for value, name in ((args.steps, "--steps"), (args.batch_size, "--batch-size")):
        if value is not None and value < 1:
            parser.error(f"{name} must be >= 1, got {value}")
    if args.num_classes < 2:
        parser.error(f"--num-classes must be >= 2, got {args.num_classes}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    result = run(args)
    print(format_table(result))
    print("EVALDENSE " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
