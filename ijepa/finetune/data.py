"""The labelled data of ``ijepa finetune``: any source the project reads, a class-balanced label
fraction of its train split, a validation split carved from train, the test split held out.

Splits (all seeded by ``data.seed``, per class, :mod:`ijepa.evaluation.splits`): ``val_fraction``
of each class of the source's labelled train split selects the checkpoint; of the rest,
``label_fraction`` of each class (or ``shots`` images per class) trains, the I-JEPA paper's
low-shot setting; the source's test split is scored once, at the end (``ijepa finetune test``,
or ``trainer.test`` after fit). Training images get MAE's augmentation (random resized crop,
flip, RandAugment, random erasing; torchvision v2) and, in the collate, MixUp / CutMix and label
smoothing (:class:`~ijepa.finetune.mixing.MixCollate`); order and every draw are functions of
``(seed, epoch, index)``, so a run resumed mid-epoch sees what an uninterrupted one sees.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2

from ijepa.data.sampling import EpochSampler, ResumableDataLoader, SeededSamples, mix_seed
from ijepa.data.sources import DataSource, ShapesSource, check_fraction
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ToNormalizedFloat
from ijepa.evaluation.data import EvalData
from ijepa.evaluation.splits import low_shot_indices, validation_split
from ijepa.finetune.mixing import MixCollate, check_labels
from ijepa.nn.checks import check_range


def dataset_labels(dataset: Dataset) -> torch.Tensor:
    """``[N]`` labels of a labelled dataset: its ``targets`` (through ``Subset`` s), else read item by item."""
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets, dtype=torch.long)
    return torch.tensor([int(dataset[i][1]) for i in range(len(dataset))], dtype=torch.long)


class FinetuneImages(EvalData):
    """:class:`~ijepa.evaluation.data.EvalData` whose augmentation is fine-tuning's: random resized
    crop, flip, RandAugment (``randaugment_ops`` operations of ``randaugment_magnitude``; 0 ops:
    off), normalisation, random erasing with probability ``erasing``."""

    def __init__(self, *args, randaugment_ops: int, randaugment_magnitude: int, erasing: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.randaugment_ops, self.randaugment_magnitude, self.erasing = randaugment_ops, randaugment_magnitude, erasing

    def augment_transform(self, size: int) -> v2.Transform:
        steps = [v2.ToImage(), v2.RandomResizedCrop(size, scale=self.augment_scale, antialias=True)]
        steps.append(v2.RandomHorizontalFlip())
        if self.randaugment_ops:
            steps.append(v2.RandAugment(num_ops=self.randaugment_ops, magnitude=self.randaugment_magnitude))
        steps.append(ToNormalizedFloat(IMAGENET_MEAN, IMAGENET_STD))
        if self.erasing:
            steps.append(v2.RandomErasing(p=self.erasing, value=0))
        return v2.Compose(steps)


class FinetuneData(pl.LightningDataModule):
    """Labelled images for fine-tuning.

    Args:
        source: any labelled :class:`~ijepa.data.sources.DataSource` (``class_path``, as in
            ``ijepa fit``); its ``probe_train`` split trains (and gives validation), its
            ``probe_test`` split tests. Images only (no clip sources).
        image_size: side of the images; the encoder is adapted to it (``model.image_size`` follows).
        batch_size: images per batch across all processes.
        num_workers: DataLoader workers per process.
        val_fraction: share of each class of the train split held out for validation (checkpoint selection).
        label_fraction: share of each class of the rest that trains (1.0: all; the paper's 1% and 10%).
        shots: images per class that train, instead of ``label_fraction`` (null: by fraction).
        crop_scale: area range of the random resized crop.
        randaugment_ops, randaugment_magnitude: RandAugment (MAE: 2 ops of magnitude 9; 0 ops: off).
        erasing: random erasing probability (MAE: 0.25).
        mixup_alpha, cutmix_alpha, switch_prob, mix_prob, label_smoothing: :class:`MixCollate`'s.
        seed: seed of the splits, the order and every augmentation.
        data_seed: the seed generated sources render with (``data.seed`` of the pretraining run).
    """

    def __init__(
        self,
        source: DataSource | None = None,
        image_size: int = 48,
        batch_size: int = 128,
        num_workers: int = 1,
        val_fraction: float = 0.1,
        label_fraction: float = 1.0,
        shots: int | None = None,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        randaugment_ops: int = 2,
        randaugment_magnitude: int = 9,
        erasing: float = 0.25,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        switch_prob: float = 0.5,
        mix_prob: float = 1.0,
        label_smoothing: float = 0.1,
        seed: int = 0,
        data_seed: int = 0,
    ):
        super().__init__()
        check_range(image_size, "data.image_size", 1)
        check_range(batch_size, "data.batch_size", 1)
        check_fraction(val_fraction, "data.val_fraction")
        check_range(label_fraction, "data.label_fraction", 0, 1, low_open=True)
        if shots is not None:
            check_range(shots, "data.shots", 1)
        check_range(randaugment_ops, "data.randaugment_ops", 0)
        check_range(randaugment_magnitude, "data.randaugment_magnitude", 0, 30)
        check_range(erasing, "data.erasing", 0, 1)
        self.save_hyperparameters(ignore=["source"])
        self.source = source if source is not None else ShapesSource()
        if getattr(self.source, "clips", False):
            raise ValueError(f"data.source: {type(self.source).__name__} gives clips; ijepa finetune trains on images.")
        self.images = FinetuneImages(
            self.source,
            image_size=image_size,
            batch_size=batch_size,
            num_workers=num_workers,
            val_fraction=val_fraction,
            augment_scale=tuple(crop_scale),
            seed=seed,
            data_seed=data_seed,
            randaugment_ops=randaugment_ops,
            randaugment_magnitude=randaugment_magnitude,
            erasing=erasing,
        )
        self.mixing = dict(
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            switch_prob=switch_prob,
            mix_prob=mix_prob,
            label_smoothing=label_smoothing,
        )
        self.num_classes: int | None = None
        self.indices: dict[str, torch.Tensor] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.indices:
            return
        size = self.hparams.image_size
        plain = self.images.dataset("train", size)  # renders generated sources once
        self.num_classes = self.images.num_classes
        labels = dataset_labels(plain)
        check_labels(labels, self.num_classes)
        train, val = validation_split(labels, self.hparams.val_fraction, self.hparams.seed, name="data.val_fraction")
        if self.hparams.shots is not None:
            train = low_shot_indices(labels, train, shots=self.hparams.shots, seed=self.hparams.seed)
        elif self.hparams.label_fraction < 1:
            train = low_shot_indices(labels, train, fraction=self.hparams.label_fraction, seed=self.hparams.seed)
        if len(train) == 0:
            raise ValueError("data.label_fraction leaves no training image: raise it (or data.shots).")
        self.indices = {"train": train, "val": val}
        self.labels = labels

    def sampling_seed(self) -> int:
        return mix_seed(self.hparams.seed, int(os.environ.get("PL_GLOBAL_SEED", 0)))

    def _progress(self) -> int:
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def train_dataloader(self) -> DataLoader:
        hp, trainer = self.hparams, self.trainer
        train = Subset(self.images.dataset("train", hp.image_size, augment=True), self.indices["train"].tolist())
        if len(train) < hp.batch_size:
            raise ValueError(
                f"data.batch_size={hp.batch_size} is larger than the {len(train)} training images "
                "(label_fraction / shots): lower it."
            )
        seed, world = self.sampling_seed(), trainer.world_size if trainer else 1
        per_process = max(1, hp.batch_size // world)
        sampler = EpochSampler(
            train, per_process, num_replicas=world, rank=trainer.global_rank if trainer else 0, seed=seed
        )
        return ResumableDataLoader(
            SeededSamples(train, seed),
            batch_size=per_process,
            sampler=sampler,
            num_workers=hp.num_workers,
            collate_fn=MixCollate(self.num_classes, **self.mixing),
            drop_last=True,
            persistent_workers=hp.num_workers > 0,
            generator=torch.Generator().manual_seed(seed),
            progress=self._progress if trainer is not None else None,
        )

    def _plain_loader(self, dataset: Dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._plain_loader(
            Subset(self.images.dataset("train", self.hparams.image_size), self.indices["val"].tolist())
        )

    def test_dataloader(self) -> DataLoader:
        return self._plain_loader(self.images.dataset("test", self.hparams.image_size))

    # What chooses the images a run trains, validates and tests on: a resume must not change them.
    IDENTITY = ("label_fraction", "shots", "val_fraction", "seed", "data_seed")

    def identity(self) -> dict:
        return {"source": self.source.config(), **{key: self.hparams[key] for key in self.IDENTITY}}

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the data's identity, which a resume checks."""
        return {"identity": self.identity()}

    def load_state_dict(self, state_dict: dict) -> None:
        """On ``--ckpt_path``: refuse data other than the checkpoint's (another label subset,
        split or source would silently train on other images under the same run)."""
        saved, now = state_dict.get("identity") or {}, self.identity()
        changed = [key for key in now if key in saved and saved[key] != now[key]]
        if changed:
            listed = "; ".join(f"data.{key}={now[key]!r} where the checkpoint has {saved[key]!r}" for key in changed)
            raise ValueError(
                f"resuming with other data than the checkpoint's: {listed}. Resume with the checkpoint's values, or "
                "start a new run (without --ckpt_path)."
            )

    def describe(self) -> dict:
        """What a results file records about the data."""
        return {
            "source": self.source.config(),
            "image_size": self.hparams.image_size,
            "train_images": len(self.indices["train"]),
            "val_images": len(self.indices["val"]),
            "label_fraction": self.hparams.label_fraction,
            "shots": self.hparams.shots,
            "num_classes": self.num_classes,
            "seed": self.hparams.seed,
        }
