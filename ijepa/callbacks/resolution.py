"""Resolution change: adapt checkpoints and pretrained weights to the run's image and patch size."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from ijepa.checkpoint import load_adapted
from ijepa.nn.resize import INTERPOLATION_MODES


class PositionEmbeddingInterpolation(L.Callback):
    """Load checkpoints trained at another image size or patch size into this run's model.

    The model's checkpoint loading (:func:`ijepa.checkpoint.adapt_checkpoint`) always adapts
    a checkpoint to its own grid: learned tables of the encoders and predictor are interpolated
    (``learned`` as a 2D grid, ``learned_2d`` per axis, ``relative_bias`` over the new offsets),
    sin-cos and RoPE are rebuilt, patch kernels resized with FlexiViT's pseudo-inverse, and every
    change is printed. This callback chooses how, and can start a run from pretrained weights:

    Args:
        mode: ``bicubic`` (ViT / DeiT, default), ``bilinear`` or ``nearest``.
        antialias: low-pass filter tables that shrink.
        init_checkpoint: optional checkpoint whose *weights* initialise the model at the start
            of ``fit`` (fresh optimizer and schedules), e.g. to continue pretraining at a new
            resolution. Ignored when the run resumes from ``ckpt_path``.
    """

    def __init__(self, mode: str = "bicubic", antialias: bool = False, init_checkpoint: str | None = None):
        if mode not in INTERPOLATION_MODES:
            raise ValueError(f"mode must be one of {INTERPOLATION_MODES}, got {mode!r}.")
        if init_checkpoint is not None and not Path(init_checkpoint).is_file():
            raise FileNotFoundError(f"init_checkpoint={init_checkpoint!r} is not a file.")
        self.mode = mode
        self.antialias = antialias
        self.init_checkpoint = init_checkpoint

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # setup runs before Lightning restores `ckpt_path`, so the settings apply to it.
        pl_module.position_interpolation = {"mode": self.mode, "antialias": self.antialias}
        if self.init_checkpoint is None or stage != "fit" or trainer.ckpt_path is not None:
            return
        checkpoint = torch.load(self.init_checkpoint, map_location="cpu", weights_only=True)
        report = load_adapted(pl_module, checkpoint, self.mode, self.antialias)
        if report:
            rank_zero_info(report)
        rank_zero_info(f"Initialised the model from the weights of {self.init_checkpoint}.")
