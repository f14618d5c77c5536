"""The fine-tuning step against timm's ``VisionTransformer`` of the same size and recipe:
``python -m ijepa.benchmark.finetune [--config configs/finetune/quickstart.yaml] [--steps 20]``.

One training step of ``ijepa finetune`` (:class:`~ijepa.finetune.module.FineTuner`: forward of the
encoder and the mean-pool head, soft-target cross-entropy, backward, AdamW with layer-wise lr
decay over its parameter groups) and the same step of ``timm.models.vision_transformer.VisionTransformer``
built to compute the same function (no class token, average pooling, no ``fc_norm``, the same
width, depth, heads, patch, drop path), its optimizer from timm's own ``create_optimizer_v2`` with
the same ``layer_decay`` and weight decay. Both start from the same weights (timm's loaded from
ours by :func:`ijepa.interop.timm_vit.encoder_to_timm`), and the script first checks they give the
same logits in eval mode. Random images and soft targets of the config's size and batch; data
loading is not timed. The two steps alternate in rounds, so drift in the machine's speed hits
both alike; the ratio is the median of the per-round ratios (timm's time / ours: above 1, ours is
faster). ``--compile`` times both under ``torch.compile`` as well. Prints a markdown table and
one JSON line (``FINETUNE {...}``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch
import torch.nn.functional as F
import yaml

from ijepa.benchmark import time_calls
from ijepa.config_paths import read_from
from ijepa.evaluation.encoders import architecture_options
from ijepa.finetune.module import FineTuner
from ijepa.finetune.recipe import FinetuneOptim, build_optimizer
from ijepa.interop.timm_vit import encoder_to_timm


def config_options(path: str) -> tuple[dict, dict]:
    """The finetune config's ``model`` and ``data`` sections (a relative ``model.architecture``
    read from the config's folder, as ``ijepa finetune`` reads it)."""
    with open(path) as f:
        config = yaml.safe_load(f)
    model = config.get("model") or {}
    if isinstance(model.get("architecture"), str):
        model["architecture"] = read_from(path, model["architecture"])
    return model, config.get("data") or {}


def build_pair(model_options: dict, image_size: int, num_classes: int, device: torch.device):
    """Our FineTuner (random init, the config's architecture, ``pos_embed: learned`` so that timm
    holds it) and the timm ViT with the same weights."""
    try:
        from timm.models.vision_transformer import VisionTransformer as TimmViT
    except ImportError:
        raise ImportError("the fine-tuning benchmark compares with timm: pip install timm") from None
    architecture = model_options.get("architecture") or "configs/quickstart.yaml"
    options = {**architecture_options(architecture), "image_size": image_size, "pos_embed": "learned"}
    drop_path = float(model_options.get("drop_path_rate", 0.1))
    ours = FineTuner(architecture=options, num_classes=num_classes, drop_path_rate=drop_path).to(device)
    args, state = encoder_to_timm(ours.encoder)
    args.update(num_classes=num_classes, drop_path_rate=drop_path)
    theirs = TimmViT(**args).to(device)
    state.update({"head.weight": ours.head.head.weight, "head.bias": ours.head.head.bias})
    theirs.load_state_dict(state, strict=True)
    return ours, theirs


def check_same_function(ours, theirs, images: torch.Tensor) -> float:
    """The largest logit difference in eval mode; both must compute the same function."""
    ours.eval(), theirs.eval()
    with torch.no_grad():
        difference = (ours(images) - theirs(images)).abs().max().item()
    ours.train(), theirs.train()
    if difference > 1e-3:
        raise AssertionError(f"ours and timm's ViT differ by {difference:.2e} in logits: not the same model")
    return difference


def step_of(model, optimizer, forward):
    def step(batch) -> None:
        images, targets = batch
        loss = F.cross_entropy(forward(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run(args: argparse.Namespace) -> dict:
    from timm.optim import create_optimizer_v2

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model_options, data = config_options(args.config)
    image_size = int(data.get("image_size", 48))
    batch_size = args.batch_size or int(data.get("batch_size", 128))
    ours, theirs = build_pair(model_options, image_size, args.num_classes, device)
    optim = FinetuneOptim.of(model_options.get("optim"))
    our_optimizer = build_optimizer(ours, ours.depth, optim, device)
    their_optimizer = create_optimizer_v2(
        theirs,
        opt="adamw",
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        layer_decay=optim.layer_decay,
        betas=optim.betas,
    )
    generator = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(batch_size, 3, image_size, image_size, generator=generator).to(device),
            torch.softmax(torch.randn(batch_size, args.num_classes, generator=generator), -1).to(device),
        )
        for _ in range(2)
    ]
    difference = check_same_function(ours, theirs, batches[0][0][:8])
    steps = {
        "ours": step_of(ours, our_optimizer, ours),
        "timm": step_of(theirs, their_optimizer, theirs),
    }
    if args.compile:
        steps["ours, compiled"] = step_of(ours, our_optimizer, torch.compile(ours))
        steps["timm, compiled"] = step_of(theirs, their_optimizer, torch.compile(theirs))
    for step in steps.values():
        time_calls(lambda i, step=step: step(batches[i % 2]), args.warmup, 0, device)
    times = {name: [] for name in steps}
    for i in range(args.steps):  # interleaved rounds: one step of each per round
        for name, step in steps.items():
            times[name] += time_calls(lambda _, step=step, i=i: step(batches[i % 2]), 0, 1, device)
    pairs = [("ours", "timm")] + ([("ours, compiled", "timm, compiled")] if args.compile else [])
    ratios = {
        f"{theirs_name} / {ours_name}": statistics.median(t / o for o, t in zip(times[ours_name], times[theirs_name]))
        for ours_name, theirs_name in pairs
    }
    result = {
        "config": args.config,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "image_size": image_size,
        "max_logit_difference": difference,
        "ms_per_step": {name: 1000 * statistics.median(t) for name, t in times.items()},
        "images_per_s": {name: batch_size / statistics.median(t) for name, t in times.items()},
        "ratios": ratios,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    lines = ["| step | ms (median) | images/s | timm / ours |", "|---|---|---|---|"]
    for name in steps:
        ratio = next((f"{value:.2f}x" for key, value in ratios.items() if key.endswith(f"/ {name}")), "")
        lines.append(f"| {name} | {result['ms_per_step'][name]:.1f} | {result['images_per_s'][name]:.0f} | {ratio} |")
    print("\n".join(lines))
    print("FINETUNE " + json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/finetune/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=20, help="timed rounds (one step of each model per round)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, help="default: the config's data.batch_size")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="also time both under torch.compile")
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
