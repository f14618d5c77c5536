"""k-NN probe of frozen encoder features (cosine-weighted voting, as in DINO)."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy


def knn_scores(
    bank_features: torch.Tensor,
    bank_labels: torch.Tensor,
    query_features: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores ``[Q, C]`` of ``query_features [Q, D]`` from their ``k`` most cosine-similar
    rows of ``bank_features [N, D]`` (labels ``[N]``), each voting ``exp(similarity / temperature)``."""
    bank = F.normalize(bank_features.float(), dim=1)
    queries = F.normalize(query_features.float(), dim=1)
    k = min(k, bank.size(0))
    scores = []
    for chunk in queries.split(chunk_size):
        similarity, neighbours = (chunk @ bank.T).topk(k, dim=1)
        votes = torch.zeros(chunk.size(0), num_classes, device=chunk.device)
        votes.scatter_add_(1, bank_labels[neighbours], (similarity / temperature).exp())
        scores.append(votes)
    return torch.cat(scores)


def _shard(loader: DataLoader, rank: int, world: int) -> DataLoader:
    """This rank's share of an evaluation loader: images ``rank, rank + world, ...``, padded with
    the last image so every rank runs the same number of batches (the padding is dropped later)."""
    size = len(loader.dataset)
    per_rank = math.ceil(size / world)
    indices = [min(j * world + rank, size - 1) for j in range(per_rank)]
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=indices,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
    )


def _unshard(gathered: torch.Tensor, size: int) -> torch.Tensor:
    """``[world, per_rank, ...]`` from :func:`_shard`'s loaders -> ``[size, ...]`` in dataset order."""
    return gathered.transpose(0, 1).flatten(0, 1)[:size]


def _weights_key(trainer: L.Trainer, pl_module: L.LightningModule, encoder: str) -> tuple:
    """What the pooled features of a data set depend on besides the data: the step, the train or
    eval mode and the weights themselves (a sum per tensor: loading other weights at the same
    step changes it)."""
    network = pl_module.target_encoder if encoder == "target" else pl_module.encoder
    sums = torch.stack([p.detach().float().sum() for p in network.parameters()]).tolist()
    return trainer.global_step, pl_module.training, tuple(sums)


@torch.no_grad()
def extract_features(
    trainer: L.Trainer,
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
    into the dataset's order, so every rank holds what a single process would.

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
    trainer: L.Trainer, pl_module: L.LightningModule, loader: DataLoader, encoder: str, last_blocks: int, tokens: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    world, rank = trainer.world_size, trainer.global_rank
    if world > 1:
        loader = _shard(loader, rank, world)
    features, labels = [], []
    with trainer.precision_plugin.forward_context():
        for batch in loader:
            images = batch["images"].to(pl_module.device, non_blocking=True)
            times = batch.get("frame_times")
            times = None if times is None else times.to(pl_module.device, non_blocking=True)
            if tokens:
                features.append(pl_module.token_features(images, encoder, frame_times=times).float())
            else:
                features.append(pl_module.features(images, encoder, last_blocks, frame_times=times).float())
            labels.append(batch["labels"].to(pl_module.device))
    features, labels = torch.cat(features), torch.cat(labels)
    if world > 1:
        size = len(loader.dataset)
        features = _unshard(pl_module.all_gather(features), size)
        labels = _unshard(pl_module.all_gather(labels), size)
    keep = labels >= 0  # unlabelled images never enter a probe
    if not keep.any():
        raise ValueError("the probe's loader yielded no labelled images (labels >= 0).")
    return features[keep], labels[keep]


class Probe(Callback):
    """Base of the probes, which need labelled data: :meth:`skipped` tells a probe to stand down
    when the datamodule has fewer than two classes (``num_classes`` 0 or 1: unlabelled data)."""

    _skip_warned = False  # set on an instance once it has decided to skip

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
                    f"classes). For probe metrics give data.root one sub-folder per class, or point data.probe_root at "
                    f"a labelled folder (class sub-folders) that only the probes use."
                )
        return True


class KNNProbe(Probe):
    """Score mean-pooled encoder features with a cosine-weighted k-NN classifier.

    The bank is the labeled train split (``datamodule.knn_train_dataloader()``), the queries the
    held-out split (``datamodule.knn_test_dataloader()``); images labelled ``-1`` (unlabeled) never
    enter. Runs once when ``fit`` starts (the random-init baseline, logged at step 0), at each
    validation that ends a training epoch whose number is a multiple of ``every_n_epochs`` (it
    counts training epochs, not validations: with ``check_val_every_n_epoch: 6`` use 6 to probe at
    every validation), at the end of ``fit`` if the last step was not probed, and in
    ``validate`` / ``test``. Logs ``val/knn_top1`` (``test/knn_top1``), a fraction in [0, 1].
    On unlabelled data (``num_classes`` below 2) it logs nothing and warns once (:class:`Probe`).
    """

    def __init__(
        self,
        k: int = 20,
        temperature: float = 0.07,
        every_n_epochs: int = 1,
        encoder: str = "target",
        probe_at_start: bool = True,
    ):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}.")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}.")
        if encoder not in ("target", "online"):
            raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
        self.k = k
        self.temperature = temperature
        self.every_n_epochs = every_n_epochs
        self.encoder = encoder
        self.probe_at_start = probe_at_start
        self._last_probed_step: int | None = None

    def extract(self, trainer: L.Trainer, pl_module: L.LightningModule, loader) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean-pooled features ``[N, D]`` and labels ``[N]`` of the labelled images (see
        :func:`extract_features`)."""
        return extract_features(trainer, pl_module, loader, self.encoder)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """Top-1 k-NN accuracy in [0, 1] of the current encoder."""
        datamodule = trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "knn_train_dataloader"):
            raise ValueError("KNNProbe needs a datamodule with knn_train_dataloader() and knn_test_dataloader().")
        was_training = pl_module.training
        pl_module.eval()
        bank_features, bank_labels = self.extract(trainer, pl_module, datamodule.knn_train_dataloader())
        query_features, query_labels = self.extract(trainer, pl_module, datamodule.knn_test_dataloader())
        pl_module.train(was_training)
        num_classes = datamodule.num_classes
        scores = knn_scores(bank_features, bank_labels, query_features, num_classes, self.k, self.temperature)
        accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro").to(scores.device)
        return float(accuracy(scores, query_labels))

    def _probe_and_log_direct(self, trainer: L.Trainer, pl_module: L.LightningModule, when: str) -> None:
        # Outside the validation loop self.log is not available, so write to the loggers directly.
        if self.skipped(trainer):
            return
        top1 = self.evaluate(trainer, pl_module)
        self._last_probed_step = trainer.global_step
        for logger in trainer.loggers:
            logger.log_metrics({"val/knn_top1": top1}, step=trainer.global_step)
        rank_zero_info(f"k-NN probe ({when}, step {trainer.global_step}): val/knn_top1 = {top1:.4f}")

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
        pl_module.log("val/knn_top1", top1)
        if in_fit:
            rank_zero_info(f"k-NN probe (step {trainer.global_step}): val/knn_top1 = {top1:.4f}")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.skipped(trainer):
            pl_module.log("test/knn_top1", self.evaluate(trainer, pl_module))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_probed_step != trainer.global_step:
            self._probe_and_log_direct(trainer, pl_module, "end of training")
