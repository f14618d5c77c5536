"""Where ``ijepa predict`` puts its output: one file of features and labels a user can load."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from ijepa.checkpoint import atomic_save, unwritable


class FeatureWriter(BasePredictionWriter):
    """At the end of ``predict``, write every predicted batch's ``features [B, D]`` and ``labels [B]``
    (the module's :meth:`~ijepa.module.IJEPA.predict_step`: mean-pooled target features of the
    held-out split) to one file, ``{"features": [N, D], "labels": [N]}``, loadable with
    ``torch.load(path, weights_only=True)``.

    The file is ``output_dir/features.pt`` (default ``output_dir``: the trainer's log folder,
    e.g. ``lightning_logs/version_3``); under DDP each rank writes ``features_rank{r}.pt`` with its
    share of the images (Lightning's distributed sampler may repeat a few to even out the ranks).
    Written through a temporary file and a rename, like the checkpoints. On in every ``ijepa``
    CLI run under the ``feature_writer`` key.

    Args:
        output_dir: folder for the file; null: the trainer's log folder.
    """

    def __init__(self, output_dir: str | None = None):
        super().__init__(write_interval="epoch")
        self.output_dir = output_dir
        self.written: list[Path] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # refused before predicting, not after: the work would be lost at the write
        if stage == "predict" and self.output_dir is not None and (problem := unwritable(Path(self.output_dir))):
            raise ValueError(
                f"feature_writer.output_dir={self.output_dir!r}: cannot write the features there ({problem}); "
                "point it at a folder (it is created if missing)."
            )

    def path(self, trainer: L.Trainer) -> Path:
        folder = Path(self.output_dir or trainer.log_dir or trainer.default_root_dir)
        name = "features.pt" if trainer.world_size == 1 else f"features_rank{trainer.global_rank}.pt"
        return folder / name

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions  # one loader
        if not batches:
            return
        result = {key: torch.cat([batch[key].detach().cpu() for batch in batches]) for key in ("features", "labels")}
        path = self.path(trainer)
        atomic_save(result, path)
        self.written.append(path)
        rank_zero_info(
            f"Wrote {result['features'].shape[0]} feature vectors of width {result['features'].shape[1]} "
            f"and their labels to {path}"
        )
