"""A trained encoder on its own: out of an ``ijepa fit`` checkpoint into plain PyTorch, into a
Lightning checkpoint that ``ijepa fit`` can start from, and the pieces every export shares
(its position table, its weights written atomically as safetensors)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import lightning as L
import torch
from safetensors.torch import load_file, save_file

from ijepa.checkpoint import AtomicCheckpointIO, temporary_path
from ijepa.module import IJEPA
from ijepa.nn.position import AdditivePosition, NonePosition
from ijepa.nn.vit import VisionTransformer


def load_encoder(checkpoint: str | Path, encoder: str = "target") -> VisionTransformer:
    """The trained encoder of an ``ijepa fit`` checkpoint as a plain :class:`torch.nn.Module` in
    eval mode, on the CPU: ``encoder(images [B, 3, H, W]) -> [B, N, D]`` patch features and
    ``encoder.pooled_features(images) -> [B, D]``. ``encoder``: ``target`` (the EMA encoder the
    probes score, default) or ``online``."""
    if encoder not in ("target", "online"):
        raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
    model = IJEPA.load_from_checkpoint(str(checkpoint), map_location="cpu")
    network = model.target_encoder if encoder == "target" else model.encoder
    return network.eval().requires_grad_(False)


def load_exactly(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``module`` only if it fits key for key and shape for shape; otherwise a
    ValueError naming ``source`` and listing the missing keys or the mismatched shapes (never a
    partial load)."""
    ours = module.state_dict()
    missing = sorted(set(ours) - set(state))
    if missing:
        raise ValueError(f"the {source} lacks these parameters of the model: {missing}")
    for key, value in state.items():
        if key in ours and ours[key].shape != value.shape:
            raise ValueError(f"{key}: {source} shape {tuple(value.shape)} != model shape {tuple(ours[key].shape)}.")
    module.load_state_dict(state, strict=True)


def image_encoder(encoder: VisionTransformer | IJEPA, which: str = "target") -> VisionTransformer:
    """The image encoder to export: ``encoder`` itself, or one of an :class:`IJEPA`'s
    (``which``: ``target``, the EMA encoder, or ``online``). Clip encoders are refused."""
    if isinstance(encoder, IJEPA):
        if which not in ("target", "online"):
            raise ValueError(f"which must be 'target' or 'online', got {which!r}.")
        encoder = encoder.target_encoder if which == "target" else encoder.encoder
    if not isinstance(encoder, VisionTransformer):
        raise ValueError(
            f"only image encoders (ijepa.nn.vit.VisionTransformer) can be exported, got {type(encoder).__name__}."
        )
    return encoder


def position_table(encoder: VisionTransformer, target: str) -> torch.Tensor:
    """The encoder's positions as the one ``[N, D]`` table added to the patch tokens that plain
    ViTs (timm, Hugging Face) hold: the table of an additive member (``learned``, ``learned_2d``
    summed out, ``sincos``) or zeros for ``none``. Members that act inside attention or between
    blocks cannot be written as such a table and are refused; ``target`` names the format."""
    position = encoder.position
    if isinstance(position, AdditivePosition):
        return position.table().detach().float().clone()
    if type(position) is NonePosition:
        return torch.zeros(encoder.num_patches, encoder.embed_dim)
    acts = list(position.hooks())
    raise ValueError(
        f"{target} adds one position table to the patch tokens; pos_embed {position.name!r} acts through "
        f"{acts} and cannot be written as a table. Exportable: the additive members (learned, learned_2d, "
        "sincos) and none."
    )


def encoder_options(encoder: VisionTransformer) -> dict:
    """What a plain ViT needs to rebuild ``encoder``: sizes, widths and the LayerNorm epsilon."""
    first = encoder.transformer.blocks[0]
    kernel = encoder.patch_embed.proj.weight
    return {
        "image_size": encoder.grid_size * kernel.size(-1),
        "patch_size": kernel.size(-1),
        "in_channels": kernel.size(1),
        "embed_dim": encoder.embed_dim,
        "depth": len(encoder.transformer.blocks),
        "num_heads": first.attn.num_heads,
        "mlp_hidden": first.mlp.fc1.out_features,
        "qkv_bias": first.attn.qkv.bias is not None,
        "norm_eps": encoder.transformer.norm.eps,
    }


def ijepa_from_encoder(encoder: VisionTransformer, **model_options) -> IJEPA:
    """An :class:`IJEPA` whose online and target encoders are copies of ``encoder`` (e.g. one
    read by :func:`~ijepa.interop.load_hf`) and whose predictor is freshly initialised: a model
    ``ijepa fit`` can continue pretraining (save it with :func:`save_lightning_checkpoint`).
    Sizes and the position member are read from ``encoder``; ``model_options`` set the rest
    (predictor, schedules, loss)."""
    options = encoder_options(encoder)
    read = {"image_size", "patch_size", "in_channels", "embed_dim", "depth", "num_heads", "mlp_ratio", "pos_embed"}
    clash = sorted(read & set(model_options))
    if clash:
        raise ValueError(f"{clash} are read from the encoder and cannot be given.")
    if not options["qkv_bias"]:
        raise ValueError("IJEPA's encoders have qkv biases; this encoder has none.")
    if options["norm_eps"] != 1e-6:
        warnings.warn(
            f"IJEPA's LayerNorms use eps=1e-6; the encoder's use {options['norm_eps']}. The weights are copied "
            "unchanged, so outputs differ slightly from the source model's.",
            stacklevel=2,
        )
    model = IJEPA(
        image_size=options["image_size"],
        patch_size=options["patch_size"],
        in_channels=options["in_channels"],
        embed_dim=options["embed_dim"],
        depth=options["depth"],
        num_heads=options["num_heads"],
        mlp_ratio=options["mlp_hidden"] / options["embed_dim"],
        pos_embed=encoder.position.name,
        **model_options,
    )
    for network in (model.encoder, model.target_encoder):
        network.load_state_dict(encoder.state_dict(), strict=True)
    return model


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` to ``path`` as safetensors (``format: pt``, which transformers requires),
    through a temporary file renamed over ``path``: a crash leaves the old file or the new one."""
    temporary = temporary_path(path)
    try:
        save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(temporary), {"format": "pt"})
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def save_json(obj: dict, path: Path) -> None:
    """``obj`` as indented JSON at ``path``, written through a temporary file."""
    temporary = temporary_path(path)
    try:
        temporary.write_text(json.dumps(obj, indent=2) + "\n")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of a saved model folder: ``model.safetensors``, a sharded
    ``model.safetensors.index.json``, or ``pytorch_model.bin`` (loaded with ``weights_only``)."""
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    if (folder / "model.safetensors.index.json").is_file():
        shards = sorted(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()))
        return {key: value for shard in shards for key, value in load_file(str(folder / shard)).items()}
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin.")


def save_lightning_checkpoint(model: IJEPA, path: str | Path) -> Path:
    """Write ``model`` as a Lightning checkpoint (atomically) that ``ijepa fit`` can start from
    (``PositionEmbeddingInterpolation``'s ``init_checkpoint``, at any resolution) and that
    :func:`load_encoder` and ``IJEPA.load_from_checkpoint`` read."""
    trainer = L.Trainer(
        max_steps=0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[AtomicCheckpointIO()],
    )
    trainer.strategy.connect(model)
    trainer.save_checkpoint(str(path))
    return Path(path)
