"""Resolution transfer: k-NN top-1 of trained checkpoints evaluated at other image sizes.

Each checkpoint is loaded with :meth:`IJEPA.load_from_checkpoint` at every requested image size,
so it goes through the same adaptation as ``ijepa validate --data.image_size ...`` (learned
tables interpolated, sin-cos/RoPE rebuilt), and is probed with the k-NN of
:class:`ijepa.callbacks.KNNProbe` on the data of its own run rendered at that size. The data is
built once per size and shared by all checkpoints.

    python -m ijepa.studies.resolution runs/*/lightning_logs/version_0/checkpoints/last.ckpt \\
        --image-sizes 24 32 48 72 96

prints a Markdown table (mean and spread over the checkpoints of each position type) and writes
every value to ``--output`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

import torch
from torchmetrics.classification import MulticlassAccuracy

from ijepa.callbacks.probe import extract_features
from ijepa.classifiers import knn_scores
from ijepa.data.datamodule import IJEPADataModule
from ijepa.data.sources import source_from_config
from ijepa.evaluation.encoders import rebuild_at
from ijepa.legacy import upgrade_data_hparams
from ijepa.masks import MultiBlockMasks
from ijepa.module import IJEPA
from ijepa.nn.resize import resize_patch, resize_patch_embed_kernel
from ijepa.nn.stem import refuse_conv_stem

# Masks are not used by the probe; min_keep=1 keeps small grids valid.
LOOSE_MASKS = {"masks": MultiBlockMasks(min_keep=1)}


def knn_top1(model: IJEPA, datamodule: IJEPADataModule, k: int = 20, temperature: float = 0.07) -> float:
    """Top-1 k-NN accuracy in [0, 1] of ``model`` on ``datamodule``'s probe splits."""
    model.eval()
    bank, bank_labels = extract_features(None, model, datamodule.probe_train_dataloader())
    queries, query_labels = extract_features(None, model, datamodule.probe_test_dataloader())
    scores = knn_scores(bank, bank_labels, queries, datamodule.num_classes, k, temperature)
    return float(MulticlassAccuracy(num_classes=datamodule.num_classes, average="micro")(scores, query_labels))


def load_at(checkpoint: dict, image_size: int, patch_size: int | None = None) -> IJEPA:
    """The model of a loaded ``checkpoint`` rebuilt at ``image_size`` (and ``patch_size``), in eval
    mode, weights adapted on load by :func:`ijepa.evaluation.encoders.rebuild_at` (what
    ``IJEPA.load_from_checkpoint(path, image_size=...)`` and ``ijepa eval`` do)."""
    sizes = {"image_size": image_size} | ({"patch_size": patch_size} if patch_size else {})
    return rebuild_at(checkpoint, **sizes)[0].eval()


@torch.no_grad()
def patch_resize_error(model: IJEPA, images: torch.Tensor, new_patch_size: int) -> float:
    """Relative error ``|t' - t| / |t|`` of patch tokens (before positions) when the patch
    kernel is resized to ``new_patch_size`` with FlexiViT's pseudo-inverse and every patch of
    ``images [B, C, H, W]`` with :func:`resize_patch` (0 up to rounding when the patch grows)."""
    refuse_conv_stem(model.target_encoder.patch_embed, f"--patch-sizes {new_patch_size} (FlexiViT's kernel resize)")
    proj = model.target_encoder.patch_embed.proj
    p = proj.kernel_size[0]
    patches = images.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(-1, images.size(1), p, p)
    tokens = torch.nn.functional.conv2d(patches, proj.weight).flatten(1)  # bias cancels in the difference
    kernel = resize_patch_embed_kernel(proj.weight, new_patch_size)
    resized = torch.nn.functional.conv2d(resize_patch(patches, new_patch_size), kernel).flatten(1)
    return float((resized - tokens).norm() / tokens.norm())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoints trained at one image size")
    parser.add_argument("--image-sizes", nargs="+", type=int, required=True, help="sizes to evaluate at")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.07)
    parser.add_argument(
        "--patch-sizes",
        nargs="*",
        type=int,
        default=[],
        help="also report the token error of "
        "FlexiViT kernel resizes to these patch sizes (first checkpoint, training-size images)",
    )
    parser.add_argument("--output", default="resolution_transfer.json")
    args = parser.parse_args(argv)

    saved = {path: torch.load(path, map_location="cpu", weights_only=True) for path in args.checkpoints}
    data_hparams = {
        k: v
        for k, v in upgrade_data_hparams(next(iter(saved.values()))["datamodule_hyper_parameters"]).items()
        if not k.startswith("_")
    }
    # checkpoints keep the sources as plain values (class path and options): rebuild the objects
    for key in ("source", "probe_source"):
        if data_hparams.get(key) is not None:
            data_hparams[key] = source_from_config(data_hparams[key])
    train_size = data_hparams["image_size"]
    results: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for image_size in args.image_sizes:
        datamodule = IJEPADataModule(**{**data_hparams, "image_size": image_size, "num_workers": 0, **LOOSE_MASKS})
        datamodule.setup("validate")
        for path, checkpoint in saved.items():
            if checkpoint["datamodule_hyper_parameters"]["image_size"] != train_size:
                raise ValueError(f"{path} was trained at another image size than {args.checkpoints[0]}.")
            model = load_at(checkpoint, image_size)
            top1 = knn_top1(model, datamodule, args.k, args.temperature)
            pos_embed = checkpoint["hyper_parameters"]["pos_embed"]
            results[pos_embed][image_size].append(top1)
            print(f"{pos_embed:14s} {image_size:4d} px  val/knn_top1 = {top1:.4f}  ({path})", flush=True)

    patch_errors = {}
    if args.patch_sizes:
        datamodule = IJEPADataModule(**{**data_hparams, "num_workers": 0, **LOOSE_MASKS})
        datamodule.setup("validate")
        images = next(iter(datamodule.probe_test_dataloader())).images
        model = load_at(saved[args.checkpoints[0]], train_size)
        for patch_size in args.patch_sizes:
            patch_errors[patch_size] = patch_resize_error(model, images, patch_size)
            print(
                f"patch kernel {data_hparams['patch_size']} -> {patch_size}: relative token error "
                f"{patch_errors[patch_size]:.2e}",
                flush=True,
            )

    header = "| encoder `pos_embed` | " + " | ".join(f"{s} px ({s / train_size:.2g}x)" for s in args.image_sizes) + " |"
    print("\n" + header + "\n|---|" + "---|" * len(args.image_sizes))
    for pos_embed, by_size in results.items():
        cells = []
        for size in args.image_sizes:
            values = [100 * v for v in by_size[size]]
            spread = (max(values) - min(values)) / 2
            cells.append(f"{statistics.mean(values):.1f} ± {spread:.1f}")
        print(f"| `{pos_embed}` | " + " | ".join(cells) + " |")
    with open(args.output, "w") as f:
        json.dump({"train_image_size": train_size, "results": results, "patch_resize_error": patch_errors}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
