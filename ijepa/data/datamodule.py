"""The IJEPADataModule: a data source and a mask kind (each chosen by ``class_path``) plus what
every source shares: image size, batches, workers, augmentation."""

from __future__ import annotations

import math
import os

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ijepa.data.collate import MaskCollator, labeled_collate
from ijepa.data.native import NativeSizeCrop, PackedMaskCollator
from ijepa.data.sampling import (
    EpochSampler,
    ResumableDataLoader,
    SeededSamples,
    mix_seed,
)
from ijepa.data.sources import DataSource, SplitSettings, STL10Source
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ResizeCentreCrop, ToNormalizedFloat, eval_transform
from ijepa.masks import Masks, MultiBlockMasks, SpatioTemporalMasks, masks_from_config
from ijepa.nn.checks import check_range
from ijepa.nn.patch import grid_size


class IJEPADataModule(L.LightningDataModule):
    """Images (or clips) for I-JEPA pretraining plus the labelled splits the probes need.

    Where the data comes from is the ``source`` (:mod:`ijepa.data.sources`, chosen in YAML by
    ``class_path``): ``STL10Source``, ``ImageFolderSource``, ``ShapesSource``,
    ``MovingShapesSource`` or ``VideoFolderSource``, each with its own options. Clip sources
    need ``num_frames > 0`` (linked from ``model.num_frames`` by the CLI): batches then hold clips
    ``[B, 3, T, H, W]`` under ``images``.

    Which patches are context and which targets is the ``masks`` kind (:mod:`ijepa.masks`, chosen
    in YAML by ``class_path``): ``MultiBlockMasks`` (I-JEPA), ``SpatioTemporalMasks`` (clips),
    ``RandomMasks`` (MAE-style), each with its own options; the DataModule builds its samplers
    for every grid it needs (the patch grid, each FlexiViT patch size's, a clip's token grid,
    each native-resolution image's).

    ``probe_source`` (any source, optional): a labelled source whose ``probe_train`` /
    ``probe_test`` splits replace the source's for the probes and set ``num_classes``, e.g. a
    labelled folder while an unlabelled ``source`` is pretrained on.

    ``num_classes`` is set by ``setup``; below 2 the data is unlabelled and the probes skip.
    ``setup("fit")`` checks that ``batch_size`` fits in each device's share of ``pretrain``
    (its loader drops the last incomplete batch, so a larger batch would train nothing).

    Loaders: ``train_dataloader`` / ``val_dataloader`` / ``test_dataloader`` yield masked batches
    (:class:`~ijepa.data.batch.GridBatch` or ``ClipBatch`` from :class:`ijepa.data.collate.MaskCollator`,
    :class:`~ijepa.data.batch.PackedBatch` with ``native_sides``); ``probe_train_dataloader`` /
    ``probe_test_dataloader`` / ``predict_dataloader`` yield :class:`~ijepa.data.batch.LabeledBatch`
    (images, labels) with the evaluation transform.
    ``patch_size`` is linked from the model by the CLI, so the mask grid and the model's patch
    grid cannot disagree.

    Args:
        source: where the data comes from (default: STL-10 under ``data/``).
        probe_source: a labelled source for the probes only; null: the probes use ``source``'s splits.
        image_size: side of the (square) training and evaluation images in pixels.
        patch_size: patch side (linked from ``model.patch_size`` by the CLI).
        batch_size: pretraining batch size per device.
        num_workers: DataLoader worker processes (masks are sampled there).
        pin_memory: pin host memory when a GPU is used.
        crop_scale: RandomResizedCrop area range, or null for no crop (resize only).
        horizontal_flip: random horizontal flips in pretraining (with or without ``crop_scale``).
        masks: the mask kind and its options (``{class_path, init_args}`` in YAML); null:
            ``MultiBlockMasks()`` for images, ``SpatioTemporalMasks()`` for clips.
        probe_batch_size: batch size of the probes' feature extraction.
        seed: seed of the generated data and, mixed with the run's seed, of order, augmentations
            and masks.
        num_frames: frames per clip (clip sources; linked to ``model.num_frames`` by the CLI);
            0 for images.
        tubelet_size: frames per tubelet (linked from ``model.tubelet_size`` by the CLI).
        train_patch_sizes: FlexiViT training: each pretraining batch draws its patch size from
            this list (each must divide ``image_size``) and samples its masks on that grid; the
            model resizes its kernel and position encoding to match (``docs/native_resolution.md``).
            Validation and the probes keep ``patch_size``. null: every batch uses ``patch_size``.
        native_sides: native-resolution (NaViT) pretraining: each pretraining image is cropped to
            ``h x w`` patches, ``h`` and ``w`` drawn from this (min, max) range (at most
            ``image_size / patch_size``), so sizes and aspect ratios mix; masks are sampled per
            image on its own grid and the tokens of several images are packed into sequences
            (``docs/native_resolution.md``). Validation packs the full-size evaluation images the
            same way. null: every image is ``image_size`` square.
        token_budget: slots per packed sequence (native_sides); null: one full-size image's tokens.
        token_drop: NaViT's random token drop: the share of each image's context tokens dropped
            in pretraining (native_sides), a training-speed lever.
    """

    def __init__(
        self,
        source: DataSource | None = None,
        probe_source: DataSource | None = None,
        image_size: int = 96,
        patch_size: int = 8,
        batch_size: int = 128,
        num_workers: int = 4,
        pin_memory: bool = True,
        crop_scale: tuple[float, float] | None = (0.3, 1.0),
        horizontal_flip: bool = False,
        masks: Masks | None = None,
        probe_batch_size: int = 256,
        seed: int = 0,
        num_frames: int = 0,
        tubelet_size: int = 2,
        train_patch_sizes: list[int] | None = None,
        native_sides: tuple[int, int] | None = None,
        token_budget: int | None = None,
        token_drop: float = 0.0,
    ):
        super().__init__()
        source = STL10Source() if source is None else source
        # Every numeric option is checked here, before any data is read; the image and patch
        # size by grid_size, the mask options by the mask kind and its samplers, the
        # native-resolution options by PackedMaskCollator, below. data.seed takes any int.
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("probe_batch_size", probe_batch_size, 1),
            ("num_workers", num_workers, 0),
            ("num_frames", num_frames, 0),
            ("tubelet_size", tubelet_size, 1),
        ):
            check_range(value, name, low)
        if crop_scale is not None and (len(crop_scale) != 2 or not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0):
            raise ValueError(f"crop_scale must be (min, max) with 0 < min <= max <= 1, or null; got {crop_scale}.")
        for name, value in (("source", source), ("probe_source", probe_source)):
            if value is not None and not isinstance(value, DataSource):
                raise TypeError(f"data.{name} must be a DataSource (ijepa.data.sources), got {type(value).__name__}.")
            if value is not None and value.clips != (num_frames > 0):
                raise ValueError(
                    f"num_frames must be > 0 exactly for sources of clips: data.{name} is {type(value).__name__} "
                    f"({'clips' if value.clips else 'images'}), got num_frames={num_frames}."
                )
        if masks is None:
            masks = SpatioTemporalMasks() if num_frames > 0 else MultiBlockMasks()
        elif isinstance(masks, dict):  # a checkpoint's plain values (Masks.config)
            masks = masks_from_config(masks)
        if not isinstance(masks, Masks):
            raise TypeError(f"data.masks must be a mask kind (ijepa.masks), got {type(masks).__name__}.")
        if masks.clips is not None and masks.clips != (num_frames > 0):
            raise ValueError(
                f"data.masks is {type(masks).__name__}, for {'clips' if masks.clips else 'images'}, but num_frames="
                f"{num_frames}: images take e.g. ijepa.masks.MultiBlockMasks, clips ijepa.masks.SpatioTemporalMasks."
            )
        self.source = source
        self.probe_source = probe_source
        self.masks = masks
        # Checkpoints keep plain values (they load under weights_only=True): the sources' and
        # the masks' class paths and options, not the objects.
        self.save_hyperparameters(ignore=["source", "probe_source", "masks"])
        self.hparams["source"] = source.config()
        self.hparams["probe_source"] = probe_source.config() if probe_source is not None else None
        self.hparams["masks"] = masks.config()
        self.grid_size = grid_size(image_size, patch_size)
        if num_frames:
            if tubelet_size < 1 or num_frames % tubelet_size:
                raise ValueError(f"num_frames={num_frames} must be a positive multiple of tubelet_size={tubelet_size}.")
            self.mask_sampler = masks.sampler((num_frames // tubelet_size, self.grid_size, self.grid_size))
        else:
            self.mask_sampler = self.image_sampler(self.grid_size)
        self.patch_samplers = None
        if train_patch_sizes is not None:
            if num_frames or not train_patch_sizes:
                raise ValueError(
                    f"train_patch_sizes must be a non-empty list of patch sizes, for images (num_frames=0); got "
                    f"{train_patch_sizes} with num_frames={num_frames}."
                )
            self.patch_samplers = {}
            for size in sorted(set(train_patch_sizes)):
                try:
                    side = grid_size(image_size, size)
                except ValueError as error:
                    raise ValueError(f"train_patch_sizes: {error}") from None
                if side < 2:  # the sampler would say "grid_size", an option nobody set
                    raise ValueError(
                        f"train_patch_sizes: patch size {size} cuts image_size={image_size} into a {side} x {side} "
                        f"grid; each patch size needs at least 2 x 2 patches (at most {image_size // 2} here)."
                    )
                self.patch_samplers[size] = self.image_sampler(side)
        self.native_collators = None
        if native_sides is not None:
            if num_frames or train_patch_sizes is not None or masks.masks_per_image != 1:
                raise ValueError(
                    "native_sides is for images at one patch size with one mask set each: not with num_frames, "
                    "train_patch_sizes or masks_per_image > 1 (data.masks)."
                )
            side = self.grid_size
            if len(native_sides) != 2 or not 2 <= native_sides[0] <= native_sides[1] <= side:
                raise ValueError(
                    f"native_sides must be (min, max) patches per side with 2 <= min <= max <= {side} "
                    f"(image_size / patch_size), got {native_sides}."
                )
            budget = side * side if token_budget is None else token_budget
            if budget < side * side:
                raise ValueError(
                    f"token_budget must hold one full-size image's {side * side} tokens (validation packs "
                    f"image_size images), got {token_budget}."
                )
            self.native_collators = {
                "train": PackedMaskCollator(patch_size, (side, side), budget, token_drop, masks=masks),
                "val": PackedMaskCollator(patch_size, (side, side), budget, 0.0, masks=masks),
            }
            self.native_collators["train"].check(tuple(native_sides))  # fail fast on impossible masks
        elif token_budget is not None or token_drop:
            raise ValueError("token_budget and token_drop act on native-resolution batches: set native_sides too.")
        self.num_classes = 10
        self._splits: dict[str, Dataset] = {}

    def image_sampler(self, grid_size: int, context_policy: str | None = None):
        """The image mask sampler of ``data.masks`` on a ``grid_size`` square grid (with another
        ``context_policy`` if given)."""
        return self.masks.sampler(grid_size, context_policy)

    # --- transforms ---------------------------------------------------------------------------
    def train_transform(self) -> v2.Transform:
        """Pretraining augmentation: random resized crop (I-JEPA's only one) and optional flip."""
        hp = self.hparams
        if hp.native_sides is not None:
            scale = tuple(hp.crop_scale) if hp.crop_scale is not None else (1.0, 1.0)
            steps = [v2.ToImage(), NativeSizeCrop(hp.patch_size, tuple(hp.native_sides), scale)]
        elif hp.crop_scale is None:
            steps = [v2.ToImage(), *self._resize_centre_crop()]
        else:
            steps = [v2.ToImage(), v2.RandomResizedCrop(hp.image_size, scale=tuple(hp.crop_scale), antialias=True)]
        if hp.horizontal_flip:  # independent of the crop: without one, the flip still applies
            steps.append(v2.RandomHorizontalFlip())
        return v2.Compose(steps + self._to_float())

    def eval_transform(self) -> v2.Transform:
        """Deterministic resize + centre crop to ``image_size``, then normalise
        (:func:`ijepa.data.transforms.eval_transform`, which ``ijepa eval`` uses too)."""
        return eval_transform(self.hparams.image_size)

    def _resize_centre_crop(self) -> list:
        return [ResizeCentreCrop(self.hparams.image_size)]

    @staticmethod
    def _to_float() -> list:
        return [ToNormalizedFloat(IMAGENET_MEAN, IMAGENET_STD)]

    # --- datasets -----------------------------------------------------------------------------
    def split_settings(self, option: str = "data.source") -> SplitSettings:
        """What the sources are told when asked for splits."""
        hp = self.hparams
        return SplitSettings(
            image_size=hp.image_size,
            num_frames=hp.num_frames,
            seed=hp.seed,
            train_transform=self.train_transform(),
            eval_transform=self.eval_transform(),
            crop_scale=tuple(hp.crop_scale) if hp.crop_scale is not None else None,
            option=option,
        )

    def prepare_data(self) -> None:
        self.source.prepare()
        if self.probe_source is not None:
            self.probe_source.prepare()

    def setup(self, stage: str | None = None) -> None:
        if not self._splits:
            self.mask_sampler.check()
            for sampler in (self.patch_samplers or {}).values():
                sampler.check()
            splits = self.source.splits(self.split_settings())
            self._splits, self.num_classes = splits.as_dict(), splits.num_classes
            if self.probe_source is not None:
                self._probe_splits()
        if stage == "fit":
            self._check_batch_size()

    def _probe_splits(self) -> None:
        # The probes' splits (and classes) from data.probe_source; the source's splits stay.
        self.source.check_probe_source(self.probe_source)
        probe = self.probe_source.splits(self.split_settings("data.probe_source"))
        if probe.num_classes < 2:
            kind = "clips" if self.hparams.num_frames else "images"
            raise ValueError(
                f"data.probe_source={self.probe_source!r} must hold labelled {kind} for the probes: at least two "
                f"classes, got {probe.num_classes}."
            )
        self._splits.update(probe_train=probe.probe_train, probe_test=probe.probe_test)
        self.num_classes = probe.num_classes

    def _check_batch_size(self) -> None:
        # The training loader drops the last incomplete batch (uniform mask shapes), so a batch
        # larger than a device's share of the data would silently train nothing.
        world = self.trainer.world_size if self.trainer is not None else 1
        size = len(self.split("pretrain"))
        per_device = math.ceil(size / world)  # EpochSampler pads the shares to equal length
        if self.hparams.batch_size > per_device:
            raise ValueError(
                f"data.batch_size={self.hparams.batch_size} is larger than the {per_device} training "
                f"{'clips' if self.hparams.num_frames else 'images'} per device ({size} in the pretrain split over "
                f"{world} device(s)), so no batch would be trained: use data.batch_size in 1..{per_device}, or more data."
            )

    def split(self, name: str) -> Dataset:
        """One of the datasets ``pretrain``, ``val``, ``probe_train``, ``probe_test``."""
        if not self._splits:
            self.setup()
        return self._splits[name]

    # --- loaders ------------------------------------------------------------------------------
    def _loader(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool,
        collate_fn,
        drop_last: bool = False,
        persistent: bool = True,
    ) -> DataLoader:
        workers = self.hparams.num_workers
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=workers,
            collate_fn=collate_fn,
            pin_memory=self.hparams.pin_memory and torch.cuda.is_available(),
            drop_last=drop_last,
            persistent_workers=persistent and workers > 0,
            generator=torch.Generator().manual_seed(self.hparams.seed),
        )

    def sampling_seed(self) -> int:
        """Base seed of the order, augmentations and masks: ``data.seed`` mixed with the run's
        ``seed_everything`` (the same on every DDP rank)."""
        return mix_seed(self.hparams.seed, int(os.environ.get("PL_GLOBAL_SEED", 0)))

    def _progress(self) -> int:
        # Batches of the current epoch trained so far, what a checkpoint written now has seen.
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def train_dataloader(self) -> DataLoader:
        """Masked pretraining batches; order, augmentation and masks are functions of
        ``(sampling_seed, epoch, index)`` (:mod:`ijepa.data.sampling`), resumable mid-epoch."""
        hp, trainer = self.hparams, self.trainer
        seed = self.sampling_seed()
        sampler = EpochSampler(
            self.split("pretrain"),
            hp.batch_size,
            num_replicas=trainer.world_size if trainer else 1,
            rank=trainer.global_rank if trainer else 0,
            seed=seed,
            shuffle=True,
        )
        workers = hp.num_workers
        return ResumableDataLoader(
            SeededSamples(self.split("pretrain"), seed),
            batch_size=hp.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=self.native_collators["train"]
            if self.native_collators
            else MaskCollator(self.mask_sampler, self.masks.masks_per_image, self.patch_samplers),
            pin_memory=hp.pin_memory and torch.cuda.is_available(),
            drop_last=True,
            persistent_workers=workers > 0,
            # its own generator: creating an iterator draws a worker base seed, which must not
            # consume the global RNG that stochastic depth uses (a resumed run would drift)
            generator=torch.Generator().manual_seed(seed),
            progress=self._progress if trainer is not None else None,
        )

    def val_dataloader(self) -> DataLoader:
        """Masked held-out batches; the masks are the same at every validation."""
        dataset = SeededSamples(self.split("val"), self.sampling_seed())
        collate = self.native_collators["val"] if self.native_collators else MaskCollator(self.mask_sampler)
        return self._loader(dataset, self.hparams.batch_size, False, collate)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return self.probe_test_dataloader()

    def probe_train_dataloader(self) -> DataLoader:
        """Labelled bank for the k-NN probe, evaluation transform, :class:`~ijepa.data.batch.LabeledBatch`."""
        return self._loader(
            self.split("probe_train"), self.hparams.probe_batch_size, False, labeled_collate, persistent=False
        )

    def probe_test_dataloader(self) -> DataLoader:
        """Held-out labelled queries for the k-NN probe."""
        return self._loader(
            self.split("probe_test"), self.hparams.probe_batch_size, False, labeled_collate, persistent=False
        )
