"""What a protocol is given: the frozen encoder's features of the train and test splits, the
validation split carved from the train labels, and batches of augmented training images.

Every draw (validation split, batch order, augmentation) is a function of the evaluation's seed
and, for batches, of ``(epoch, index)``, as in ``ijepa fit`` (:mod:`ijepa.data.sampling`), so a
run on ``world`` processes sees the same global batches as a run on one.

Dense data (items ``(image, {"label", "mask", "count"})``, :class:`~ijepa.data.batch.DenseBatch`)
adds each image's mask and object count to its features; :meth:`EvalContext.with_target` gives
the same context with masks or count classes in place of the labels, for the dense protocols.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, Subset

from ijepa.classifiers import extract_features, gather_in_order
from ijepa.data.batch import IGNORE_INDEX, LabeledBatch
from ijepa.data.collate import labeled_collate
from ijepa.data.sampling import EpochSampler, SeededSamples, mix_seed
from ijepa.evaluation.cache import KINDS, TARGETS, FeatureCache, last_blocks_of
from ijepa.evaluation.data import EvalData
from ijepa.evaluation.encoders import FrozenEncoder
from ijepa.evaluation.readouts import BLOCKS, Readout, is_pooled
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
    readout: Readout | None = None,
) -> torch.Tensor:
    """One batch through the frozen encoder, under the run's precision, as float32: ``[B, last_blocks, D]``
    block means (``blocks``), ``[B, last_blocks, F]`` the last blocks' tokens pooled by ``readout``
    (``blocks:<key>``, :mod:`ijepa.evaluation.readouts`), ``[B, K, D]`` tokens (``tokens``) or
    ``[B, last_blocks, K, D]`` tokens of the last blocks (``patches``). Clips come with their ``frame_times``."""
    if kind not in KINDS and not is_pooled(kind):
        raise ValueError(f"kind must be one of {KINDS} or blocks:<readout>, got {kind!r}.")
    if kind not in KINDS and readout is None:
        raise ValueError(f"kind {kind!r} needs its readout.")
    times = {} if frame_times is None else {"frame_times": frame_times}
    with torch.no_grad(), fabric.autocast():
        if kind == "tokens":
            out = encoder.tokens(images, **times)
        elif kind == "patches":
            out = encoder.block_tokens(images, last_blocks, **times)
        elif kind == BLOCKS:
            out = encoder.block_means(images, last_blocks, **times)
        else:
            out = readout.pool(encoder.block_tokens(images, last_blocks, **times), encoder.token_shape)
    return out.float()


def _masks_uint8(batch) -> torch.Tensor:
    if batch.masks.numel() and (batch.masks.min() < 0 or batch.masks.max() > IGNORE_INDEX):
        raise ValueError(f"mask values must be class ids in 0..{IGNORE_INDEX} ({IGNORE_INDEX}: ignored).")
    return batch.masks.to(torch.uint8)


# What extract_features gathers of a dense batch besides its labels: its masks (as uint8: class ids
# and IGNORE_INDEX fit, an eighth of int64's memory) and object counts.
DENSE_EXTRAS = {"masks": _masks_uint8, "counts": lambda batch: batch.counts}


def is_dense(dataset) -> bool:
    """Whether ``dataset``'s items carry masks and counts (``(image, {"label", "mask", "count"})``)."""
    return len(dataset) > 0 and isinstance(dataset[0][1], dict)


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
    target: str = "labels"  # what features() hands out beside the features: labels, masks or counts (as classes)
    readouts: dict[str, Readout] = field(default_factory=dict)  # the pooled kinds asked for, by kind

    def pooled(self, readout: Readout) -> str:
        """The feature kind of ``readout``'s pooled block features (``blocks`` for the mean), which
        :meth:`features` and :meth:`augmented_batches` then hand out. A readout the encoder's token
        grid cannot hold is refused here, before any extraction."""
        readout.width(self.encoder.width, self.encoder.token_shape)
        self.readouts[readout.kind] = readout
        return readout.kind

    @property
    def num_classes(self) -> int:
        """Classes of the target: the source's image classes; for masks, 1 + the largest class id in
        the train split's masks; for counts, the distinct counts of the train split."""
        if self.target == "masks":
            masks = self._labelled("train")["masks"]
            kept = masks[masks != IGNORE_INDEX]
            return int(kept.max()) + 1 if kept.numel() else 1
        if self.target == "counts":
            return len(self.count_classes)
        if self.data.num_classes is None:
            self._labelled("train")
        return self.data.num_classes

    @property
    def count_classes(self) -> torch.Tensor:
        """The distinct object counts of the train split, ascending: count class ``i`` is ``count_classes[i]``."""
        return torch.unique(self._labelled("train")["counts"])

    def with_target(self, target: str, who: str) -> EvalContext:
        """This context with ``target`` (``masks`` or ``counts``) in place of the labels: ``features()``,
        ``train_val()``, ``val_features()`` and ``augmented_batches()`` hand out masks ``[N, H, W]`` or
        count classes (:attr:`count_classes`; a count the train split lacks is ``-1``, never predicted).
        The validation split stays that of the labels. One line naming ``who`` (the protocol) for
        data without them."""
        if target not in ("labels", *TARGETS):
            raise ValueError(f"target must be one of {('labels', *TARGETS)}, got {target!r}.")
        if target == "labels":
            return dataclasses.replace(self, target=target)
        name = type(self.data.source).__name__
        if self.data.clips:
            raise ValueError(f"{who} needs images with {target}; data.source {name} gives clips.")
        if not is_dense(self.data.dataset("train", self.size)):
            how = (
                "set data.source.init_args.dense: true (ijepa.data.ShapesSource)"
                if target == "counts"
                else "set data.source.init_args.dense: true (ijepa.data.ShapesSource) or masks: <folder of masks> "
                "(ijepa.data.ImageFolderSource)"
            )
            raise ValueError(
                f"{who} needs {'object counts' if target == 'counts' else 'masks'}: data.source {name} gives none; {how}."
            )
        if target == "counts":
            counts = self._labelled("train")["counts"]
            if (counts < 0).any():
                raise ValueError(
                    f"{who} needs object counts: data.source {name} does not know them ({int((counts < 0).sum())} of "
                    f"{len(counts)} train images have count -1); use a source that counts its objects (ijepa.data.ShapesSource "
                    "with dense: true)."
                )
        return dataclasses.replace(self, target=target)

    def _targets(self, entry: dict) -> torch.Tensor:
        if self.target == "labels":
            return entry["labels"]
        if self.target == "masks":
            return entry["masks"]
        return self.count_class(entry["counts"])

    def count_class(self, counts: torch.Tensor) -> torch.Tensor:
        """Each count's class (its index in :attr:`count_classes`), ``-1`` for a count the train split lacks."""
        classes = self.count_classes.to(counts.device)
        index = torch.searchsorted(classes, counts).clamp_max(len(classes) - 1)
        return torch.where(classes[index] == counts, index, torch.full_like(index, -1))

    def _labelled(self, split: str) -> dict:
        """An entry of ``split`` for what every kind carries (labels, positions, masks, counts): a
        readout's features already extracted, else the mean-pooled ones (no second pass for them)."""
        for kind in self.readouts:
            if (split, kind) in self.cache.memory:
                return self.cache.memory[(split, kind)]
        return self._entry(split, BLOCKS, 1)

    def test_size(self) -> int:
        """Labelled images of the test split."""
        return len(self._labelled("test")["labels"])

    def features(self, split: str, kind: str = "blocks", last_blocks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, targets)`` of the whole ``train`` or ``test`` split (evaluation transform):
        ``[N, last_blocks * D]`` block features, ``[N, K, D]`` tokens or ``[N, K, last_blocks * D]``
        tokens of the last blocks (``patches``); ``[N]`` labels (or count classes) or ``[N, H, W]``
        masks, as :attr:`target` says."""
        entry = self._entry(split, kind, last_blocks)
        return entry["features"], self._targets(entry)

    def extract(self, dataset, kind: str, last_blocks: int) -> dict[str, torch.Tensor]:
        """``{"features", "labels", "positions"}`` of every labelled item of ``dataset``, on the CPU
        (:func:`ijepa.classifiers.extract_features`, sharded over the processes)."""
        fabric = self.fabric

        def encode_batch(batch: LabeledBatch) -> torch.Tensor:
            return encode(
                fabric, self.encoder, batch.images, kind, last_blocks, batch.frame_times, self.readouts.get(kind)
            )

        extras = DENSE_EXTRAS if is_dense(dataset) else None

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
            extras=extras,
        )
        found = {**found._asdict(), **(found.extras or {})}
        return {name: value.cpu() for name, value in found.items() if name != "extras"}

    def _entry(self, split: str, kind: str, last_blocks: int) -> dict:
        def make():
            return self.extract(self.data.dataset(split, self.size), kind, last_blocks)

        if self.data.num_classes is None:
            self.data.dataset(split, self.size)  # reads num_classes (and fails early on unlabelled data)
        return self.cache.get(self.fabric, split, kind, last_blocks, make)

    def positions(self, split: str, kind: str = "blocks", last_blocks: int = 1) -> torch.Tensor:
        """Each row of :meth:`features`' index in the split's dataset."""
        return self._entry(split, kind, last_blocks)["positions"]

    def mask_file(self, split: str, position: int) -> str:
        """Where the mask of item ``position`` of ``split`` comes from: the mask file of an image
        folder (``masks``), the item of shards, else the item's index."""
        dataset = self.data.dataset(split, self.size)
        while isinstance(dataset, Subset):
            dataset, position = dataset.dataset, int(dataset.indices[position])
        if callable(getattr(dataset, "mask_path", None)) and getattr(dataset, "masks", None) is not None:
            return str(dataset.mask_path(dataset.samples[position][0]))
        if isinstance(getattr(dataset, "url", None), str):  # ShardImages
            return f"{dataset.url} item {position} mask"
        return f"{split} item {position}"

    @property
    def train_idx(self) -> torch.Tensor:
        return self._validation()[0]

    @property
    def val_idx(self) -> torch.Tensor:
        return self._validation()[1]

    def _validation(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._split is None:
            labels = self._labelled("train")["labels"]
            self._split = validation_split(labels, self.data.val_fraction, self.seed)
        return self._split

    def val_features(self, kind: str, last_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, labels)`` of the validation part alone: block features are cut from the
        train split's (they are needed for its labels anyway); tokens are extracted for these
        images only, never for the whole train split (ImageNet's would not fit in memory)."""
        if is_pooled(kind):
            x, y = self.features("train", kind, last_blocks)
            return x[self.val_idx], y[self.val_idx]
        positions = self._labelled("train")["positions"][self.val_idx].tolist()

        def make():
            return self.extract(Subset(self.data.dataset("train", self.size), positions), kind, last_blocks)

        split = f"val-{self.data.val_fraction}-{self.seed}"  # the validation part depends on both
        entry = self.cache.get(self.fabric, split, kind, last_blocks, make)
        return entry["features"], self._targets(entry)

    def train_val(self, kind: str, last_blocks: int) -> tuple[torch.Tensor, ...]:
        """``(x_train, y_train, x_val, y_val)``: the train split's features without and with only
        its validation part (``y``: the :attr:`target`)."""
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
        features of all of them, in the order one process would see, with their :attr:`target`
        (masks cropped and flipped with their images)."""
        self.steps_per_epoch(batch_size)  # checks the batch size
        fabric, world = self.fabric, self.fabric.world_size
        positions = self._labelled("train")["positions"][self.train_idx].tolist()
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
            features = encode(
                fabric, self.encoder, batch.images, kind, last_blocks, batch.frame_times, self.readouts.get(kind)
            )
            features = last_blocks_of(features, kind, last_blocks)
            if self.target == "labels":
                targets = batch.labels
            elif self.target == "masks":
                targets = batch.masks
            else:
                targets = self.count_class(batch.counts)
            yield (
                gather_in_order(features, fabric.all_gather, world),
                gather_in_order(targets, fabric.all_gather, world),
            )

    def warn(self, message: str) -> None:
        """A warning on rank zero (stderr), kept for the results file."""
        if self.fabric.is_global_zero:
            warnings.warn(message, stacklevel=2)

    def log(self, metrics: dict[str, float], step: int = 0) -> None:
        """TensorBoard scalars (rank zero)."""
        self.logged.update(metrics)
        self.fabric.log_dict(metrics, step=step)
