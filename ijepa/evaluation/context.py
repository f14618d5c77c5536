"""What a protocol is given: the frozen encoder's features of the train and test splits, the
validation split carved from the train labels, and batches of augmented training images.

Every draw (validation split, batch order, augmentation) is a function of the evaluation's seed
and, for batches, of ``(epoch, index)``, as in ``ijepa fit`` (:mod:`ijepa.data.sampling`), so a
run on ``world`` processes sees the same global batches as a run on one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, Subset

from ijepa.classifiers import extract_features, gather_in_order
from ijepa.data.batch import LabeledBatch
from ijepa.data.collate import labeled_collate
from ijepa.data.sampling import EpochSampler, SeededSamples, mix_seed
from ijepa.evaluation.cache import KINDS, FeatureCache
from ijepa.evaluation.data import EvalData
from ijepa.evaluation.encoders import FrozenEncoder
from ijepa.evaluation.splits import validation_split

# mix_seed ignores trailing zeros: a tag per stream keeps the draws of one seed apart (the batch
# order of cached features is ijepa.classifiers.heads.ORDER_STREAM, 2)
AUGMENT_STREAM = 1


def encode(
    fabric: Fabric,
    encoder: FrozenEncoder,
    images: torch.Tensor,
    kind: str,
    last_blocks: int = 1,
    frame_times: torch.Tensor | None = None,
) -> torch.Tensor:
    """One batch through the frozen encoder, under the run's precision, as float32: ``[B, last_blocks, D]``
    block means (``blocks``) or ``[B, K, D]`` tokens (``tokens``). Clips come with their ``frame_times``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    times = {} if frame_times is None else {"frame_times": frame_times}
    with torch.no_grad(), fabric.autocast():
        out = encoder.tokens(images, **times) if kind == "tokens" else encoder.block_means(images, last_blocks, **times)
    return out.float()


@dataclass
class EvalContext:
    fabric: Fabric
    encoder: FrozenEncoder
    data: EvalData
    cache: FeatureCache
    size: int
    seed: int
    logged: dict = field(default_factory=dict)
    _split: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_classes(self) -> int:
        if self.data.num_classes is None:
            self.features("train", "blocks", 1)
        return self.data.num_classes

    def features(self, split: str, kind: str = "blocks", last_blocks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, labels)`` of the whole ``train`` or ``test`` split (evaluation transform):
        ``[N, last_blocks * D]`` block features or ``[N, K, D]`` tokens, ``[N]`` labels."""
        entry = self._entry(split, kind, last_blocks)
        return entry["features"], entry["labels"]

    def extract(self, dataset, kind: str, last_blocks: int) -> dict[str, torch.Tensor]:
        """``{"features", "labels", "positions"}`` of every labelled item of ``dataset``, on the CPU
        (:func:`ijepa.classifiers.extract_features`, sharded over the processes)."""
        fabric = self.fabric

        def encode_batch(batch: LabeledBatch) -> torch.Tensor:
            return encode(fabric, self.encoder, batch.images, kind, last_blocks, batch.frame_times)

        found = extract_features(
            dataset,
            encode_batch,
            fabric.device,
            batch_size=max(1, self.data.batch_size // fabric.world_size),
            num_workers=self.data.num_workers,
            rank=fabric.global_rank,
            world=fabric.world_size,
            all_gather=fabric.all_gather,
            what="data.source",
        )
        return {name: value.cpu() for name, value in found._asdict().items()}

    def _entry(self, split: str, kind: str, last_blocks: int) -> dict:
        def make():
            return self.extract(self.data.dataset(split, self.size), kind, last_blocks)

        if self.data.num_classes is None:
            self.data.dataset(split, self.size)  # reads num_classes (and fails early on unlabelled data)
        return self.cache.get(self.fabric, split, kind, last_blocks, make)

    @property
    def train_idx(self) -> torch.Tensor:
        return self._validation()[0]

    @property
    def val_idx(self) -> torch.Tensor:
        return self._validation()[1]

    def _validation(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._split is None:
            labels = self._entry("train", "blocks", 1)["labels"]
            self._split = validation_split(labels, self.data.val_fraction, self.seed)
        return self._split

    def val_features(self, kind: str, last_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, labels)`` of the validation part alone: block features are cut from the
        train split's (they are needed for its labels anyway); tokens are extracted for these
        images only, never for the whole train split (ImageNet's would not fit in memory)."""
        if kind == "blocks":
            x, y = self.features("train", kind, last_blocks)
            return x[self.val_idx], y[self.val_idx]
        positions = self._entry("train", "blocks", 1)["positions"][self.val_idx].tolist()

        def make():
            return self.extract(Subset(self.data.dataset("train", self.size), positions), kind, last_blocks)

        split = f"val-{self.data.val_fraction}-{self.seed}"  # the validation part depends on both
        entry = self.cache.get(self.fabric, split, kind, last_blocks, make)
        return entry["features"], entry["labels"]

    def train_val(self, kind: str, last_blocks: int) -> tuple[torch.Tensor, ...]:
        """``(x_train, y_train, x_val, y_val)``: the train split's features without and with only
        its validation part."""
        x, y = self.features("train", kind, last_blocks)
        return x[self.train_idx], y[self.train_idx], x[self.val_idx], y[self.val_idx]

    def steps_per_epoch(self, batch_size: int) -> int:
        world = self.fabric.world_size
        if batch_size % world:
            raise ValueError(f"batch_size {batch_size} must be a multiple of the number of processes ({world}).")
        steps = (len(self.train_idx) // world) // (batch_size // world)
        if steps == 0:
            raise ValueError(
                f"batch_size {batch_size} is larger than the train split without its validation part "
                f"({len(self.train_idx)} images)."
            )
        return steps

    def augmented_batches(
        self, epoch: int, batch_size: int, kind: str, last_blocks: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Global batches of augmented training images (the validation part excluded), encoded
        on the fly: each process encodes ``batch_size / world`` images and every process gets the
        features of all of them, in the order one process would see."""
        self.steps_per_epoch(batch_size)  # checks the batch size
        fabric, world = self.fabric, self.fabric.world_size
        positions = self._entry("train", "blocks", 1)["positions"][self.train_idx].tolist()
        dataset = SeededSamples(
            Subset(self.data.dataset("train", self.size, augment=True), positions), mix_seed(self.seed, AUGMENT_STREAM)
        )
        local = batch_size // world
        sampler = EpochSampler(
            dataset,
            local,
            num_replicas=world,
            rank=fabric.global_rank,
            seed=mix_seed(self.seed, AUGMENT_STREAM),
            shuffle=True,
            drop_last=True,
        )
        sampler.set_epoch(epoch)
        loader = DataLoader(
            dataset,
            batch_size=local,
            sampler=sampler,
            num_workers=self.data.num_workers,
            collate_fn=labeled_collate,
            drop_last=True,
        )
        for batch in loader:
            batch = batch.to(fabric.device)
            features = encode(fabric, self.encoder, batch.images, kind, last_blocks, batch.frame_times)
            if kind == "blocks":
                features = features.flatten(1)
            yield (
                gather_in_order(features, fabric.all_gather, world),
                gather_in_order(batch.labels, fabric.all_gather, world),
            )

    def warn(self, message: str) -> None:
        """A warning on rank zero (stderr), kept for the results file."""
        if self.fabric.is_global_zero:
            warnings.warn(message, stacklevel=2)

    def log(self, metrics: dict[str, float], step: int = 0) -> None:
        """TensorBoard scalars (rank zero)."""
        self.logged.update(metrics)
        self.fabric.log_dict(metrics, step=step)
