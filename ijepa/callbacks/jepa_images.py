"""Pictures of what the JEPA does, in TensorBoard: masks over images, where prediction is hard,
and histograms of the target features and position tables."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torchvision.utils import make_grid

from ijepa.data.datamodule import IMAGENET_MEAN, IMAGENET_STD
from ijepa.explore import heat_image
from ijepa.nn.patch import gather_patches

# Context tint and one colour per target block (RGB in [0, 1]).
CONTEXT_COLOUR = (0.2, 0.4, 1.0)
TARGET_COLOURS = ((1.0, 0.2, 0.2), (1.0, 0.8, 0.1), (0.2, 0.9, 0.3), (1.0, 0.3, 1.0), (0.1, 0.9, 0.9), (1.0, 0.5, 0.0))


def unnormalize(images: torch.Tensor) -> torch.Tensor:
    """ImageNet-normalised ``[B, 3, H, W]`` -> ``[0, 1]``."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() * std + mean).clamp(0, 1)


def mask_overlay(
    images: torch.Tensor, context_indices: torch.Tensor, target_indices: torch.Tensor, patch_size: int, alpha: float = 0.5
) -> torch.Tensor:
    """Images ``[B, 3, H, W]`` in [0, 1] with the context patches tinted blue and each target
    block ``m`` tinted with ``TARGET_COLOURS[m]`` (targets drawn over the context); patches in
    neither are darkened. Returns ``[B, 3, H, W]`` in [0, 1]."""
    batch, _, height, width = images.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    colour = torch.zeros(batch, grid_h * grid_w, 3, device=images.device)
    painted = torch.zeros(batch, grid_h * grid_w, dtype=torch.bool, device=images.device)
    rows = torch.arange(batch, device=images.device)[:, None]
    colour[rows, context_indices] = torch.tensor(CONTEXT_COLOUR, device=images.device)
    painted[rows, context_indices] = True
    for block in range(target_indices.size(1)):
        tint = torch.tensor(TARGET_COLOURS[block % len(TARGET_COLOURS)], device=images.device)
        colour[rows, target_indices[:, block]] = tint
        painted[rows, target_indices[:, block]] = True
    # per-patch maps -> per-pixel maps
    colour = colour.view(batch, grid_h, grid_w, 3).permute(0, 3, 1, 2)
    colour = colour.repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    painted = painted.view(batch, 1, grid_h, grid_w).repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    tinted = (1 - alpha) * images + alpha * colour
    return torch.where(painted, tinted, 0.35 * images)


@torch.no_grad()
def position_loss_map(pl_module: L.LightningModule, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position prediction loss of one masked batch: ``(loss_sum [N], count [N])``.

    ``loss_sum[i]`` adds the loss (the module's smooth L1 or MSE, averaged over channels) of every
    prediction of patch ``i`` in the batch, ``count[i]`` how many there were, so
    ``loss_sum.sum() / count.sum()`` is the batch's ``jepa_loss`` and ``loss_sum / count`` the map.
    """
    images, context_indices, target_indices = batch["images"], batch["context_indices"], batch["target_indices"]
    batch_size, num_blocks, num_targets = target_indices.shape
    target_features = pl_module.target_encoder(images)
    target_features = F.layer_norm(target_features, target_features.shape[-1:])
    targets = gather_patches(target_features, target_indices.flatten(1)).view(batch_size, num_blocks, num_targets, -1)
    predictions = pl_module.predictor(pl_module.encoder(images, context_indices), context_indices, target_indices)
    loss_fn = F.mse_loss if pl_module.hparams.loss == "mse" else F.smooth_l1_loss
    per_target = loss_fn(predictions.float(), targets.float(), reduction="none").mean(-1)  # [B, M, Kt]
    num_positions = target_features.size(1)
    loss_sum = torch.zeros(num_positions, device=images.device).index_add_(0, target_indices.flatten(), per_target.flatten())
    count = torch.zeros(num_positions, device=images.device).index_add_(
        0, target_indices.flatten(), torch.ones_like(per_target.flatten())
    )
    return loss_sum, count


def heat_map(values: torch.Tensor, grid_size: int, cell: int = 8) -> torch.Tensor:
    """``[N]`` values -> ``[3, G * cell, G * cell]`` image, dark (low) to bright yellow (high);
    positions never predicted (NaN) are grey (:func:`ijepa.explore.heat_image`)."""
    return heat_image(values.view(grid_size, grid_size), cell).to(values.device)


class JEPAImages(Callback):
    """At each validation, from a fixed batch of held-out images (the first ``num_images`` of
    the first validation batch, the same masks every time), log to TensorBoard:

    * ``jepa/masks``: the images with the context (blue) and each target block (its own colour);
    * ``jepa/loss_map``: the prediction loss per position averaged over the whole first
      validation batch (which positions are hard to predict), plus its scalar mean;
    * histograms ``hist/target_features`` and, for table-based encodings, ``hist/positions_*``.

    Other loggers are skipped.
    """

    def __init__(self, num_images: int = 8):
        if num_images < 1:
            raise ValueError(f"num_images must be >= 1, got {num_images}.")
        self.num_images = num_images
        self._batch: dict[str, torch.Tensor] | None = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and not trainer.sanity_checking:
            self._batch = {k: v for k, v in batch.items() if torch.is_tensor(v)}

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if self._batch is None or not loggers or trainer.sanity_checking:
            return
        batch, self._batch = self._batch, None
        loss_sum, count = position_loss_map(pl_module, batch)
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        shown = {k: v[: self.num_images] for k, v in batch.items()}
        overlay = mask_overlay(unnormalize(shown["images"]), shown["context_indices"], shown["target_indices"],
                               pl_module.hparams.patch_size)
        grid_size = pl_module.encoder.grid_size
        per_position = torch.where(count > 0, loss_sum / count.clamp_min(1), torch.full_like(loss_sum, float("nan")))
        for logger in loggers:
            writer = logger.experiment
            writer.add_image("jepa/masks", make_grid(overlay.cpu(), nrow=min(self.num_images, 8), padding=2), step)
            writer.add_image("jepa/loss_map", heat_map(per_position.cpu(), grid_size), step)
            with torch.no_grad():
                features = pl_module.target_encoder(shown["images"])
            writer.add_histogram("hist/target_features", features.float().cpu(), step)
            for name, network in (("encoder", pl_module.encoder), ("predictor", pl_module.predictor)):
                table = getattr(network.position, "table", None)
                if callable(table):
                    writer.add_histogram(f"hist/positions_{name}", table().detach().float().cpu(), step)
