"""Pictures of the learned position tables in TensorBoard."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from ijepa.nn.position import AdditivePosition
from ijepa.nn.sharding import gathered
from ijepa.pictures import cosine_similarity_grid, enlarged, heat_image


class PositionSimilarityImages(Callback):
    """At each validation, log ViT's Figure 7 for every table-based position encoding (``learned``,
    ``learned_2d``, ``sincos``) of the encoder and the predictor: the cosine similarity of each
    position's embedding with every other position, one tile per position. Images are named
    ``positions/encoder`` and ``positions/predictor``; other loggers are skipped.

    Clip tables (``sincos_3d``, ``learned_flat_3d``) give the figure for the first time slice, plus
    ``positions/<name>_time``: the ``T' x T'`` similarity of time slices (the cosine of the same
    spatial position at two times, averaged over positions).

    Each picture is scaled to its own range (lowest similarity dark, highest bright) and enlarged
    to at least 256 px on its short side (:func:`ijepa.pictures.enlarged`)."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        for name, network in (("encoder", pl_module.encoder), ("predictor", pl_module.predictor)):
            position = network.position
            if not isinstance(position, AdditivePosition):
                continue
            with gathered(network):  # every rank takes part when the weights are sharded (FSDP2)
                table = position.table().detach().float().clone()
            if not trainer.is_global_zero:
                continue
            images = {}
            if position.dims == 3:
                slices = F.normalize(
                    table.view(position.grid[0], position.grid_height * position.grid_width, -1), dim=-1
                )
                images[f"positions/{name}_time"] = heat_image(
                    torch.einsum("tsd,usd->tu", slices, slices) / slices.size(1), 16
                )
                table = table[: position.grid_height * position.grid_width]
            images[f"positions/{name}"] = cosine_similarity_grid(
                table, position.grid_height, position.grid_width, own_range=True
            )
            for logger in loggers:
                for tag, image in images.items():
                    logger.experiment.add_image(tag, enlarged(image.cpu()), global_step=trainer.global_step)
