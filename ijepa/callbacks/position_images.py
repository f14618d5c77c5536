"""Pictures of the learned position tables in TensorBoard."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from ijepa.nn.position import AdditivePositionEmbedding, cosine_similarity_grid


class PositionSimilarityImages(Callback):
    """At each validation, log ViT's Figure 7 for every table-based position encoding (``learned``,
    ``learned_2d``, ``sincos``) of the encoder and the predictor: the cosine similarity of each
    position's embedding with every other position, one tile per position. Images are named
    ``positions/encoder`` and ``positions/predictor``; other loggers are skipped."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        for name, network in (("encoder", pl_module.encoder), ("predictor", pl_module.predictor)):
            position = network.position
            if not isinstance(position, AdditivePositionEmbedding):
                continue
            image = cosine_similarity_grid(position.table(), position.grid_height, position.grid_width)
            for logger in loggers:
                logger.experiment.add_image(f"positions/{name}", image.cpu(), global_step=trainer.global_step)
