"""``ijepa convert``: one command between this project's checkpoints and the official I-JEPA,
Hugging Face and timm formats (a jsonargparse CLI over :func:`convert`).

It never destroys data: an existing destination is refused unless ``--overwrite`` is given, and
a destination that is the source (the same file or folder, also through a link) always is."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from jsonargparse import auto_cli

from ijepa.checkpoint import atomic_save
from ijepa.interop.card import model_card, write_card
from ijepa.interop.encoder import first_line, image_encoder, read_torch_file
from ijepa.interop.huggingface import load_hf, save_hf
from ijepa.interop.ijepa_model import WEIGHTS_ONLY_KEY, ijepa_from_encoder, load_official, save_lightning_checkpoint
from ijepa.interop.official import NETWORKS, to_official
from ijepa.interop.timm_vit import save_timm
from ijepa.module import IJEPA
from ijepa.nn.vit import VisionTransformer

Format = Literal["ckpt", "official", "hf", "timm"]
Dtype = Literal["fp32", "bf16"]
FOLDER_FORMATS = ("hf", "timm")
__all__ = ["WEIGHTS_ONLY_KEY", "check_destination", "convert", "main", "source_format"]


def check_destination(source: Path, destination: Path, to: str, overwrite: bool) -> None:
    """Refuse a destination that is the source (always), one of the wrong kind (a file where
    ``to`` writes a folder, or the reverse) and, without ``overwrite``, any that exists."""
    if not (destination.exists() or destination.is_symlink()):
        return
    if source.exists() and destination.exists() and os.path.samefile(source, destination):
        raise ValueError(
            f"destination {destination} is the source {source}: converting it onto itself would replace it "
            "(--overwrite does not allow this); write to another path."
        )
    folder = to in FOLDER_FORMATS
    if destination.is_dir() != folder:
        raise ValueError(
            f"destination {destination} is a {'file' if folder else 'folder'}; {to} writes a "
            f"{'folder' if folder else 'file'}: give another path."
        )
    if not overwrite:
        raise FileExistsError(f"destination {destination} exists; pass --overwrite to replace it.")


def source_format(source: Path) -> tuple[str, dict | None]:
    """What ``source`` is: ``hf`` (a folder with ``config.json``), ``ckpt`` (a Lightning
    checkpoint of :class:`IJEPA`) or ``official`` (a dict with encoder, predictor and target
    encoder); with the loaded dict for files."""
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ValueError(f"{source} is a folder without config.json: not a Hugging Face model folder.")
        return "hf", None
    if not source.is_file():
        raise FileNotFoundError(f"source {str(source)!r} does not exist.")
    checkpoint = read_torch_file(source)
    if isinstance(checkpoint, dict) and "state_dict" in checkpoint and "hyper_parameters" in checkpoint:
        if {"num_classes", "network"} <= set(checkpoint["hyper_parameters"] or {}):
            raise ValueError(
                f"{source} is a fine-tuned classifier (ijepa finetune): export it with `ijepa finetune export "
                f"{source} DESTINATION hf|timm`; ijepa convert reads pretraining checkpoints."
            )
        return "ckpt", checkpoint
    if isinstance(checkpoint, dict) and all(name in checkpoint for name in NETWORKS):
        return "official", checkpoint
    keys = sorted(checkpoint)[:10] if isinstance(checkpoint, dict) else type(checkpoint).__name__
    raise ValueError(
        f"{source} is neither an ijepa Lightning checkpoint (state_dict, hyper_parameters) nor an official "
        f"I-JEPA checkpoint (encoder, predictor, target_encoder): it has {keys}."
    )


def convert(
    source: str,
    destination: str,
    to: Format,
    encoder: Literal["target", "online"] = "target",
    num_heads: int | None = None,
    predictor_num_heads: int | None = None,
    image_size: int | None = None,
    drop: list[str] | None = None,
    model: dict | None = None,
    module_prefix: bool = True,
    dtype: Dtype = "fp32",
    overwrite: bool = False,
) -> str:
    """Convert a checkpoint between formats; the source format is recognised from the file.

    Args:
        source: an ``ijepa fit`` checkpoint (``.ckpt``), an official I-JEPA checkpoint
            (``.pth.tar``) or a Hugging Face ``IJepaModel`` folder.
        destination: the file (``ckpt``, ``official``) or folder (``hf``, ``timm``) to write.
        to: ``ckpt`` (weights only, marked so: ``ijepa fit`` starts from it through
            ``PositionEmbeddingInterpolation``'s ``init_checkpoint``, never ``--ckpt_path``),
            ``official`` (a file the official ``train.py`` resumes from at epoch 0), ``hf`` or ``timm``.
        encoder: which encoder of an I-JEPA model ``hf`` and ``timm`` get: ``target`` (EMA) or ``online``.
        num_heads: encoder heads of an official checkpoint (its fused qkv hides them).
        predictor_num_heads: predictor heads of an official checkpoint, or of the fresh
            predictor a Hugging Face encoder gets on its way to ``ckpt``.
        image_size: load an official checkpoint at another resolution.
        drop: key prefixes of a Hugging Face state dict to leave out (heads such as ``classifier.``).
        model: further IJEPA options for a model built here (``{predictor_depth: 6}``).
        module_prefix: ``official`` keys behind DDP's ``module.`` (the published checkpoints and
            multi-process official runs); ``false`` for an official run on one process.
        dtype: the dtype ``hf`` and ``timm`` store the encoder's weights in: ``fp32`` or ``bf16``
            (half the file; each weight rounded to bfloat16). ``ckpt`` and ``official`` are
            written in float32 only. ``hf`` and ``timm`` folders also get a model card,
            ``README.md`` (:mod:`ijepa.interop.card`).
        overwrite: replace an existing destination (never the source itself).
    """
    path, out = Path(source), Path(destination)
    if dtype != "fp32" and to not in FOLDER_FORMATS:
        raise ValueError(
            f"--dtype {dtype} applies to the folder formats {list(FOLDER_FORMATS)}; {to} is written in float32 "
            "(a checkpoint to train from): leave --dtype at fp32."
        )
    check_destination(path, out, to, overwrite)
    kind, checkpoint = source_format(path)
    options = dict(model or {})
    if kind == "official":
        if num_heads is None or predictor_num_heads is None:
            raise ValueError(
                "an official checkpoint needs --num_heads and --predictor_num_heads (ViT-H/14: 16 and 12)."
            )
        loaded: IJEPA | VisionTransformer = load_official(
            checkpoint, num_heads, predictor_num_heads, image_size=image_size, **options
        )
    elif kind == "ckpt":
        try:
            loaded = IJEPA.load_from_checkpoint(str(path), map_location="cpu")
        except (KeyError, RuntimeError, TypeError) as error:  # weights that do not fit the hyperparameters
            raise ValueError(f"{source} is not a loadable ijepa checkpoint: {first_line(error)}") from error
    else:
        loaded = load_hf(path, drop=tuple(drop or ()))
    if to in ("ckpt", "official") and isinstance(loaded, VisionTransformer):
        if predictor_num_heads is not None:
            options["predictor_num_heads"] = predictor_num_heads
        if to == "official":  # the official predictor: sin-cos, per block
            options = {"predictor_pos_embed": "sincos", "predictor_mode": "per_block", **options}
        loaded = ijepa_from_encoder(loaded, **options)
    if to == "ckpt":
        save_lightning_checkpoint(loaded, out)
    elif to == "official":
        atomic_save(to_official(loaded, module_prefix), out)
    else:
        exported = image_encoder(loaded, encoder)
        (save_hf if to == "hf" else save_timm)(exported, out, dtype=dtype)
        write_card(out, model_card(to, destination, exported, dtype, path, kind, checkpoint, encoder))
    message = f"{kind} {source} -> {to} {destination}" + (f" ({dtype})" if to in FOLDER_FORMATS else "")
    print(message)
    return message


def main(args: list[str] | None = None) -> None:
    """``ijepa convert SOURCE DESTINATION ckpt|official|hf|timm [--option value ...]``. What it
    cannot do is one line on stderr and exit status 2, as jsonargparse's own errors."""
    try:
        auto_cli(convert, args=args, as_positional=True, prog="ijepa convert")
    except (ValueError, OSError) as error:
        print(f"ijepa convert: error: {error}", file=sys.stderr)
        sys.exit(2)
