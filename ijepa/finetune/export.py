"""A fine-tuned classifier as a Hugging Face ``IJepaForImageClassification`` folder or a timm
``VisionTransformer`` folder with its head: ``ijepa finetune export SOURCE DESTINATION hf|timm``.

Both formats compute ``linear(mean over tokens(final LayerNorm(tokens)))``, which is
:class:`~ijepa.finetune.heads.MeanPoolHead` (without ``fc_norm``) on our encoder; the encoder's
weights are written as ``ijepa convert`` writes them (:mod:`ijepa.interop`), LoRA adapters merged
first. A head a format cannot hold (the attentive pooler, a second LayerNorm) is refused in one
line before anything is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import torch
from jsonargparse import auto_cli

from ijepa.finetune.module import FineTuner, load_finetuned
from ijepa.interop.encoder import export_dtype, save_json, save_safetensors
from ijepa.interop.huggingface import encoder_to_hf, hf_preprocessor
from ijepa.interop.timm_vit import encoder_to_timm, timm_config

FORMATS = ("hf", "timm")


def head_weights(model: FineTuner) -> tuple[torch.Tensor, torch.Tensor]:
    """The linear layer's ``(weight [C, D], bias [C])``, or one line saying why no format holds the head."""
    problem = model.head_kind.export_problem()
    if problem:
        raise ValueError(
            f"cannot export this head to Hugging Face or timm: {problem}; export the encoder alone "
            "(ijepa convert on the pretraining checkpoint) or fine-tune with MeanPoolHead (fc_norm: false)."
        )
    return model.head.head.weight.detach(), model.head.head.bias.detach()


def finetuned_to_hf(model: FineTuner) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config, state dict)`` of an ``IJepaForImageClassification`` computing ``model``'s logits."""
    weight, bias = head_weights(model)
    config, state = encoder_to_hf(model.merged().encoder)
    classes = weight.size(0)
    config.update(
        architectures=["IJepaForImageClassification"],
        id2label={str(i): f"LABEL_{i}" for i in range(classes)},
        label2id={f"LABEL_{i}": i for i in range(classes)},
    )
    out = {f"ijepa.{key}": value for key, value in state.items()}
    out.update({"classifier.weight": weight, "classifier.bias": bias})
    return config, out


def finetuned_to_timm(model: FineTuner) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(model_args, state dict)`` of a timm ``VisionTransformer`` computing ``model``'s logits."""
    weight, bias = head_weights(model)
    args, state = encoder_to_timm(model.merged().encoder)
    args["num_classes"] = weight.size(0)
    return args, {**state, "head.weight": weight, "head.bias": bias}


def export(
    source: str,
    destination: str,
    to: Literal["hf", "timm"],
    dtype: Literal["fp32", "bf16"] = "fp32",
    overwrite: bool = False,
) -> Path:
    """Write the fine-tuned checkpoint ``source`` as a ``to`` folder at ``destination``.

    Args:
        source: a checkpoint of ``ijepa finetune`` (``best.ckpt``, ``last.ckpt``).
        destination: the folder to write.
        to: ``hf`` (``transformers.IJepaForImageClassification.from_pretrained(folder)``) or
            ``timm`` (``timm.create_model("local-dir:<folder>", pretrained=True)``).
        dtype: the stored weights' dtype, ``fp32`` or ``bf16``.
        overwrite: replace an existing destination.
    """
    out = Path(destination)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{destination} exists: pass --overwrite true to replace it.")
    model = load_finetuned(source)
    torch_dtype = export_dtype(dtype)
    if to == "hf":
        config, state = finetuned_to_hf(model)
        config["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
    else:
        args, state = finetuned_to_timm(model)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, out / "model.safetensors", torch_dtype)
    size = model.encoder.patch_embed.image_size
    if to == "hf":
        save_json(config, out / "config.json")
        save_json(hf_preprocessor(size), out / "preprocessor_config.json")
    else:
        save_json(timm_config(args), out / "config.json")
    print(f"finetuned {source} -> {to} {destination} ({dtype})")
    return out


def main(args: list[str]) -> None:
    """``ijepa finetune export SOURCE DESTINATION hf|timm``: one line and status 2 on what it cannot do."""
    try:
        auto_cli(export, args=args, as_positional=True, prog="ijepa finetune export")
    except (ValueError, OSError) as error:
        print(f"ijepa finetune export: error: {error}", file=sys.stderr)
        sys.exit(2)
