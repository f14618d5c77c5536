"""The IJEPADataModule: STL-10, image or video folders, or generated shapes and clips, with I-JEPA masks."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2

from ijepa.data.collate import MaskCollator, collate_samples
from ijepa.data.imagefolder import BAD_IMAGE_POLICIES, RobustImageFolder
from ijepa.data.moving_shapes import MovingShapesClips
from ijepa.data.sampling import (
    EpochSampler,
    ResumableDataLoader,
    SeededSamples,
    mix_seed,
)
from ijepa.data.shapes import ShapesDataset
from ijepa.data.stl10 import STL10
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ClipToTensor
from ijepa.data.video_folder import VideoFolderClips
from ijepa.masks import MultiBlockMaskSampler, SpatioTemporalMaskSampler
from ijepa.nn.patch import grid_size

DATASETS = ("stl10", "imagefolder", "shapes", "moving_shapes", "videofolder")
CLIP_DATASETS = ("moving_shapes", "videofolder")


def labeled_collate(samples: list) -> dict[str, torch.Tensor]:
    """Stack ``(image, label)`` samples into ``{"images": [B, C, H, W], "labels": [B]}``; clips
    with times give ``images [B, C, T, H, W]`` and ``frame_times [B, T]``."""
    return collate_samples(samples)


def holdout_split(labels: list[int], fraction: float) -> tuple[list[int], list[int]]:
    """Deterministic class-balanced split of dataset positions into ``(kept, held_out)``: the
    ``r``-th image of a class is held out when ``floor((r + 1) * fraction) > floor(r * fraction)``."""
    rank: dict[int, int] = {}
    kept, held_out = [], []
    for i, label in enumerate(labels):
        r = rank.get(label, 0)
        rank[label] = r + 1
        (held_out if int((r + 1) * fraction) > int(r * fraction) else kept).append(i)
    return kept, held_out


class IJEPADataModule(L.LightningDataModule):
    """Images for I-JEPA pretraining plus the labelled splits the probes need.

    Datasets (``dataset``):

    * ``stl10``: pretrain on ``train+unlabeled`` (105k images); k-NN bank ``train``, queries
      ``test``. Expects ``root/stl10_binary``; ``download=true`` fetches it (2.6 GB).
    * ``imagefolder``: ``root`` with class subfolders. If ``root/train`` and ``root/val`` (or
      ``root/test``) exist they are the two splits, both numbered by the training split's classes
      (a val class missing from ``train/`` is an error naming it); otherwise (``root`` or
      ``root/train`` alone) a deterministic, class-balanced ``holdout_fraction`` of the images is
      held out for probing and not pretrained on. Unreadable files raise an error naming them, or
      with ``bad_images="skip"`` are skipped with a warning. Every PIL image mode is read as
      8-bit RGB (16-bit rescaled, alpha composited over white: :func:`ijepa.data.imagefolder.to_rgb`).

      Unlabelled folders: images directly in the folder (no class subfolders, ``num_classes``
      0, labels -1) or a single class subfolder (``num_classes`` 1) have nothing to probe, so
      nothing is held out: every image is pretrained on. Without a ``val/`` folder, ``val/loss``
      (and the collapse monitor) then reuse a deterministic, evenly spread ``holdout_fraction``
      of the training images under the evaluation transform: a training loss without
      augmentation, not a held-out one. The probes skip with a warning, unless ``probe_root``
      names a labelled folder for them.
    * ``shapes``: generated labelled shapes (:mod:`ijepa.data.shapes`), fully offline.
    * ``moving_shapes``: generated labelled clips whose class is the direction of motion
      (:mod:`ijepa.data.moving_shapes`); batches hold clips ``[B, 3, T, H, W]`` under
      ``images`` and spatio-temporal masks. Needs ``num_frames > 0``.
    * ``videofolder``: ``root`` with class subfolders of video files, split like ``imagefolder``
      (:mod:`ijepa.data.video_folder`, decoded by PyAV: ``pip install av``). Clips
      are sampled at ``clip_fps`` frames per second, or every ``frame_stride``-th frame; training
      clips start at random with a random resized crop shared by their frames, evaluation clips
      are centred. Batches carry ``frame_times [B, T]`` (seconds). Needs ``num_frames > 0``.
      Loose videos (no class subfolders) are unlabelled, as for ``imagefolder``.

    ``probe_root`` (any dataset): a labelled folder, laid out as an ``imagefolder`` (a
    ``videofolder`` for the clip datasets), whose splits replace ``knn_train`` / ``knn_test``
    and set ``num_classes``: the probes score it while ``root`` is pretrained on (e.g. an
    unlabelled ``root``).

    ``num_classes`` is set by ``setup``; below 2 the data is unlabelled and the probes skip.
    ``setup("fit")`` checks that ``batch_size`` fits in each device's share of ``pretrain``
    (its loader drops the last incomplete batch, so a larger batch would train nothing).

    Loaders: ``train_dataloader`` / ``val_dataloader`` / ``test_dataloader`` yield masked batches
    (see :class:`ijepa.data.collate.MaskCollator`); ``knn_train_dataloader`` / ``knn_test_dataloader`` /
    ``predict_dataloader`` yield ``{"images", "labels"}`` with the evaluation transform.
    ``patch_size`` is linked from the model by the CLI, so the mask grid and the model's patch
    grid cannot disagree.

    Args:
        dataset: stl10, imagefolder, shapes, moving_shapes or videofolder.
        root: dataset folder (stl10: the folder holding ``stl10_binary/``).
        download: fetch STL-10 into ``root`` if it is missing.
        image_size: side of the (square) training and evaluation images in pixels.
        patch_size: patch side (linked from ``model.patch_size`` by the CLI).
        batch_size: pretraining batch size per device.
        num_workers: DataLoader worker processes (masks are sampled there).
        pin_memory: pin host memory when a GPU is used.
        crop_scale: RandomResizedCrop area range, or null for no crop (resize only).
        horizontal_flip: random horizontal flips in pretraining (with or without ``crop_scale``).
        num_target_blocks: target blocks per image (I-JEPA: 4).
        target_scale: area range of a target block, as a fraction of the image.
        target_aspect_ratio: height/width range of a target block.
        context_scale: area range of the context block.
        min_keep: fewest context patches left after removing the targets.
        context_policy: how a batch holds contexts of different lengths: ``thin`` (official I-JEPA:
            every context cut at random to the batch's shortest) or ``pad`` (each image keeps its
            whole context, padded to the batch's longest, with ``context_mask`` in the batch).
        masks_per_image: mask sets sampled per pretraining image; the model predicts each from its
            own context against one target-encoder pass (data2vec 2.0's multi-mask). Validation
            batches keep one, so ``val/loss`` does not depend on it.
        knn_batch_size: batch size of the probes' feature extraction.
        holdout_fraction: share of each class held out for probing when a folder has no val split
            (unlabelled folders: the share of the training images that val/loss reuses).
        probe_root: labelled folder for the probes only (class subfolders, with train/ and val/
            or a held-out share); null: the probes use ``root``'s splits.
        shapes_train_size: generated training images (shapes).
        shapes_val_size: generated held-out images (shapes).
        shapes_background: plain, noisy or busy (shapes).
        shapes_num_objects: range of instances of the image's class per image (shapes).
        shapes_radius: range of an object's radius as a fraction of the image side (shapes).
        seed: seed of the generated data and, mixed with the run's seed, of order, augmentations
            and masks.
        bad_images: what to do with unreadable files of an image folder: error or skip.
        num_frames: frames per clip (moving_shapes; linked to ``model.num_frames`` by the CLI);
            0 for images.
        tubelet_size: frames per tubelet (linked from ``model.tubelet_size`` by the CLI).
        temporal_scale: range of the share of the frames a target block spans (clips).
        clip_directions: 4 or 8 motion classes (moving_shapes).
        clip_speed: range of the motion speed in pixels per frame (moving_shapes).
        clip_background: ``texture`` (the whole scene pans) or ``plain`` (moving_shapes).
        clip_num_objects: instances of the clip's shape, all moving together (moving_shapes).
        clip_label: what a clip's class is: ``direction`` of motion or ``shape`` (moving_shapes).
        clip_fps: frames per second of the clips: moving_shapes' nominal rate (null: no
            timestamps, M-RoPE uses frame indices); videofolder's sampling rate (null: use
            ``frame_stride``). With a rate, batches carry ``frame_times [B, T]`` in seconds.
        frame_stride: videofolder without ``clip_fps``: take every n-th decoded frame.
    """

    def __init__(
        self,
        dataset: str = "stl10",
        root: str = "data",
        download: bool = False,
        image_size: int = 96,
        patch_size: int = 8,
        batch_size: int = 128,
        num_workers: int = 4,
        pin_memory: bool = True,
        crop_scale: tuple[float, float] | None = (0.3, 1.0),
        horizontal_flip: bool = False,
        num_target_blocks: int = 4,
        target_scale: tuple[float, float] = (0.15, 0.2),
        target_aspect_ratio: tuple[float, float] = (0.75, 1.5),
        context_scale: tuple[float, float] = (0.85, 1.0),
        min_keep: int = 4,
        context_policy: str = "thin",
        masks_per_image: int = 1,
        knn_batch_size: int = 256,
        holdout_fraction: float = 0.2,
        probe_root: str | None = None,
        shapes_train_size: int = 10_000,
        shapes_val_size: int = 2_000,
        shapes_background: str = "plain",
        shapes_num_objects: tuple[int, int] = (1, 1),
        shapes_radius: tuple[float, float] = (0.2, 0.42),
        seed: int = 0,
        bad_images: str = "error",
        num_frames: int = 0,
        tubelet_size: int = 2,
        temporal_scale: tuple[float, float] = (1.0, 1.0),
        clip_directions: int = 4,
        clip_speed: tuple[float, float] = (1.0, 2.0),
        clip_background: str = "texture",
        clip_num_objects: int = 1,
        clip_label: str = "direction",
        clip_fps: float | None = None,
        frame_stride: int = 1,
    ):
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}.")
        for name, value in (("batch_size", batch_size), ("knn_batch_size", knn_batch_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")
        if masks_per_image < 1:
            raise ValueError(f"masks_per_image must be >= 1, got {masks_per_image}.")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}.")
        if bad_images not in BAD_IMAGE_POLICIES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGE_POLICIES}, got {bad_images!r}.")
        if not 0.0 < holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in (0, 1), got {holdout_fraction}.")
        if crop_scale is not None and not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
            raise ValueError(f"crop_scale must be (min, max) with 0 < min <= max <= 1, or null; got {crop_scale}.")
        self.save_hyperparameters()
        if (dataset in CLIP_DATASETS) != (num_frames > 0):
            raise ValueError(
                f"num_frames must be > 0 exactly for the clip datasets {CLIP_DATASETS}, got num_frames={num_frames} "
                f"with dataset={dataset!r}."
            )
        if clip_fps is not None and not clip_fps > 0:
            raise ValueError(f"clip_fps must be > 0 frames per second, or null; got {clip_fps}.")
        if frame_stride < 1:
            raise ValueError(f"frame_stride must be >= 1, got {frame_stride}.")
        self.grid_size = grid_size(image_size, patch_size)
        if num_frames:
            if tubelet_size < 1 or num_frames % tubelet_size:
                raise ValueError(f"num_frames={num_frames} must be a positive multiple of tubelet_size={tubelet_size}.")
            self.mask_sampler = SpatioTemporalMaskSampler(
                num_frames // tubelet_size,
                self.grid_size,
                num_target_blocks,
                target_scale,
                target_aspect_ratio,
                temporal_scale,
                min_keep=min_keep,
                context_policy=context_policy,
            )
        else:
            self.mask_sampler = MultiBlockMaskSampler(
                self.grid_size,
                num_target_blocks,
                target_scale,
                target_aspect_ratio,
                context_scale,
                min_keep=min_keep,
                context_policy=context_policy,
            )
        self.num_classes = 10
        self._splits: dict[str, Dataset] = {}

    # --- transforms ---------------------------------------------------------------------------
    def train_transform(self) -> v2.Transform:
        """Pretraining augmentation: random resized crop (I-JEPA's only one) and optional flip."""
        hp = self.hparams
        if hp.crop_scale is None:
            steps = [v2.ToImage(), *self._resize_centre_crop()]
        else:
            steps = [v2.ToImage(), v2.RandomResizedCrop(hp.image_size, scale=tuple(hp.crop_scale), antialias=True)]
        if hp.horizontal_flip:  # independent of the crop: without one, the flip still applies
            steps.append(v2.RandomHorizontalFlip())
        return v2.Compose(steps + self._to_float())

    def eval_transform(self) -> v2.Transform:
        """Deterministic resize + centre crop to ``image_size``, then normalise."""
        return v2.Compose([v2.ToImage(), *self._resize_centre_crop(), *self._to_float()])

    def _resize_centre_crop(self) -> list[v2.Transform]:
        size = self.hparams.image_size
        return [v2.Resize(size, antialias=True), v2.CenterCrop(size)]

    @staticmethod
    def _to_float() -> list[v2.Transform]:
        return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]

    # --- datasets -----------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self.hparams.dataset == "stl10" and self.hparams.download:
            STL10(self.hparams.root, split="train+unlabeled", download=True)

    def setup(self, stage: str | None = None) -> None:
        if not self._splits:
            self.mask_sampler.check()
            builder = {
                "stl10": self._stl10,
                "imagefolder": self._imagefolder,
                "shapes": self._shapes,
                "moving_shapes": self._moving_shapes,
                "videofolder": self._videofolder,
            }
            self._splits = builder[self.hparams.dataset]()
            if self.hparams.probe_root is not None:
                self._probe_splits()
        if stage == "fit":
            self._check_batch_size()

    def _probe_splits(self) -> None:
        # The probes' splits (and classes) from data.probe_root; root's splits stay as they are.
        kind, make = ("video", self._video) if self.hparams.num_frames else ("image", self._image)
        root = Path(self.hparams.probe_root)
        splits, num_classes = self._folder_splits(kind, make, root, "data.probe_root")
        if num_classes < 2:
            raise ValueError(
                f"data.probe_root={str(root)!r} must hold labelled {kind}s for the probes: at least two "
                f"class sub-folders, got {num_classes}."
            )
        self._splits.update(knn_train=splits["knn_train"], knn_test=splits["knn_test"])
        self.num_classes = num_classes

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

    def _stl10(self) -> dict[str, Dataset]:
        root = Path(self.hparams.root)
        if not (root / "stl10_binary").is_dir():
            raise FileNotFoundError(
                f"STL-10 not found: expected {root / 'stl10_binary'} (data.root={str(root)!r}). "
                f"Set data.download=true to fetch it, or point data.root at the folder holding stl10_binary/."
            )

        def split(name: str, transform: v2.Transform) -> Dataset:
            try:
                return STL10(str(root), split=name, transform=transform, download=False)
            except RuntimeError as error:  # torchvision's "not found or corrupted"
                raise FileNotFoundError(
                    f"STL-10 under {root / 'stl10_binary'} is incomplete or truncated ({error}); "
                    f"set data.download=true to fetch it again."
                ) from error

        train, evaluate = self.train_transform(), self.eval_transform()
        return {
            "pretrain": split("train+unlabeled", train),
            "val": split("test", evaluate),
            "knn_train": split("train", evaluate),
            "knn_test": split("test", evaluate),
        }

    def _imagefolder(self) -> dict[str, Dataset]:
        splits, self.num_classes = self._folder_splits("image", self._image, Path(self.hparams.root), "data.root")
        return splits

    def _image(self, path: Path, training: bool, class_to_idx: dict[str, int] | None) -> RobustImageFolder:
        transform = self.train_transform() if training else self.eval_transform()
        return RobustImageFolder(
            str(path), transform=transform, bad_images=self.hparams.bad_images, class_to_idx=class_to_idx
        )

    def _folder_splits(
        self, kind: str, make: Callable[[Path, bool, dict | None], Dataset], root: Path, option: str
    ) -> tuple[dict[str, Dataset], int]:
        """The four splits of a class-folder dataset (images or videos) under ``root`` (set by the
        option named ``option``) and its number of classes. ``make(path, training, class_to_idx)``
        builds one dataset with ``classes``, ``class_to_idx`` and ``targets``, numbering its classes
        by ``class_to_idx`` when given. With ``root/train`` and ``root/val`` (or ``root/test``)
        those are the splits, both numbered by train's classes; otherwise (``root`` or
        ``root/train`` alone) a deterministic, class-balanced ``holdout_fraction`` is held out for
        probing and not pretrained on, unless the folder is unlabelled (fewer than two classes):
        then every item is pretrained on and ``val`` reuses an evenly spread
        ``holdout_fraction`` of them."""
        if not root.is_dir():
            raise FileNotFoundError(f"{kind} folder not found: {option}={str(root)!r} is not a directory.")
        held_out = next((root / name for name in ("val", "test") if (root / name).is_dir()), None)
        has_train = (root / "train").is_dir()
        if held_out is not None and not has_train:
            raise ValueError(f"{option}={str(root)!r} has {held_out.name}/ but no train/ folder beside it.")
        folder = root / "train" if has_train else root
        pretrain_set = make(folder, True, None)
        eval_set = make(folder, False, pretrain_set.class_to_idx)
        num_classes = len(pretrain_set.classes)
        if held_out is not None:
            # One class index for both splits (train's), so a class has one label everywhere; an
            # unlabelled train/ has no index to share, and nothing probes the held-out labels.
            held_set = make(held_out, False, pretrain_set.class_to_idx if num_classes >= 2 else None)
            return {"pretrain": pretrain_set, "val": held_set, "knn_train": eval_set, "knn_test": held_set}, num_classes
        if num_classes < 2:
            # Nothing to probe, so nothing to hold out: pretrain on everything; val/loss reuses
            # an evenly spread share of the training items (at least one).
            val_idx = holdout_split([0] * len(eval_set), self.hparams.holdout_fraction)[1] or [0]
            val_set = Subset(eval_set, val_idx)
            return {"pretrain": pretrain_set, "val": val_set, "knn_train": eval_set, "knn_test": val_set}, num_classes
        train_idx, test_idx = holdout_split(pretrain_set.targets, self.hparams.holdout_fraction)
        if not test_idx or not train_idx:
            raise ValueError(
                f"{option}={str(root)!r} has too few {kind}s to hold out "
                f"holdout_fraction={self.hparams.holdout_fraction} of each class for probing."
            )
        return {
            "pretrain": Subset(pretrain_set, train_idx),
            "val": Subset(eval_set, test_idx),
            "knn_train": Subset(eval_set, train_idx),
            "knn_test": Subset(eval_set, test_idx),
        }, num_classes

    def _shapes(self) -> dict[str, Dataset]:
        hp = self.hparams

        # Shapes are rendered at the model's image size; the transforms only normalise (and crop).
        def make(split: str, size: int, transform: v2.Transform) -> ShapesDataset:
            return ShapesDataset(
                size,
                hp.image_size,
                split=split,
                seed=hp.seed,
                background=hp.shapes_background,
                transform=transform,
                num_objects=tuple(hp.shapes_num_objects),
                radius=tuple(hp.shapes_radius),
            )

        train_set = make("train", hp.shapes_train_size, self.train_transform())
        val_set = make("val", hp.shapes_val_size, self.eval_transform())
        # The k-NN bank is the train split under the evaluation transform: same rendered images.
        knn_train_set = copy.copy(train_set)
        knn_train_set.transform = self.eval_transform()
        self.num_classes = train_set.num_classes
        return {"pretrain": train_set, "val": val_set, "knn_train": knn_train_set, "knn_test": val_set}

    def _moving_shapes(self) -> dict[str, Dataset]:
        hp = self.hparams

        # Clips are rendered at the model's size; the transform only normalises and puts channels first.
        def make(split: str, size: int) -> MovingShapesClips:
            return MovingShapesClips(
                size,
                hp.num_frames,
                hp.image_size,
                split=split,
                seed=hp.seed,
                num_directions=hp.clip_directions,
                speed=tuple(hp.clip_speed),
                background=hp.clip_background,
                fps=hp.clip_fps,
                num_objects=hp.clip_num_objects,
                label=hp.clip_label,
                transform=ClipToTensor(),
                cache=True,
            )  # rendered once, not once an epoch

        train_set = make("train", hp.shapes_train_size)
        val_set = make("val", hp.shapes_val_size)
        self.num_classes = train_set.num_classes
        return {"pretrain": train_set, "val": val_set, "knn_train": train_set, "knn_test": val_set}

    def _videofolder(self) -> dict[str, Dataset]:
        splits, self.num_classes = self._folder_splits("video", self._video, Path(self.hparams.root), "data.root")
        return splits

    def _video(self, path: Path, training: bool, class_to_idx: dict[str, int] | None) -> Dataset:
        hp = self.hparams
        return VideoFolderClips(
            path,
            hp.num_frames,
            hp.image_size,
            fps=hp.clip_fps,
            frame_stride=hp.frame_stride,
            start="random" if training else "center",
            crop_scale=hp.crop_scale if training else None,
            transform=ClipToTensor(),
            class_to_idx=class_to_idx,
        )

    def split(self, name: str) -> Dataset:
        """One of the datasets ``pretrain``, ``val``, ``knn_train``, ``knn_test``."""
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

    def _progress(self) -> tuple[int, int]:
        # (epoch, batches of it trained so far), what a checkpoint written now has seen.
        loop = self.trainer.fit_loop
        return loop.epoch_progress.current.completed, loop.epoch_loop.batch_progress.current.processed

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
            collate_fn=MaskCollator(self.mask_sampler, hp.masks_per_image),
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
        return self._loader(dataset, self.hparams.batch_size, False, MaskCollator(self.mask_sampler))

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return self.knn_test_dataloader()

    def knn_train_dataloader(self) -> DataLoader:
        """Labelled bank for the k-NN probe, evaluation transform, ``{"images", "labels"}`` batches."""
        return self._loader(
            self.split("knn_train"), self.hparams.knn_batch_size, False, labeled_collate, persistent=False
        )

    def knn_test_dataloader(self) -> DataLoader:
        """Held-out labelled queries for the k-NN probe."""
        return self._loader(
            self.split("knn_test"), self.hparams.knn_batch_size, False, labeled_collate, persistent=False
        )
