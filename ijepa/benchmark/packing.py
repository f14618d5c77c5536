"""Native-resolution packing against padding to the largest image, on one training step.

    python -m ijepa.benchmark.packing --config configs/quickstart.yaml --config-overlay configs/resolution/native_resolution.yaml

For one config with ``data.native_sides`` it takes ``--batches`` pretraining batches of the
config's own data and augmentation (images of mixed sizes and aspect ratios, masks per image) and
lays each out twice with the same images and masks:

* packed: several images per sequence up to ``data.token_budget`` slots (what training does);
* padded: one image per sequence, padded to the batch's largest image.

It checks that both give the same JEPA loss (the layout changes no math), then times the full
training step (forward, backward, AdamW) in interleaved rounds and reports images/s, the ratio
and the share of slots that hold a token. Figures are for comparison within one run.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from ijepa.cli import instantiate
from ijepa.data.batch import PackedBatch
from ijepa.data.sampling import SeededSamples


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def layouts(datamodule, count: int, seed: int = 0) -> tuple[list[PackedBatch], list[PackedBatch]]:
    """``count`` batches of the config's pretraining data, packed and padded (same images, masks)."""
    packed_collate = datamodule.native_collators["train"]
    padded_collate = copy.copy(packed_collate)
    padded_collate.packing = False
    data = SeededSamples(datamodule.split("pretrain"), seed)
    size = datamodule.hparams.batch_size
    samples = [[data[(b * size + i, 0)] for i in range(size)] for b in range(count)]
    return [packed_collate(s) for s in samples], [padded_collate(s) for s in samples]


def slot_use(batches: list[PackedBatch]) -> float:
    """Share of the target encoder's sequence slots that hold a token."""
    real = sum(int(b.full.real.sum()) for b in batches)
    return real / sum(b.full.image_ids.numel() for b in batches)


def run(args: argparse.Namespace, overrides: list[str]) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config_args = ["--config", args.config_overlay] if args.config_overlay else []
    model, datamodule = instantiate(args.config, [*config_args, *overrides, "--data.num_workers=0"])
    if datamodule.native_collators is None:
        raise ValueError(
            "the config has no data.native_sides: nothing to pack (add configs/resolution/native_resolution.yaml)."
        )
    datamodule.setup("fit")
    packed, padded = layouts(datamodule, args.batches)
    packed, padded = move_data_to_device((packed, padded), device)
    model.to(device).train()
    model.setup("fit")
    # The regularisers draw a random subset of the real context tokens, in slot order: compare the
    # JEPA part
    with torch.no_grad(), model.regularisers_off():
        losses = float(model.jepa_loss(packed[0])), float(model.jepa_loss(padded[0]))
    optimizer = model.build_optimizer()

    def step(batch) -> None:
        loss = model.jepa_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    times = {"packed": [], "padded": []}
    for batches in (packed, padded):  # warm-up
        for batch in batches[: args.warmup]:
            step(batch)
    for _ in range(args.rounds):
        for name, batches in (("packed", packed), ("padded", padded)):
            for batch in batches:
                _sync(device)
                start = time.perf_counter()
                step(batch)
                _sync(device)
                times[name].append(time.perf_counter() - start)
    size = datamodule.hparams.batch_size
    result = {
        "config": [args.config, args.config_overlay, *overrides],
        "device": str(device),
        "batch_size": size,
        "native_sides": list(datamodule.hparams.native_sides),
        "token_budget": datamodule.native_collators["train"].budget,
        "loss_packed": losses[0],
        "loss_padded": losses[1],
        "sequences_packed": statistics.mean(b.full.image_ids.size(0) for b in packed),
        "sequences_padded": statistics.mean(b.full.image_ids.size(0) for b in padded),
        "slot_use_packed": slot_use(packed),
        "slot_use_padded": slot_use(padded),
    }
    for name in times:
        result[f"images_per_s_{name}"] = size / statistics.median(times[name])
    result["speedup"] = result["images_per_s_packed"] / result["images_per_s_padded"]
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument(
        "--config-overlay", default=None, help="a second config on top (configs/resolution/native_resolution.yaml)"
    )
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, each timed once per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default=None)
    args, overrides = parser.parse_known_args(argv)
    result = run(args, overrides)
    if abs(result["loss_packed"] - result["loss_padded"]) > 1e-4 * max(1.0, abs(result["loss_padded"])):
        raise AssertionError(f"packed and padded layouts disagree on the loss: {result}")
    print(
        f"packed: {result['images_per_s_packed']:.1f} images/s, {result['sequences_packed']:.1f} sequences/batch, "
        f"{100 * result['slot_use_packed']:.0f}% of slots used\n"
        f"padded: {result['images_per_s_padded']:.1f} images/s, {result['sequences_padded']:.1f} sequences/batch, "
        f"{100 * result['slot_use_padded']:.0f}% of slots used\n"
        f"packing / padding: {result['speedup']:.2f}x; same loss ({result['loss_packed']:.6f} vs {result['loss_padded']:.6f})"
    )
    print("BENCHMARK " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
