"""A plain PyTorch fine-tuning loop over a timm export: the outsider's reference that ``ijepa
finetune`` is measured against (issue 73).

No Lightning and no ``ijepa.finetune``: the encoder is ``ijepa convert CKPT DIR timm`` loaded by
``timm.create_model("local-dir:DIR", pretrained=True)``, or timm's own initialisation of the same
architecture (``--start timm-init``: a fair scratch). The recipe is read from an ``ijepa finetune``
config (``model.optim``, ``model.drop_path_rate``, ``data.*``), so both loops train what the config
says: AdamW with MAE's layer-wise lr decay (timm names: ``patch_embed`` and ``pos_embed`` layer 0,
``blocks.i`` layer ``i + 1``, the rest the top), no weight decay on 1-d tensors and ``pos_embed``,
linear warm-up then cosine, label-smoothed cross-entropy, random resized crop and flip, mean-pool
head. Only the splits come from the project (:class:`ijepa.finetune.FinetuneData`'s, so both loops
train, validate and test on the same images). Validation every ``--val-every`` steps; the result
is test top-1 at the best validation step (the first, on ties)::

    python -m ijepa.studies.plain_finetune --config configs/finetune/quickstart.yaml \\
        --checkpoint runs/pretrain_s{seed}/lightning_logs/version_0/checkpoints/last.ckpt --seeds 0 1 2 \\
        --starts pretrained timm-init --out runs/plain

Results: ``<out>/<start>_lr<lr>_f<fraction>_s<seed>.json``; a rerun skips what is done.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torchvision.transforms import v2

from ijepa.data.sources import DataSource
from ijepa.finetune.data import FinetuneData
from ijepa.registry import from_config


def recipe(config: Path) -> dict:
    """The fine-tuning recipe of an ``ijepa finetune`` config, as plain values."""
    cfg = yaml.safe_load(Path(config).read_text())
    model, data, trainer = cfg["model"], cfg["data"], cfg["trainer"]
    optim = model.get("optim") or {}
    head = (model.get("head") or {}).get("init_args") or {}
    return {
        "lr": float(optim.get("lr", 1e-3)),
        "start_lr": float(optim.get("start_lr", 0.0)),
        "final_lr": float(optim.get("final_lr", 1e-6)),
        "warmup_steps": int(optim.get("warmup_steps", 100)),
        "weight_decay": float(optim.get("weight_decay", 0.05)),
        "layer_decay": float(optim.get("layer_decay", 0.75)),
        "drop_path_rate": float(model.get("drop_path_rate", 0.1)),
        "head_init_std": float(head.get("init_std", 0.02)),
        "steps": int(trainer["max_steps"]),
        "batch_size": int(data.get("batch_size", 128)),
        "crop_scale": tuple(data.get("crop_scale") or (0.08, 1.0)),
        "label_smoothing": float(data.get("label_smoothing", 0.1)),
        "data": data,
    }


def finetune_data(data: dict, source_root: str | None):
    """A :class:`ijepa.finetune.FinetuneData` of the config's data (its images rendered once; the
    splits of each seed and label fraction are :func:`splits` of it)."""
    source = dict(data["source"])
    if source_root is not None:
        source["init_args"] = {**source.get("init_args", {}), "root": source_root}
    return FinetuneData(
        source=from_config(source, DataSource),
        image_size=data.get("image_size", 48),
        val_fraction=data.get("val_fraction", 0.1),
        num_workers=0,
    )


def splits(base, seed: int, label_fraction: float):
    """``(train x [N, 3, H, W], train y, val x, val y, test x, test y, classes)``: the images
    ``ijepa finetune --data.seed <seed> --data.label_fraction <f>`` trains, validates and tests on
    (under the eval transform: normalised, un-augmented)."""
    hp = base.hparams
    module = FinetuneData(
        source=base.source, image_size=hp.image_size, val_fraction=hp.val_fraction,
        label_fraction=label_fraction, seed=seed, num_workers=0,
    )  # fmt: skip
    module.images = base.images  # the images already rendered
    module.setup("fit")
    train_set = module.images.dataset("train", hp.image_size)
    test_set = module.images.dataset("test", hp.image_size)

    def stack(dataset, indices):
        items = [dataset[int(i)] for i in indices]
        return torch.stack([x for x, _ in items]), torch.tensor([int(y) for _, y in items])

    return (
        *stack(train_set, module.indices["train"]),
        *stack(train_set, module.indices["val"]),
        *stack(test_set, range(len(test_set))),
        module.num_classes,
    )


def timm_model(start: str, folder: Path, num_classes: int, drop_path_rate: float, head_init_std: float):
    """timm's ViT from the export (``pretrained``) or timm's own init of its architecture."""
    import timm

    if start == "pretrained":
        model = timm.create_model(
            f"local-dir:{folder}", pretrained=True, num_classes=num_classes, drop_path_rate=drop_path_rate
        )
    else:
        args = {**json.loads((folder / "config.json").read_text())["model_args"], "num_classes": num_classes}
        model = timm.create_model("vit_base_patch16_224", pretrained=False, drop_path_rate=drop_path_rate, **args)
    torch.nn.init.trunc_normal_(model.head.weight, std=head_init_std)
    torch.nn.init.zeros_(model.head.bias)
    return model


def param_groups(model, depth: int, lr: float, layer_decay: float, weight_decay: float) -> list[dict]:
    """MAE's ``param_groups_lrd`` over timm's names."""
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        if name.startswith(("patch_embed", "pos_embed", "cls_token")):
            layer = 0
        elif name.startswith("blocks."):
            layer = int(name.split(".")[1]) + 1
        else:
            layer = depth + 1
        decayed = param.ndim > 1 and name != "pos_embed"
        scale = layer_decay ** (depth + 1 - layer)
        group = groups.setdefault(
            (layer, decayed),
            {"params": [], "lr": lr * scale, "lr_scale": scale, "weight_decay": weight_decay if decayed else 0.0},
        )
        group["params"].append(param)
    return list(groups.values())


def schedule(step: int, r: dict) -> float:
    """Linear warm-up from ``start_lr`` to ``lr``, then cosine to ``final_lr``."""
    warmup = min(r["warmup_steps"], r["steps"])
    if step < warmup:
        return r["start_lr"] + (r["lr"] - r["start_lr"]) * step / warmup
    progress = (step - warmup) / max(1, r["steps"] - warmup)
    return r["final_lr"] + 0.5 * (r["lr"] - r["final_lr"]) * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def accuracy(model, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    model.eval()
    right = sum(int((model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum()) for i in range(0, len(x), batch))
    model.train()
    return right / len(x)


def train(model, data, r: dict, seed: int, val_every: int) -> dict:
    train_x, train_y, val_x, val_y, test_x, test_y = data
    depth = len(model.blocks)
    optimizer = torch.optim.AdamW(param_groups(model, depth, r["lr"], r["layer_decay"], r["weight_decay"]))
    augment = v2.Compose([v2.RandomResizedCrop(train_x.shape[-1], scale=r["crop_scale"], antialias=True),
                          v2.RandomHorizontalFlip()])  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    order, cursor, best, curve = torch.randperm(len(train_x), generator=generator), 0, (-1.0, 0, 0.0), []
    start = time.perf_counter()
    model.train()
    for step in range(r["steps"]):
        for group in optimizer.param_groups:
            group["lr"] = schedule(step, r) * group["lr_scale"]
        if cursor + r["batch_size"] > len(order):
            order, cursor = torch.randperm(len(train_x), generator=generator), 0
        index = order[cursor : cursor + r["batch_size"]]
        cursor += r["batch_size"]
        images = torch.stack([augment(image) for image in train_x[index]])
        loss = F.cross_entropy(model(images), train_y[index], label_smoothing=r["label_smoothing"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % val_every == 0 or step + 1 == r["steps"]:
            val, test = accuracy(model, val_x, val_y), accuracy(model, test_x, test_y)
            curve.append({"step": step + 1, "val_top1": val, "test_top1": test, "loss": loss.item()})
            if val > best[0]:
                best = (val, step + 1, test)
    return {"val_top1": best[0], "step": best[1], "test_top1": best[2], "curve": curve,
            "fit_seconds": time.perf_counter() - start}  # fmt: skip


def export(checkpoint: str, folder: Path) -> None:
    """``ijepa convert CHECKPOINT FOLDER timm`` as an outsider runs it."""
    command = [sys.executable, "-m", "ijepa", "convert", checkpoint, str(folder), "timm", "--overwrite=true"]
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def result_name(start: str, lr: float, fraction: float, seed: int) -> str:
    return f"{start}_lr{lr:g}_f{fraction:g}_s{seed}.json"


def run(args: argparse.Namespace) -> list[Path]:
    """Every (seed, label fraction, start, lr) not yet done, one after another -> the results written."""
    r = recipe(args.config)
    for key in ("steps", "head_init_std"):
        if getattr(args, key) is not None:
            r[key] = getattr(args, key)
    if args.threads:
        torch.set_num_threads(args.threads)
    base, written = None, []
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for fraction in args.label_fractions:
            todo = [
                (start, lr, decay)
                for start in args.starts
                for lr, decay in (args.scratch_grid if start == "timm-init" and args.scratch_grid else args.grid)
            ]
            todo = [run for run in todo if not (args.out / result_name(run[0], run[1], fraction, seed)).exists()]
            if not todo:
                continue
            base = base or finetune_data(r["data"], args.source_root)
            *images, num_classes = splits(base, seed, fraction)
            checkpoint = args.checkpoint.format(seed=seed)
            with tempfile.TemporaryDirectory() as tmp:
                export(checkpoint, Path(tmp))
                for start, lr, decay in todo:
                    torch.manual_seed(seed)
                    model = timm_model(start, Path(tmp), num_classes, r["drop_path_rate"], r["head_init_std"])
                    point = {**r, "lr": lr, "layer_decay": decay}
                    result = train(model, images, point, seed, args.val_every)
                    result.update(start=start, seed=seed, label_fraction=fraction, lr=lr, checkpoint=checkpoint,
                                  config=str(args.config), recipe={k: v for k, v in point.items() if k != "data"})  # fmt: skip
                    path = args.out / result_name(start, lr, fraction, seed)
                    path.write_text(json.dumps(result, indent=1, default=list))
                    print(f"{start} lr {lr:g} labels {fraction:g} seed {seed}: test top-1 "
                          f"{100 * result['test_top1']:.1f} at step {result['step']}", flush=True)  # fmt: skip
                    written.append(path)
    return written


def grid_point(text: str) -> tuple[float, float | None]:
    """``LR`` or ``LR:LAYER_DECAY`` -> ``(lr, layer decay or None)``; a value out of range is refused."""
    lr, _, decay = text.partition(":")
    try:
        point = (float(lr), float(decay) if decay else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a grid point is LR or LR:LAYER_DECAY, got {text!r}") from None
    if point[0] <= 0 or (point[1] is not None and not 0 < point[1] <= 1):
        raise argparse.ArgumentTypeError(f"a grid point needs lr > 0 and layer decay in (0, 1], got {text!r}")
    return point


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/finetune/quickstart.yaml"))
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="an ijepa fit checkpoint ({seed} is each seed); timm-init takes its architecture",
    )
    parser.add_argument("--starts", nargs="+", choices=("pretrained", "timm-init"), default=["pretrained"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--label-fractions", nargs="+", type=float, default=[1.0])
    parser.add_argument(
        "--grid", nargs="+", type=grid_point, help="LR[:LAYER_DECAY] runs instead of the config's lr and layer decay"
    )
    parser.add_argument("--scratch-grid", nargs="+", type=grid_point, help="LR[:LAYER_DECAY] runs of timm-init")
    parser.add_argument("--source-root", help="data.source.root of a folder source")
    parser.add_argument("--steps", type=int, help="instead of the config's trainer.max_steps")
    parser.add_argument("--head-init-std", type=float, help="instead of the config's model.head.init_std")
    parser.add_argument("--val-every", type=int, default=50)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="a folder: <start>_lr<lr>_f<fraction>_s<seed>.json")
    args = parser.parse_args(argv)
    config = recipe(args.config)
    args.grid = [
        (lr, config["layer_decay"] if decay is None else decay) for lr, decay in args.grid or [(config["lr"], None)]
    ]
    if args.scratch_grid:
        args.scratch_grid = [(lr, config["layer_decay"] if decay is None else decay) for lr, decay in args.scratch_grid]
    if args.val_every < 1:
        parser.error(f"--val-every must be >= 1, got {args.val_every}")
    for fraction in args.label_fractions:
        if not 0 < fraction <= 1:
            parser.error(f"--label-fractions must lie in (0, 1], got {fraction}")
    run(args)


if __name__ == "__main__":
    main()
