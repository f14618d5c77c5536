"""The labelled images (or clips) an evaluation reads: a data source's labelled train split
(under the evaluation transform, or under the probe's augmentation) and its test split.

The validation split that selects a head is carved from the train split's labels
(:func:`ijepa.evaluation.splits.validation_split`), never from the test split.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from ijepa.data.sources import DataSource, ShapesSource, SplitSettings, check_fraction
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ToNormalizedFloat, eval_transform
from ijepa.nn.checks import check_range

SPLITS = ("train", "test")


class ClipAugment:
    """The probes' augmentation of a clip: one random resized crop and one horizontal flip, drawn
    once per clip and applied to every frame alike (a ``tv_tensors.Video``, which v2 transforms
    as one), so that the motion between frames stays what it was. Normalised float ``[3, T, H, W]``
    in and out (clip sources hand out normalised clips; crop and flip commute with the
    normalisation up to rounding)."""

    def __init__(self, size: int, scale: tuple[float, float]):
        self.size, self.scale = size, tuple(scale)
        self.transform = v2.Compose(
            [v2.RandomResizedCrop(size, scale=self.scale, antialias=True), v2.RandomHorizontalFlip()]
        )

    def __call__(self, clip: torch.Tensor) -> torch.Tensor:
        video = tv_tensors.Video(clip.transpose(0, 1))  # [T, 3, H, W]: one draw for all frames
        return self.transform(video).as_subclass(torch.Tensor).transpose(0, 1).contiguous()

    def __repr__(self) -> str:
        return f"ClipAugment(size={self.size}, scale={self.scale})"


class AugmentedClips(Dataset):
    """``dataset``'s ``(clip, label[, frame_times])`` items with ``transform`` applied to the
    clip: any clip source, whatever dataset (or ``Subset``) its splits are."""

    def __init__(self, dataset: Dataset, transform):
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple:
        clip, *rest = self.dataset[index]
        return (self.transform(clip), *rest)


class EvalData:
    """A labelled data source for ``ijepa eval``.

    Args:
        source: any :class:`~ijepa.data.sources.DataSource` with labels (``class_path``, as in
            ``ijepa fit``): its ``probe_train`` split is the train split here, ``probe_test`` the test
            split. A source of clips (``MovingShapesSource``, ``VideoFolderSource``) needs a clip
            checkpoint (``model.num_frames > 0``), an image source an image checkpoint.
        image_size: side of the evaluated images (or frames); null: the encoder's own. Another
            size than the checkpoint's adapts its encoder as ``ijepa validate --data.image_size``
            does (learned position tables interpolated, sin-cos and RoPE rebuilt).
        patch_size: patch side to evaluate an image checkpoint at; null: the checkpoint's. Another
            resizes the patch kernel (FlexiViT) and the positions to the new grid.
        num_frames: frames per clip (clip sources); null: the clip checkpoint's. Another adapts
            the encoder's positions to the new number of tubelets.
        batch_size: images per batch, across all processes (each of ``world`` processes loads
            ``batch_size / world``).
        num_workers: DataLoader workers per process.
        val_fraction: share of each class of the train split held out to select the head.
        augment_scale: area range of the probes' random resized crop (``augment: true``; clips
            get one crop and flip for all their frames).
        seed: seed of the validation split, the low-shot subsets, the heads' initialisation, the
            order of the batches and every augmentation.
        data_seed: the seed generated sources render their images with (``data.seed`` of ``ijepa fit``).
    """

    def __init__(
        self,
        source: DataSource | None = None,
        image_size: int | None = None,
        patch_size: int | None = None,
        num_frames: int | None = None,
        batch_size: int = 256,
        num_workers: int = 2,
        val_fraction: float = 0.1,
        augment_scale: tuple[float, float] = (0.08, 1.0),
        seed: int = 0,
        data_seed: int = 0,
    ):
        self.source = source if source is not None else ShapesSource()
        self.clips = bool(getattr(self.source, "clips", False))
        for name, value in (("image_size", image_size), ("patch_size", patch_size), ("num_frames", num_frames)):
            if value is not None:
                check_range(value, f"data.{name}", 1)
        if num_frames is not None and not self.clips:
            raise ValueError(
                f"data.num_frames={num_frames} is for clip sources; data.source {type(self.source).__name__} "
                "gives images."
            )
        check_range(batch_size, "data.batch_size", 1)
        check_range(num_workers, "data.num_workers", 0)
        check_fraction(val_fraction, "data.val_fraction")
        low, high = augment_scale
        check_range(low, "data.augment_scale[0]", 0, 1, low_open=True)
        check_range(high, "data.augment_scale[1]", low, 1)
        self.image_size, self.patch_size, self.num_frames = image_size, patch_size, num_frames
        self.batch_size, self.num_workers = batch_size, num_workers
        self.val_fraction, self.augment_scale = val_fraction, (float(low), float(high))
        self.seed, self.data_seed = seed, data_seed
        self.num_classes: int | None = None
        self.frames = num_frames or 0  # frames per clip of the splits (0: images); use_frames sets the encoder's
        self._datasets: dict[tuple[int, bool], tuple[Dataset, Dataset]] = {}  # generated sources render once

    def use_frames(self, num_frames: int) -> None:
        """Give the splits the encoder's ``num_frames`` (0: an image encoder), refusing a source
        of the other kind."""
        name = type(self.source).__name__
        if num_frames and not self.clips:
            raise ValueError(
                f"data.source: {name} gives images, but the checkpoint holds a clip encoder (num_frames={num_frames}): "
                "evaluate it on a clip source (ijepa.data.MovingShapesSource, ijepa.data.VideoFolderSource)."
            )
        if self.clips and not num_frames:
            raise ValueError(
                f"data.source: {name} gives clips, but the checkpoint holds an image encoder: evaluate clips with a "
                "clip checkpoint (model.num_frames > 0), or this checkpoint on an image source."
            )
        if num_frames != self.frames:
            self._datasets.clear()
        self.frames = num_frames

    def eval_transform(self, size: int) -> v2.Transform:
        """Deterministic: resize the short side, centre crop, normalise: the transform of ``ijepa
        fit``'s probes (:func:`ijepa.data.transforms.eval_transform`). Clip sources apply their
        own (frames rendered, or resized and centre-cropped, at ``size``; then normalised)."""
        return eval_transform(size)

    def augment_transform(self, size: int) -> v2.Transform | ClipAugment:
        """The linear and attentive probes' training augmentation: random resized crop and flip
        (of every frame alike for clips, :class:`ClipAugment`)."""
        if self.clips:
            return ClipAugment(size, self.augment_scale)
        return v2.Compose(
            [
                v2.ToImage(),
                v2.RandomResizedCrop(size, scale=self.augment_scale, antialias=True),
                v2.RandomHorizontalFlip(),
                ToNormalizedFloat(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def dataset(self, split: str, size: int, augment: bool = False) -> Dataset:
        """The ``train`` or ``test`` split at ``size`` pixels, under the evaluation transform or
        (train only) the augmentation."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        if (size, augment) not in self._datasets:
            plain = self._datasets.get((size, False))
            if augment and self.clips:
                # the same clips, cropped and flipped afresh at every draw: no second render
                plain = plain or self._splits(size, False)
                self._datasets[(size, False)] = plain
                self._datasets[(size, True)] = (AugmentedClips(plain[0], self.augment_transform(size)), plain[1])
            elif augment and plain is not None and hasattr(plain[0], "transform"):
                # the same images under another transform, as ShapesSource builds its bank: no second render
                train = copy.copy(plain[0])
                train.transform = self.augment_transform(size)
                self._datasets[(size, True)] = (train, plain[1])
            else:
                self._datasets[(size, augment)] = self._splits(size, augment)
        return self._datasets[(size, augment)][SPLITS.index(split)]

    def _splits(self, size: int, augment: bool) -> tuple[Dataset, Dataset]:
        if self.clips and not self.frames:
            raise ValueError(
                f"data.source: {type(self.source).__name__} gives clips and no frame count is set: set "
                "data.num_frames or evaluate a clip checkpoint (EvalData.use_frames)."
            )
        transform = self.augment_transform(size) if augment else self.eval_transform(size)
        settings = SplitSettings(
            image_size=size,
            num_frames=self.frames,
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
        return splits.probe_train, splits.probe_test

    def describe(self, size: int) -> dict:
        """What the features of this data depend on besides the encoder: the results file's
        ``data`` entry and part of the feature cache's key."""
        if self.clips:
            return {
                "source": self.source.config(),
                "image_size": size,
                "num_frames": self.frames,
                "eval_transform": "the source's clips at image_size, ImageNet-normalised (ClipToTensor)",
                "data_seed": self.data_seed,
            }
        return {
            "source": self.source.config(),
            "image_size": size,
            "eval_transform": repr(self.eval_transform(size)),
            "data_seed": self.data_seed,
        }
