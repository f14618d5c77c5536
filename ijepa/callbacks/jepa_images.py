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
    """ImageNet-normalised ``[B, 3, H, W]`` (or clips ``[B, 3, T, H, W]``) -> ``[0, 1]``."""
    shape = (1, 3) + (1,) * (images.dim() - 2)
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(shape)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(shape)
    return (images.float() * std + mean).clamp(0, 1)


def _token_tints(batch: int, num_tokens: int, context_indices: torch.Tensor, target_indices: torch.Tensor,
                 device) -> tuple[torch.Tensor, torch.Tensor]:
    # Per token: its tint [B, N, 3] (context blue, block m its colour, drawn over the context)
    # and whether it is painted at all [B, N].
    colour = torch.zeros(batch, num_tokens, 3, device=device)
    painted = torch.zeros(batch, num_tokens, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)[:, None]
    colour[rows, context_indices] = torch.tensor(CONTEXT_COLOUR, device=device)
    painted[rows, context_indices] = True
    for block in range(target_indices.size(1)):
        colour[rows, target_indices[:, block]] = torch.tensor(TARGET_COLOURS[block % len(TARGET_COLOURS)], device=device)
        painted[rows, target_indices[:, block]] = True
    return colour, painted


def mask_overlay(
    images: torch.Tensor, context_indices: torch.Tensor, target_indices: torch.Tensor, patch_size: int, alpha: float = 0.5
) -> torch.Tensor:
    """Images ``[B, 3, H, W]`` in [0, 1] with the context patches tinted blue and each target
    block ``m`` tinted with ``TARGET_COLOURS[m]`` (targets drawn over the context); patches in
    neither are darkened. Returns ``[B, 3, H, W]`` in [0, 1]."""
    batch, _, height, width = images.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    colour, painted = _token_tints(batch, grid_h * grid_w, context_indices, target_indices, images.device)
    # per-patch maps -> per-pixel maps
    colour = colour.view(batch, grid_h, grid_w, 3).permute(0, 3, 1, 2)
    colour = colour.repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    painted = painted.view(batch, 1, grid_h, grid_w).repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    tinted = (1 - alpha) * images + alpha * colour
    return torch.where(painted, tinted, 0.35 * images)


def clip_mask_overlay(clips: torch.Tensor, context_indices: torch.Tensor, target_indices: torch.Tensor,
                      patch_size: int, tubelet_size: int, alpha: float = 0.5) -> torch.Tensor:
    """Clips ``[B, 3, T, H, W]`` in [0, 1] with the masks of their ``T' x H' x W'`` token grid:
    the first frame of each tubelet, tinted as :func:`mask_overlay` does, side by side in time
    order. Returns ``[B, 3, H, T' * W]``."""
    batch, _, frames, height, width = clips.shape
    grid_t, grid_h, grid_w = frames // tubelet_size, height // patch_size, width // patch_size
    colour, painted = _token_tints(batch, grid_t * grid_h * grid_w, context_indices, target_indices, clips.device)
    colour = colour.view(batch, grid_t, grid_h, grid_w, 3).permute(0, 4, 1, 2, 3)  # [B, 3, T', H', W']
    colour = colour.repeat_interleave(patch_size, 3).repeat_interleave(patch_size, 4)
    painted = painted.view(batch, 1, grid_t, grid_h, grid_w).repeat_interleave(patch_size, 3).repeat_interleave(patch_size, 4)
    shown = clips[:, :, ::tubelet_size]  # [B, 3, T', H, W]
    tinted = torch.where(painted, (1 - alpha) * shown + alpha * colour, 0.35 * shown)
    return tinted.permute(0, 1, 3, 2, 4).reshape(batch, 3, height, grid_t * width)


@torch.no_grad()
def position_loss_map(pl_module: L.LightningModule, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position prediction loss of one masked batch: ``(loss_sum [N], count [N])``.

    ``loss_sum[i]`` adds the loss (the module's smooth L1 or MSE, averaged over channels) of every
    prediction of patch ``i`` in the batch, ``count[i]`` how many there were, so
    ``loss_sum.sum() / count.sum()`` is the batch's ``jepa_loss`` and ``loss_sum / count`` the map.
    """
    images, context_indices, target_indices = batch["images"], batch["context_indices"], batch["target_indices"]
    batch_size, num_blocks, num_targets = target_indices.shape
    times = pl_module.token_times(batch.get("frame_times"))  # clips' timestamps, if any
    target_features = pl_module.target_encoder(images, **times)
    target_features = F.layer_norm(target_features, target_features.shape[-1:])
    targets = gather_patches(target_features, target_indices.flatten(1)).view(batch_size, num_blocks, num_targets, -1)
    context = pl_module.encoder(images, context_indices, **times)
    predictions = pl_module.predictor(context, context_indices, target_indices, **times)
    loss_fn = F.mse_loss if pl_module.hparams.loss == "mse" else F.smooth_l1_loss
    per_target = loss_fn(predictions.float(), targets.float(), reduction="none").mean(-1)  # [B, M, Kt]
    num_positions = target_features.size(1)
    loss_sum = torch.zeros(num_positions, device=images.device).index_add_(0, target_indices.flatten(), per_target.flatten())
    count = torch.zeros(num_positions, device=images.device).index_add_(
        0, target_indices.flatten(), torch.ones_like(per_target.flatten())
    )
    return loss_sum, count


def heat_map(values: torch.Tensor, grid_size: int | tuple[int, int, int], cell: int = 8) -> torch.Tensor:
    """``[N]`` values -> ``[3, G * cell, G * cell]`` image, dark (low) to bright yellow (high);
    positions never predicted (NaN) are grey (:func:`ijepa.explore.heat_image`). For a clip
    grid ``(T', H', W')`` the ``T'`` time slices sit side by side: ``[3, H' * cell, T' W' * cell]``."""
    if isinstance(grid_size, int):
        grid = values.view(grid_size, grid_size)
    else:
        grid_t, grid_h, grid_w = grid_size
        grid = values.view(grid_t, grid_h, grid_w).permute(1, 0, 2).reshape(grid_h, grid_t * grid_w)
    return heat_image(grid, cell).to(values.device)


class JEPAImages(Callback):
    """At each validation, from a fixed batch of held-out images (the first ``num_images`` of
    the first validation batch, the same masks every time), log to TensorBoard:

    * ``jepa/masks``: the images with the context (blue) and each target block (its own colour);
      clips show the first frame of each tubelet side by side, one clip per row;
    * ``jepa/loss_map``: the prediction loss per position averaged over the whole first
      validation batch (which positions are hard to predict), plus its scalar mean; for clips
      the time slices side by side;
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
        hp = pl_module.hparams
        if hp.num_frames:  # clips: one row of tubelet first frames per clip, loss map per time slice
            overlay = clip_mask_overlay(unnormalize(shown["images"]), shown["context_indices"], shown["target_indices"],
                                        hp.patch_size, hp.tubelet_size)
            grid_size = pl_module.encoder.grid
        else:
            overlay = mask_overlay(unnormalize(shown["images"]), shown["context_indices"], shown["target_indices"],
                                   hp.patch_size)
            grid_size = pl_module.encoder.grid_size
        per_position = torch.where(count > 0, loss_sum / count.clamp_min(1), torch.full_like(loss_sum, float("nan")))
        for logger in loggers:
            writer = logger.experiment
            per_row = 1 if hp.num_frames else min(self.num_images, 8)
            writer.add_image("jepa/masks", make_grid(overlay.cpu(), nrow=per_row, padding=2), step)
            writer.add_image("jepa/loss_map", heat_map(per_position.cpu(), grid_size), step)
            with torch.no_grad():
                features = pl_module.target_encoder(shown["images"], **pl_module.token_times(shown.get("frame_times")))
            writer.add_histogram("hist/target_features", features.float().cpu(), step)
            for name, network in (("encoder", pl_module.encoder), ("predictor", pl_module.predictor)):
                table = getattr(network.position, "table", None)
                if callable(table):
                    writer.add_histogram(f"hist/positions_{name}", table().detach().float().cpu(), step)
