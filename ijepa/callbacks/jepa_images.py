"""Pictures of what the JEPA does, in TensorBoard: masks over images, where prediction is hard,
and histograms of the target features and position tables."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning_utilities.core.apply_func import apply_to_collection
from torchvision.utils import make_grid

from ijepa.data.batch import GridBatch
from ijepa.data.transforms import unnormalize
from ijepa.nn.checks import check_range
from ijepa.nn.sharding import gathered
from ijepa.pictures import clip_mask_overlay, enlarged, heat_map, mask_overlay
from ijepa.step import prediction_loss


@torch.no_grad()
def position_loss_map(pl_module: L.LightningModule, batch: GridBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position prediction loss of one masked batch: ``(loss_sum [N], count [N])``.

    ``loss_sum[i]`` adds the loss (:func:`ijepa.step.prediction_loss` with the module's ``model.loss``,
    averaged over channels) of every prediction of patch ``i`` in the batch, ``count[i]`` how many
    there were, so ``loss_sum.sum() / count.sum()`` is the batch's ``jepa_loss`` and
    ``loss_sum / count`` the map.
    """
    out = pl_module.predict(batch)
    per_target = prediction_loss(out.predictions, out.targets, pl_module.hparams.loss, "none").mean(-1)  # [B, M, Kt]
    num_positions = out.target_features.size(1)
    # the positions predicted: the batch's targets, or those the step says (a student matching every token)
    flat = (batch.target_indices if out.target_indices is None else out.target_indices).flatten()
    loss_sum = torch.zeros(num_positions, device=flat.device).index_add_(0, flat, per_target.flatten())
    count = torch.zeros(num_positions, device=flat.device).index_add_(0, flat, torch.ones_like(per_target.flatten()))
    return loss_sum, count


class JEPAImages(Callback):
    """At each validation, from a fixed batch of held-out images (the first ``num_images`` of
    the first validation batch, the same masks every time), log to TensorBoard:

    * ``jepa/masks``: the images with the context (blue) and each target block (its own colour);
      clips show the first frame of each tubelet side by side, one clip per row;
    * ``jepa/loss_map``: the prediction loss per position averaged over the whole first
      validation batch (which positions are hard to predict), plus its scalar mean; for clips
      the time slices side by side;
    * histograms ``hist/target_features`` and, for table-based encodings, ``hist/positions_*``.

    Images are in their fixed range (pixels as they are, unnormalised), the loss map in its own
    (lowest loss dark); both enlarged to at least 256 px on the short side, four images a row.
    Other loggers are skipped.
    """

    def __init__(self, num_images: int = 8):
        check_range(num_images, "num_images", 1)
        self.num_images = num_images
        self._batch: GridBatch | None = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        # Drawn on one square grid: native-resolution (packed) batches have no such picture.
        if batch_idx == 0 and not trainer.sanity_checking and isinstance(batch, GridBatch):
            self._batch = batch

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if self._batch is None or not loggers or trainer.sanity_checking:
            return
        batch, self._batch = self._batch, None
        loss_sum, count = position_loss_map(pl_module, batch)
        # the first images, each with its first mask set (rows r * B + i: row i is image i's first)
        shown = apply_to_collection(batch, torch.Tensor, lambda tensor: tensor[: self.num_images])
        # Encoders run on every rank: with sharded weights (FSDP2) a forward is a collective.
        with torch.no_grad():
            features = pl_module.target_encoder(shown.images, **pl_module.token_times(shown.frame_times))
        tables = {}
        for name, network in (("encoder", pl_module.encoder), ("predictor", pl_module.predictor)):
            table = getattr(network.position, "table", None)
            if callable(table):
                with gathered(network):
                    tables[name] = table().detach().float().cpu()
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        hp = pl_module.hparams
        if hp.num_frames:  # clips: one row of tubelet first frames per clip, loss map per time slice
            overlay = clip_mask_overlay(
                unnormalize(shown.images),
                shown.context_indices,
                shown.target_indices,
                hp.patch_size,
                hp.tubelet_size,
            )
            grid_size = pl_module.encoder.grid
        else:
            overlay = mask_overlay(
                unnormalize(shown.images), shown.context_indices, shown.target_indices, hp.patch_size
            )
            grid_size = pl_module.encoder.grid[0]  # the side of the square grid
        per_position = torch.where(count > 0, loss_sum / count.clamp_min(1), torch.full_like(loss_sum, float("nan")))
        for logger in loggers:
            writer = logger.experiment
            per_row = 1 if hp.num_frames else min(self.num_images, 4)
            writer.add_image("jepa/masks", enlarged(make_grid(overlay.cpu(), nrow=per_row, padding=2)), step)
            writer.add_image("jepa/loss_map", enlarged(heat_map(per_position.cpu(), grid_size)), step)
            writer.add_histogram("hist/target_features", features.float().cpu(), step)
            for name, table in tables.items():
                writer.add_histogram(f"hist/positions_{name}", table, step)
