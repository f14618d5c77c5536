"""The token-grid ceiling of an evaluation config's segmentation task (``docs/evaluation.md``):
the test mIoU of each token's majority class, upsampled as the heads' logits are
(:func:`ijepa.classifiers.token_grid_ceiling`, what ``SegmentationProtocol`` reports as
``ceiling_miou``), for each data seed, as a markdown table::

    python -m ijepa.studies.dense_ceiling --config configs/eval/dense_shapes.yaml --seeds 0 1 2
    python -m ijepa.studies.dense_ceiling --set data.image_size=48 --set "data.source.init_args.radius=[0.1, 0.18]"

The token grid is ``data.image_size / patch``, ``patch`` the config's ``data.patch_size`` or
``--patch-size`` (8: the quickstart's patches and the pixel baseline's). Only the test split is
read (a generated source renders one training image); ``--test-size`` sets a generated source's
``val_size``. ``--set key=value`` (YAML value, dotted key) overrides the config.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch
import yaml

from ijepa.classifiers import token_grid_ceiling
from ijepa.data.batch import IGNORE_INDEX
from ijepa.evaluation.runner import build_parser

CONFIG = "configs/eval/dense_shapes.yaml"
PATCH = 8  # the quickstart's patch side and pixel_patch_size


def set_key(config: dict, key: str, value) -> None:
    """``config`` with the dotted ``key`` (e.g. ``data.image_size``) set to ``value``, in place."""
    *path, last = key.split(".")
    node = config
    for name in path:
        node = node.setdefault(name, {})
    node[last] = value


def split_masks(config: dict) -> torch.Tensor:
    """``[N, H, W]`` masks of the test split of an ``ijepa eval`` config (a dict), at its ``data.image_size``."""
    parser = build_parser()
    init = getattr(parser, "instantiate", parser.instantiate_classes)(parser.parse_object(config))
    data = init["data"]
    dataset = data.dataset("test", data.image_size)
    if getattr(dataset, "masks", None) is not None:
        return dataset.masks
    return torch.stack([dataset[i][1]["mask"] for i in range(len(dataset))])


def config_ceiling(
    path: str | Path,
    data_seed: int,
    test_size: int | None = None,
    patch_size: int | None = None,
    overrides: dict | None = None,
) -> dict:
    """:func:`token_grid_ceiling` of the test split of the eval config at ``path`` rendered with
    ``data_seed``, plus ``grid`` (rows, columns), ``images`` and ``num_classes`` (1 + the
    largest class id of the test masks)."""
    config = yaml.safe_load(Path(path).read_text())
    for key, value in (overrides or {}).items():
        set_key(config, key, value)
    config["checkpoint"] = "pixels"  # parsed only: no encoder is opened
    data = config.setdefault("data", {})
    if data.get("image_size") is None:
        raise ValueError(f"{path}: data.image_size must be set (the token grid is data.image_size / patch).")
    data["data_seed"] = data_seed
    source = data.get("source", {}).get("init_args", {})
    if "train_size" in source:
        source["train_size"] = 1  # the ceiling reads the test split only
    if test_size is not None:
        source["val_size"] = test_size
    patch = patch_size or data.get("patch_size") or PATCH
    size = int(data["image_size"])
    if size % patch:
        raise ValueError(f"data.image_size ({size}) must be a multiple of the patch side ({patch}).")
    masks = split_masks(config)
    valid = masks[masks != IGNORE_INDEX]
    classes = int(valid.max()) + 1 if valid.numel() else 1
    grid = (size // patch, size // patch)
    return {**token_grid_ceiling(masks, grid, classes), "grid": grid, "images": len(masks), "num_classes": classes}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="data seeds (data.data_seed)")
    parser.add_argument("--test-size", type=int, default=None, help="a generated source's val_size")
    parser.add_argument("--patch-size", type=int, default=None, help=f"default: data.patch_size, else {PATCH}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override the config")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set must be KEY=VALUE (e.g. data.image_size=48), got {item!r}.")
        overrides[key] = yaml.safe_load(value)
    found = [config_ceiling(args.config, s, args.test_size, args.patch_size, overrides) for s in args.seeds]
    shown = "".join(f" --set {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in overrides.items())
    print(f"Token-grid ceiling of {args.config}{shown}, test split:\n")
    print("| data seed | test images | token grid | classes | ceiling mIoU | pixel accuracy |")
    print("|---|---|---|---|---|---|")
    for seed, row in zip(args.seeds, found):
        rows, columns = row["grid"]
        print(
            f"| {seed} | {row['images']} | {rows} x {columns} | {row['num_classes']} | {100 * row['miou']:.2f} | "
            f"{100 * row['pixel_accuracy']:.2f} |"
        )
    return found


if __name__ == "__main__":
    main()
