"""What every probe shares: feature extraction from frozen encoders, and the schedule.

The classifiers themselves are :mod:`ijepa.classifiers`, the same code ``ijepa eval``'s protocols
use; a probe is a schedule over one of them. :func:`extract_features` encodes a labelled split
once (:func:`ijepa.classifiers.extract_features`: sharded over DDP ranks and gathered back; kept
until the weights change, so the probes of one validation share it); studies and notebooks call
it with ``trainer=None``. :class:`Probe` owns when a probe runs (at the start of ``fit``,
at validations, at the end of ``fit`` if the last step was not probed, in ``validate`` and
``test``), what it logs and prints, and its standing down on unlabelled data; a probe implements
:meth:`Probe.score` on the features of the bank and the queries.
"""

from __future__ import annotations

from contextlib import nullcontext

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from ijepa.classifiers import extract_features as extract_split
from ijepa.data.batch import LabeledBatch
from ijepa.nn.checks import check_range
from ijepa.nn.sharding import tensor_sums

ENCODERS = ("target", "online")


def _weights_key(trainer: L.Trainer | None, pl_module: L.LightningModule, encoder: str) -> tuple:
    """What the pooled features of a data set depend on besides the data: the step, the train or
    eval mode and the weights themselves (a sum per tensor: loading other weights at the same
    step changes it)."""
    network = pl_module.target_encoder if encoder == "target" else pl_module.encoder
    sums = tensor_sums(network.parameters()).tolist()  # one collective when sharded (FSDP2)
    return trainer.global_step if trainer is not None else None, pl_module.training, tuple(sums)


@torch.no_grad()
def extract_features(
    trainer: L.Trainer | None,
    pl_module: L.LightningModule,
    loader: DataLoader,
    encoder: str = "target",
    last_blocks: int = 1,
    tokens: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-pooled ``encoder`` features ``[N, D]`` (``[N, last_blocks * D]``, see
    :meth:`IJEPA.features`) and labels ``[N]`` of every labelled image in ``loader`` (labels ``>= 0``).
    With ``tokens=True``, every token's features instead, ``[N, K, D]`` (:meth:`IJEPA.token_features`).

    Under DDP each rank encodes every ``world_size``-th image and the features are gathered back
    into the dataset's order, so every rank holds what a single process would. ``trainer=None``
    (a study or a notebook, no Lightning loop) encodes in this process, in full precision.

    Pooled features are kept until the weights change, so the k-NN and linear probes of one
    validation encode the bank and the queries once between them (token features, which can be
    large, are not kept).
    """
    if tokens:
        return _extract_features(trainer, pl_module, loader, encoder, last_blocks, tokens)
    weights = _weights_key(trainer, pl_module, encoder)
    cache = getattr(pl_module, "_probe_feature_cache", None)
    if cache is None or cache["weights"] != weights:
        cache = {"weights": weights, "features": {}}
        pl_module._probe_feature_cache = cache
    key = (id(loader.dataset), encoder, last_blocks)
    if key not in cache["features"]:
        cache["features"][key] = _extract_features(trainer, pl_module, loader, encoder, last_blocks, tokens)
    return cache["features"][key]


def _extract_features(
    trainer: L.Trainer | None,
    pl_module: L.LightningModule,
    loader: DataLoader,
    encoder: str,
    last_blocks: int,
    tokens: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
    precision = trainer.precision_plugin.forward_context if trainer is not None else nullcontext

    def encode(batch: LabeledBatch) -> torch.Tensor:
        with precision():
            if tokens:
                return pl_module.token_features(batch.images, encoder, frame_times=batch.frame_times)
            return pl_module.features(batch.images, encoder, last_blocks, frame_times=batch.frame_times)

    found = extract_split(
        loader.dataset,
        encode,
        pl_module.device,
        batch_size=loader.batch_size,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        rank=rank,
        world=world,
        all_gather=pl_module.all_gather,
        pin_memory=loader.pin_memory,
        what="the probe's loader",
    )
    return found.features, found.labels


class Probe(Callback):
    """Base of the probes: a score of the frozen encoder's features on the labelled splits.

    Runs once when ``fit`` starts (the random-init baseline, logged at step 0; ``probe_at_start``),
    at each validation that ends a training epoch whose number is a multiple of
    ``every_n_epochs`` (training epochs, not validations), at the end of ``fit`` if the last step
    was not probed, and in ``validate`` / ``test``. Logs ``val/<metric>`` (``test/<metric>``), a
    fraction in [0, 1], and prints ``<title> (step N): val/<metric> = ...`` during ``fit``.
    On unlabelled data (``num_classes`` below 2) it logs nothing; the first probe of the run warns
    once for all of them.

    Subclasses set ``metric`` and ``title``, implement :meth:`score`, and may override
    :meth:`feature_options` (which features :func:`extract_features` gives them).

    Args:
        every_n_epochs: during ``fit``, probe at validations that end a training epoch whose number
            is a multiple of this.
        encoder: ``target`` (default) or ``online``.
        probe_at_start: also probe the random-init encoder when ``fit`` starts.
    """

    metric = "top1"
    title = "Probe"
    _skip_warned = False  # set on an instance once it has decided to skip

    def __init__(self, every_n_epochs: int = 1, encoder: str = "target", probe_at_start: bool = True):
        check_range(every_n_epochs, "every_n_epochs", 1)
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
        self.every_n_epochs = every_n_epochs
        self.encoder = encoder
        self.probe_at_start = probe_at_start
        self._last_probed_step: int | None = None

    # --- what a probe implements ---------------------------------------------------------------
    def feature_options(self) -> dict:
        """Keyword arguments of :func:`extract_features` (``last_blocks``, ``tokens``)."""
        return {}

    def score(
        self,
        bank: torch.Tensor,
        bank_labels: torch.Tensor,
        queries: torch.Tensor,
        query_labels: torch.Tensor,
        num_classes: int,
    ) -> float:
        """Top-1 accuracy in [0, 1] on the queries of a classifier built from the bank."""
        raise NotImplementedError

    # --- shared --------------------------------------------------------------------------------
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """The probe's score of the current encoder on the datamodule's probe splits."""
        datamodule = trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "probe_train_dataloader"):
            raise ValueError(
                f"{type(self).__name__} needs a datamodule with probe_train_dataloader() and probe_test_dataloader()."
            )
        was_training = pl_module.training
        pl_module.eval()
        options = self.feature_options()
        bank, bank_labels = extract_features(
            trainer, pl_module, datamodule.probe_train_dataloader(), self.encoder, **options
        )
        queries, query_labels = extract_features(
            trainer, pl_module, datamodule.probe_test_dataloader(), self.encoder, **options
        )
        pl_module.train(was_training)
        return self.score(bank, bank_labels, queries, query_labels, datamodule.num_classes)

    def skipped(self, trainer: L.Trainer) -> bool:
        """True when the data is unlabelled; the first time, the first probe of the run warns
        once for all of them."""
        num_classes = getattr(trainer.datamodule, "num_classes", 2)
        if num_classes >= 2:
            return False
        if not self._skip_warned:
            self._skip_warned = True
            probes = [callback for callback in trainer.callbacks if isinstance(callback, Probe)]
            if probes and probes[0] is self:
                names = ", ".join(type(probe).__name__ for probe in probes)
                rank_zero_warn(
                    f"{names} skipped: the data is unlabelled (num_classes={num_classes}; a probe needs at least two "
                    f"classes). For probe metrics give data.source.root one sub-folder per class, or set data.probe_source "
                    f"to a labelled source (e.g. an ImageFolderSource with class sub-folders) that only the probes use."
                )
        return True

    def _probe_and_log_direct(self, trainer: L.Trainer, pl_module: L.LightningModule, when: str) -> None:
        # Outside the validation loop self.log is not available, so write to the loggers directly.
        if self.skipped(trainer):
            return
        top1 = self.evaluate(trainer, pl_module)
        self._last_probed_step = trainer.global_step
        for logger in trainer.loggers:
            logger.log_metrics({f"val/{self.metric}": top1}, step=trainer.global_step)
        rank_zero_info(f"{self.title} ({when}, step {trainer.global_step}): val/{self.metric} = {top1:.4f}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.probe_at_start and trainer.global_step == 0:
            self._probe_and_log_direct(trainer, pl_module, "random init")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.skipped(trainer):
            return
        in_fit = trainer.state.fn == "fit"
        if in_fit and (trainer.current_epoch + 1) % self.every_n_epochs != 0:
            return
        top1 = self.evaluate(trainer, pl_module)
        self._last_probed_step = trainer.global_step
        pl_module.log(f"val/{self.metric}", top1)
        if in_fit:
            rank_zero_info(f"{self.title} (step {trainer.global_step}): val/{self.metric} = {top1:.4f}")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.skipped(trainer):
            pl_module.log(f"test/{self.metric}", self.evaluate(trainer, pl_module))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_probed_step != trainer.global_step:
            self._probe_and_log_direct(trainer, pl_module, "end of training")
