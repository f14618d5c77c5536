"""Whole I-JEPA models from other formats, and the Lightning checkpoints ``ijepa fit`` starts
from: the part of :mod:`ijepa.interop` that builds an :class:`~ijepa.module.IJEPA` (and so
imports Lightning)."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L

from ijepa.checkpoint import AtomicCheckpointIO
from ijepa.interop.encoder import encoder_options, load_exactly, read_torch_file
from ijepa.interop.official import official_model_options
from ijepa.module import IJEPA
from ijepa.nn.vit import VisionTransformer

# Marks a checkpoint written here: weights only, no optimizer, schedule or loop state, so
# `ijepa fit --ckpt_path` on it would restart warm-up while claiming to resume (ijepa.cli refuses).
WEIGHTS_ONLY_KEY = "ijepa_weights_only"


def load_official(
    checkpoint: dict | str | Path,
    num_heads: int,
    predictor_num_heads: int,
    image_size: int | None = None,
    **model_options,
) -> IJEPA:
    """An :class:`IJEPA` holding an official I-JEPA checkpoint's weights.

    Widths, depths, patch size and the training grid are read from the weights; the head counts
    cannot be (the fused qkv hides them) and must be given (ViT-H/14: 16, predictor 12).
    ``image_size`` defaults to the checkpoint's; another size keeps the weights (sin-cos tables
    are rebuilt for the new grid). ``model_options`` go to :class:`IJEPA` (schedules, loss...).
    """
    if not isinstance(checkpoint, dict):
        path = checkpoint
        checkpoint = read_torch_file(path, "official I-JEPA checkpoint")
        if not isinstance(checkpoint, dict):
            raise ValueError(f"{path} is not an official I-JEPA checkpoint: it holds a {type(checkpoint).__name__}.")
    options, state = official_model_options(checkpoint, image_size)
    model = IJEPA(**options, num_heads=num_heads, predictor_num_heads=predictor_num_heads, **model_options)
    load_exactly(model, state, "official checkpoint")
    return model


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


class _MarkWeightsOnly(L.Callback):
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[WEIGHTS_ONLY_KEY] = True


def save_lightning_checkpoint(model: IJEPA, path: str | Path) -> Path:
    """Write ``model`` as a Lightning checkpoint (atomically) that ``ijepa fit`` can start from
    (``PositionEmbeddingInterpolation``'s ``init_checkpoint``, at any resolution) and that
    :func:`~ijepa.interop.load_encoder`, ``IJEPA.load_from_checkpoint`` and ``ijepa validate``
    read. It holds weights only and says so (``WEIGHTS_ONLY_KEY``): ``ijepa fit --ckpt_path``
    refuses it rather than resume a run that never was."""
    trainer = L.Trainer(
        max_steps=0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_MarkWeightsOnly()],
        plugins=[AtomicCheckpointIO()],
    )
    trainer.strategy.connect(model)
    trainer.save_checkpoint(str(path))
    return Path(path)
