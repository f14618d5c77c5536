"""The labelled images an evaluation reads: a data source's labelled train split (under the
evaluation transform, or under the probe's augmentation) and its test split.

The validation split that selects a head is carved from the train split's labels
(:func:`ijepa.evaluation.splits.validation_split`), never from the test split.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from ijepa.data.batch import LabeledBatch
from ijepa.data.sources import DataSource, ShapesSource, SplitSettings, check_fraction
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from ijepa.nn.checks import check_range

SPLITS = ("train", "test")


def _normalise() -> list[v2.Transform]:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]


def image_label_collate(samples: list) -> LabeledBatch:
    """``(image, label, ...)`` samples -> a :class:`~ijepa.data.batch.LabeledBatch`, ``images
    [B, 3, H, W]`` and ``labels [B]`` (anything after the label, such as
    :class:`~ijepa.data.sampling.SeededSamples`' seed, is dropped)."""
    return LabeledBatch(
        torch.stack([sample[0] for sample in samples]),
        torch.as_tensor([int(sample[1]) for sample in samples], dtype=torch.long),
    )


class EvalData:
    """A labelled data source for ``ijepa eval``.

    Args:
        source: any image :class:`~ijepa.data.sources.DataSource` with labels (``class_path``, as in
            ``ijepa fit``): its ``knn_train`` split is the train split here, ``knn_test`` the test split.
        image_size: side of the evaluated images; null: the encoder's own.
        batch_size: images per batch, across all processes (each of ``world`` processes loads
            ``batch_size / world``).
        num_workers: DataLoader workers per process.
        val_fraction: share of each class of the train split held out to select the head.
        augment_scale: area range of the probes' random resized crop (``augment: true``).
        seed: seed of the validation split, the low-shot subsets, the heads' initialisation, the
            order of the batches and every augmentation.
        data_seed: the seed generated sources render their images with (``data.seed`` of ``ijepa fit``).
    """

    def __init__(
        self,
        source: DataSource | None = None,
        image_size: int | None = None,
        batch_size: int = 256,
        num_workers: int = 2,
        val_fraction: float = 0.1,
        augment_scale: tuple[float, float] = (0.08, 1.0),
        seed: int = 0,
        data_seed: int = 0,
    ):
        self.source = source if source is not None else ShapesSource()
        if getattr(self.source, "clips", False):
            raise ValueError(f"data.source: {type(self.source).__name__} gives clips; ijepa eval evaluates images.")
        if image_size is not None:
            check_range(image_size, "data.image_size", 1)
        check_range(batch_size, "data.batch_size", 1)
        check_range(num_workers, "data.num_workers", 0)
        check_fraction(val_fraction, "data.val_fraction")
        low, high = augment_scale
        check_range(low, "data.augment_scale[0]", 0, 1, low_open=True)
        check_range(high, "data.augment_scale[1]", low, 1)
        self.image_size, self.batch_size, self.num_workers = image_size, batch_size, num_workers
        self.val_fraction, self.augment_scale = val_fraction, (float(low), float(high))
        self.seed, self.data_seed = seed, data_seed
        self.num_classes: int | None = None
        self._datasets: dict[tuple[int, bool], tuple[Dataset, Dataset]] = {}  # generated sources render once

    def eval_transform(self, size: int) -> v2.Transform:
        """Deterministic: resize the short side, centre crop, normalise (the transform of ``ijepa fit``'s probes)."""
        return v2.Compose([v2.ToImage(), v2.Resize(size, antialias=True), v2.CenterCrop(size), *_normalise()])

    def augment_transform(self, size: int) -> v2.Transform:
        """The linear and attentive probes' training augmentation: random resized crop and flip."""
        return v2.Compose(
            [
                v2.ToImage(),
                v2.RandomResizedCrop(size, scale=self.augment_scale, antialias=True),
                v2.RandomHorizontalFlip(),
                *_normalise(),
            ]
        )

    def dataset(self, split: str, size: int, augment: bool = False) -> Dataset:
        """The ``train`` or ``test`` split at ``size`` pixels, under the evaluation transform or
        (train only) the augmentation."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        if (size, augment) not in self._datasets:
            plain = self._datasets.get((size, False))
            if augment and plain is not None and hasattr(plain[0], "transform"):
                # the same images under another transform, as ShapesSource builds its bank: no second render
                train = copy.copy(plain[0])
                train.transform = self.augment_transform(size)
                self._datasets[(size, True)] = (train, plain[1])
            else:
                self._datasets[(size, augment)] = self._splits(size, augment)
        return self._datasets[(size, augment)][SPLITS.index(split)]

    def _splits(self, size: int, augment: bool) -> tuple[Dataset, Dataset]:
        transform = self.augment_transform(size) if augment else self.eval_transform(size)
        settings = SplitSettings(
            image_size=size,
            num_frames=0,
            seed=self.data_seed,
            train_transform=transform,
            eval_transform=transform,
            crop_scale=None,
            option="data.source",
        )
        splits = self.source.splits(settings)
        if splits.num_classes < 2:
            raise ValueError(
                f"data.source: {self.source!r} has no labels (num_classes={splits.num_classes}); evaluation needs "
                "labelled images, e.g. an ImageFolderSource with one sub-folder per class."
            )
        self.num_classes = splits.num_classes
        return splits.knn_train, splits.knn_test

    def describe(self, size: int) -> dict:
        """What the features of this data depend on besides the encoder: the results file's
        ``data`` entry and part of the feature cache's key."""
        return {
            "source": self.source.config(),
            "image_size": size,
            "eval_transform": repr(self.eval_transform(size)),
            "data_seed": self.data_seed,
        }
