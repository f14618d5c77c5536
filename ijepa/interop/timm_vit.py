"""Export of our encoder to timm's ``VisionTransformer``, without importing timm.

The timm model that computes what our encoder computes has no class token, a learned
``pos_embed [1, N, D]`` holding our table, ``global_pool="avg"`` and ``fc_norm=False`` (so the
final LayerNorm acts on every token before the average, as ours does; timm's default for
``avg`` would norm after pooling instead) and no head. Its ``forward_features`` is our
``encoder(images)`` and its ``forward`` our ``pooled_features``. The weight names are the
official I-JEPA encoder's plus ``pos_embed``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from ijepa.interop.encoder import (
    encoder_options,
    export_dtype,
    image_encoder,
    position_table,
    save_json,
    save_safetensors,
)
from ijepa.interop.official import ENCODER_NAMES, official_layout
from ijepa.nn.vit import VisionTransformer

TIMM_NORM_EPS = 1e-6  # timm's ViT LayerNorm; a JSON config cannot name another norm layer
TIMM_ARCHITECTURE = "vit_base_patch16_224"  # the registered name; model_args override every size


def timm_model_args(encoder: VisionTransformer) -> dict:
    """Keyword arguments of ``timm.create_model(TIMM_ARCHITECTURE, **args)`` (or of
    ``timm.models.vision_transformer.VisionTransformer``) for a model equal to ``encoder``."""
    options = encoder_options(encoder)
    if options["norm_eps"] != TIMM_NORM_EPS:
        raise ValueError(
            f"timm's ViT LayerNorms use eps={TIMM_NORM_EPS}; this encoder's use {options['norm_eps']} "
            "(e.g. imported from a Hugging Face config), which a timm config cannot express."
        )
    return {
        "img_size": options["image_size"],
        "patch_size": options["patch_size"],
        "in_chans": options["in_channels"],
        "embed_dim": options["embed_dim"],
        "depth": options["depth"],
        "num_heads": options["num_heads"],
        "mlp_ratio": options["mlp_hidden"] / options["embed_dim"],
        "qkv_bias": options["qkv_bias"],
        "class_token": False,
        "global_pool": "avg",
        "fc_norm": False,
        "num_classes": 0,
    }


def encoder_to_timm(encoder: torch.nn.Module, which: str = "target") -> tuple[dict, dict[str, torch.Tensor]]:
    """``(model_args, state dict)`` of a timm ``VisionTransformer`` equal to ``encoder`` (an
    :class:`~ijepa.module.IJEPA` gives its ``which`` encoder). Position encodings a plain table cannot express
        (RoPE, PEG, relative bias) are refused."""
    encoder = image_encoder(encoder, which)
    args = timm_model_args(encoder)
    table = position_table(encoder, "timm's VisionTransformer")
    state = {k: v for k, v in encoder.state_dict().items() if not k.startswith("transformer.position.")}
    out = official_layout(state, ENCODER_NAMES, "blocks.", "")
    out["pos_embed"] = table[None]
    return args, out


def save_timm(encoder: torch.nn.Module, folder: str | Path, which: str = "target", dtype: str = "fp32") -> Path:
    """Write ``encoder`` as a timm model folder (``config.json`` with the architecture, model
    arguments and preprocessing; ``model.safetensors``), which
    ``timm.create_model("local-dir:<folder>", pretrained=True)`` loads (into a float32 model
    whatever the stored ``dtype``: ``fp32`` or ``bf16``, half the size)."""
    torch_dtype = export_dtype(dtype)
    args, state = encoder_to_timm(encoder, which)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, folder / "model.safetensors", torch_dtype)
    save_json(timm_config(args), folder / "config.json")
    return folder


def timm_config(args: dict) -> dict:
    """timm's ``config.json`` for ``model_args`` ``args`` (:func:`timm_model_args`, whose
    ``num_classes`` it repeats): architecture, arguments and this project's preprocessing."""
    size, classes = args["img_size"], args["num_classes"]
    return {
        "architecture": TIMM_ARCHITECTURE,
        "num_classes": classes,
        "num_features": args["embed_dim"],
        "global_pool": "avg",
        "model_args": args,
        "pretrained_cfg": {
            "input_size": [args["in_chans"], size, size],
            "fixed_input_size": True,
            # timm's eval transform then is this project's: shorter side resized, centre crop
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": list(IMAGENET_MEAN),
            "std": list(IMAGENET_STD),
            "num_classes": classes,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
        },
    }
