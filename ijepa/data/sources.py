"""Data sources: where the images (or clips) come from, each with its own options.

The DataModule keeps what every source shares (image size, patch size, batches, workers,
augmentation, masks) and asks its source for four splits (:meth:`DataSource.splits`):

* ``pretrain``: what the encoder is trained on (training transform);
* ``val``: held-out items for ``val/loss`` (evaluation transform);
* ``probe_train`` / ``probe_test``: the probes' labelled bank and queries (evaluation transform).

A source is chosen in YAML by ``class_path`` and owns its options::

    data:
      source:
        class_path: ijepa.data.ShapesSource
        init_args: {train_size: 6400, background: noisy}

A new data set is one :class:`DataSource` subclass; the DataModule does not change.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset, Subset

from ijepa.data.batch import IGNORE_INDEX
from ijepa.data.imagefolder import BAD_IMAGE_POLICIES, RobustImageFolder, check_mask_options
from ijepa.data.moving_shapes import MovingShapesClips, check_clip_options
from ijepa.data.shapes import ShapesDataset, check_shape_options
from ijepa.data.stl10 import STL10
from ijepa.data.transforms import ClipToTensor
from ijepa.data.video_folder import VideoFolderClips
from ijepa.nn.checks import check_range
from ijepa.registry import class_path, concrete_subclasses, from_config, import_modules

SPLIT_NAMES = ("pretrain", "val", "probe_train", "probe_test")


@dataclass
class SplitSettings:
    """What the DataModule tells a source when it asks for splits.

    Attributes:
        image_size: side of the square images (or clip frames) in pixels.
        num_frames: frames per clip; 0 for images.
        seed: ``data.seed``, the seed of generated data.
        train_transform: the pretraining augmentation of a PIL image / uint8 tensor.
        eval_transform: the deterministic evaluation transform.
        crop_scale: the random-resized-crop area range (clips apply it to every frame alike).
        option: how the source is named in the config (``data.source``, ``data.probe_source``),
            for error messages.
    """

    image_size: int
    num_frames: int
    seed: int
    train_transform: Callable
    eval_transform: Callable
    crop_scale: tuple[float, float] | None
    option: str = "data.source"


@dataclass
class Splits:
    """A source's four datasets (see the module docstring) and its number of classes
    (below 2: unlabelled, the probes stand down)."""

    pretrain: Dataset
    val: Dataset
    probe_train: Dataset
    probe_test: Dataset
    num_classes: int

    def as_dict(self) -> dict[str, Dataset]:
        return {name: getattr(self, name) for name in SPLIT_NAMES}


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


def check_fraction(value: float, name: str) -> None:
    check_range(value, name, 0, 1, low_open=True, high_open=True)


def check_count(value: int, name: str, low: int = 1) -> None:
    check_range(value, name, low)
    if int(value) != value:
        raise ValueError(f"{name} must be an integer >= {low}, got {value}.")


class DataSource(abc.ABC):
    """Base class of the data sources. Subclasses set ``clips`` (True for sources of clips
    ``[T, C, H, W]``, which need ``data.num_frames > 0``) and implement :meth:`splits`.
    Abstract, so that the sources the CLI lists (help, a mistyped ``data.source``) are the
    usable ones: every subclass imported so far, never a fixed list."""

    clips: bool = False

    def prepare(self) -> None:  # noqa: B027  (optional: most sources have nothing to prepare)
        """Download or otherwise prepare the data once per node (``prepare_data``)."""

    def check_probe_source(self, probe: DataSource) -> None:  # noqa: B027  (optional, as prepare)
        """Refuse a ``data.probe_source`` that cannot probe what this source pretrains on."""

    def check(self, option: str = "data.source") -> None:  # noqa: B027  (optional, as prepare)
        """The checks of :meth:`splits` that read no file (a folder that must exist), with its
        errors; ``option`` names the source in them. ``ijepa`` calls it before it builds the model
        or starts a process (:mod:`ijepa.preflight`), so a wrong path fails in seconds."""

    @abc.abstractmethod
    def splits(self, settings: SplitSettings) -> Splits:
        """The four datasets at ``settings.image_size`` with the given transforms."""

    def config(self) -> dict:
        """``{"class_path", "init_args"}``: plain values that rebuild this source
        (:func:`source_from_config`), stored in checkpoints instead of the object."""
        return {"class_path": class_path(self), "init_args": copy.deepcopy(vars(self))}

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({args})"


def source_kinds() -> tuple[type[DataSource], ...]:
    """The concrete data sources of every module of ``ijepa.data``, in the order they were
    defined: the registry the CLI's choices and the generated docs read."""
    import_modules("ijepa.data")
    return concrete_subclasses(DataSource)


def source_from_config(config: dict) -> DataSource:
    """The source a :meth:`DataSource.config` dict describes."""
    return from_config(config, DataSource)


def check_folder(kind: str, root: Path, option: str) -> Path | None:
    """Refuse a class-folder data set's ``root`` (``option`` names it) that is no directory, or
    that has ``val/`` (or ``test/``) without ``train/``; returns that held-out folder, or None."""
    if not root.is_dir():
        raise FileNotFoundError(f"{kind} folder not found: {option}={str(root)!r} is not a directory.")
    held_out = next((root / name for name in ("val", "test") if (root / name).is_dir()), None)
    if held_out is not None and not (root / "train").is_dir():
        raise ValueError(f"{option}={str(root)!r} has {held_out.name}/ but no train/ folder beside it.")
    return held_out


def folder_splits(
    kind: str,
    make: Callable[[Path, bool, dict | None], Dataset],
    root: Path,
    option: str,
    holdout_fraction: float,
) -> Splits:
    """The splits of a class-folder data set (images or videos) under ``root`` (``option`` names
    it in errors). ``make(path, training, class_to_idx)`` builds one dataset with ``classes``,
    ``class_to_idx`` and ``targets``, numbering its classes by ``class_to_idx`` when given.

    With ``root/train`` and ``root/val`` (or ``root/test``) those are the splits, both numbered
    by train's classes; otherwise (``root`` or ``root/train`` alone) a deterministic,
    class-balanced ``holdout_fraction`` is held out for probing and not pretrained on, unless the
    folder is unlabelled (fewer than two classes): then every item is pretrained on and ``val``
    reuses an evenly spread ``holdout_fraction`` of them."""
    held_out = check_folder(kind, root, option)
    has_train = (root / "train").is_dir()
    folder = root / "train" if has_train else root
    pretrain_set = make(folder, True, None)
    eval_set = make(folder, False, pretrain_set.class_to_idx)
    num_classes = len(pretrain_set.classes)
    if held_out is not None:
        # One class index for both splits (train's), so a class has one label everywhere; an
        # unlabelled train/ has no index to share, and nothing probes the held-out labels.
        held_set = make(held_out, False, pretrain_set.class_to_idx if num_classes >= 2 else None)
        return Splits(pretrain_set, held_set, eval_set, held_set, num_classes)
    if num_classes < 2:
        # Nothing to probe, so nothing to hold out: pretrain on everything; val/loss reuses
        # an evenly spread share of the training items (at least one).
        val_idx = holdout_split([0] * len(eval_set), holdout_fraction)[1] or [0]
        val_set = Subset(eval_set, val_idx)
        return Splits(pretrain_set, val_set, eval_set, val_set, num_classes)
    train_idx, test_idx = holdout_split(pretrain_set.targets, holdout_fraction)
    if not test_idx or not train_idx:
        raise ValueError(
            f"{option}={str(root)!r} has too few {kind}s to hold out "
            f"holdout_fraction={holdout_fraction} of each class for probing."
        )
    return Splits(
        Subset(pretrain_set, train_idx),
        Subset(eval_set, test_idx),
        Subset(eval_set, train_idx),
        Subset(eval_set, test_idx),
        num_classes,
    )


class STL10Source(DataSource):
    """STL-10: pretrain on ``train+unlabeled`` (105k images), k-NN bank ``train``, queries and
    ``val/loss`` on ``test``. Expects ``root/stl10_binary``; ``download: true`` fetches it (2.6 GB).

    Args:
        root: the folder holding ``stl10_binary/``.
        download: fetch STL-10 into ``root`` if it is missing.
    """

    def __init__(self, root: str = "data", download: bool = False):
        self.root = root
        self.download = download

    def prepare(self) -> None:
        if self.download:
            STL10(self.root, split="train+unlabeled", download=True)

    def check(self, option: str = "data.source") -> None:
        if not self.download:  # else prepare() fetches it before splits() looks
            self._check_binary(option)

    def _check_binary(self, option: str) -> None:
        root = Path(self.root)
        if not (root / "stl10_binary").is_dir():
            raise FileNotFoundError(
                f"STL-10 not found: expected {root / 'stl10_binary'} ({option}.root={str(root)!r}). "
                f"Set {option}.download=true to fetch it, or point {option}.root at the folder holding stl10_binary/."
            )

    def splits(self, settings: SplitSettings) -> Splits:
        root = Path(self.root)
        self._check_binary(settings.option)

        def split(name: str, transform: Callable) -> Dataset:
            try:
                return STL10(str(root), split=name, transform=transform, download=False)
            except RuntimeError as error:  # torchvision's "not found or corrupted"
                raise FileNotFoundError(
                    f"STL-10 under {root / 'stl10_binary'} is incomplete or truncated ({error}); "
                    f"set {settings.option}.download=true to fetch it again."
                ) from error

        test = split("test", settings.eval_transform)
        return Splits(
            split("train+unlabeled", settings.train_transform),
            test,
            split("train", settings.eval_transform),
            test,
            10,
        )


class ImageFolderSource(DataSource):
    """Images under ``root`` in class sub-folders. With ``root/train`` and ``root/val`` (or
    ``root/test``) those are the splits, both numbered by the training split's classes (a val
    class missing from ``train/`` is an error naming it); otherwise a deterministic,
    class-balanced ``holdout_fraction`` of the images is held out for probing and not pretrained
    on. Every PIL image mode is read as 8-bit RGB (:func:`ijepa.data.imagefolder.to_rgb`).

    Unlabelled folders (images directly in the folder, or one class sub-folder) have nothing to
    probe: every image is pretrained on, and without a ``val/`` folder ``val/loss`` reuses an
    evenly spread ``holdout_fraction`` of the training images under the evaluation transform.

    Args:
        root: the image folder.
        bad_images: what to do with unreadable files: ``error`` (raise, naming them) or ``skip``
            (warn and leave them out).
        holdout_fraction: share of each class held out for probing when there is no val split
            (unlabelled folders: the share of the training images that val/loss reuses).
        masks: a folder of per-pixel class masks laid out as ``root`` (``masks/train/...`` for
            ``root/train/...``), each image's mask at its relative path with a ``.png``
            extension: index PNGs (mode ``L`` or ``P``), the value the class, the ADE20K / VOC
            convention. Items are then ``(image, {"label", "mask", "count"})`` (count ``-1``,
            unknown), batches :class:`~ijepa.data.batch.DenseBatch`. Null: no masks.
        ignore_index: the mask value of pixels to ignore (0 to 255), mapped to
            :data:`~ijepa.data.batch.IGNORE_INDEX`.
    """

    def __init__(
        self,
        root: str = "data",
        bad_images: str = "error",
        holdout_fraction: float = 0.2,
        masks: str | None = None,
        ignore_index: int = IGNORE_INDEX,
    ):
        if bad_images not in BAD_IMAGE_POLICIES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGE_POLICIES}, got {bad_images!r}.")
        check_fraction(holdout_fraction, "holdout_fraction")
        check_mask_options(masks, ignore_index)
        self.root = root
        self.bad_images = bad_images
        self.holdout_fraction = holdout_fraction
        self.masks = masks
        self.ignore_index = ignore_index

    def check(self, option: str = "data.source") -> None:
        check_folder("image", Path(self.root), f"{option}.root")
        if self.masks is not None and not Path(self.masks).is_dir():
            raise FileNotFoundError(f"mask folder not found: {option}.masks={self.masks!r} is not a directory.")

    def splits(self, settings: SplitSettings) -> Splits:
        root = Path(self.root)

        def make(path: Path, training: bool, class_to_idx: dict | None) -> Dataset:
            transform = settings.train_transform if training else settings.eval_transform
            masks = None if self.masks is None else str(Path(self.masks) / path.relative_to(root))
            return RobustImageFolder(
                str(path),
                transform=transform,
                bad_images=self.bad_images,
                class_to_idx=class_to_idx,
                masks=masks,
                ignore_index=self.ignore_index,
            )

        return folder_splits("image", make, root, f"{settings.option}.root", self.holdout_fraction)


class ShapesSource(DataSource):
    """Generated labelled shapes (:mod:`ijepa.data.shapes`), rendered at the model's image size,
    fully offline and deterministic per ``data.seed``; the k-NN bank is the training split under
    the evaluation transform, the held-out split gives the queries and ``val/loss``.

    Args:
        train_size: generated training images.
        val_size: generated held-out images.
        background: plain, noisy or busy.
        num_objects: range of instances of the image's class per image.
        radius: range of an object's radius as a fraction of the image side.
        dense: items are ``(image, {"label", "mask", "count"})``: each image's per-pixel class
            mask (``0`` background, ``label + 1`` on a shape) and its number of shapes, moved
            with the image by the transforms, for the segmentation and counting evaluations
            (batches: :class:`~ijepa.data.batch.DenseBatch`).
    """

    def __init__(
        self,
        train_size: int = 10_000,
        val_size: int = 2_000,
        background: str = "plain",
        num_objects: tuple[int, int] = (1, 1),
        radius: tuple[float, float] = (0.2, 0.42),
        dense: bool = False,
    ):
        check_count(train_size, "train_size")
        check_count(val_size, "val_size")
        check_shape_options(background, num_objects, radius)
        if not isinstance(dense, bool):
            raise ValueError(f"dense must be a bool (true: items carry masks and counts), got {dense!r}.")
        self.train_size = train_size
        self.val_size = val_size
        self.background = background
        self.num_objects = tuple(num_objects)
        self.radius = tuple(radius)
        self.dense = dense

    def splits(self, settings: SplitSettings) -> Splits:
        # Rendered at the model's image size; the transforms only normalise (and crop).
        def make(split: str, size: int, transform: Callable) -> ShapesDataset:
            return ShapesDataset(
                size,
                settings.image_size,
                split=split,
                seed=settings.seed,
                background=self.background,
                transform=transform,
                num_objects=self.num_objects,
                radius=self.radius,
                dense=self.dense,
            )

        train_set = make("train", self.train_size, settings.train_transform)
        val_set = make("val", self.val_size, settings.eval_transform)
        # The k-NN bank is the train split under the evaluation transform: same rendered images.
        probe_train_set = copy.copy(train_set)
        probe_train_set.transform = settings.eval_transform
        return Splits(train_set, val_set, probe_train_set, val_set, train_set.num_classes)


class MovingShapesSource(DataSource):
    """Generated labelled clips (:mod:`ijepa.data.moving_shapes`) whose class is the direction of
    motion (or the moving shape), rendered once when the data is set up, not every epoch.

    Args:
        train_size: generated training clips.
        val_size: generated held-out clips.
        directions: 4 or 8 motion classes.
        speed: range of the motion speed in pixels per frame.
        background: ``texture`` (the whole scene pans), ``plain`` or ``noisy`` (a flat colour,
            with light pixel noise for ``noisy``).
        num_objects: instances of the clip's shape, all moving together: an int or a
            ``(min, max)`` range drawn per clip.
        radius: range of a shape's radius as a fraction of the frame side.
        label: what a clip's class is: ``direction`` of motion or ``shape``.
        fps: the clips' nominal frame rate; with one, batches carry ``frame_times [B, T]`` in
            seconds (null: no timestamps, M-RoPE uses frame indices).
    """

    clips = True

    def __init__(
        self,
        train_size: int = 10_000,
        val_size: int = 2_000,
        directions: int = 4,
        speed: tuple[float, float] = (1.0, 2.0),
        background: str = "texture",
        num_objects: int | tuple[int, int] = 1,
        label: str = "direction",
        fps: float | None = None,
        radius: tuple[float, float] = (0.12, 0.2),
    ):
        check_count(train_size, "train_size")
        check_count(val_size, "val_size")
        check_clip_options(directions, speed, radius, background, num_objects, label, fps, "directions")
        self.train_size = train_size
        self.val_size = val_size
        self.directions = directions
        self.speed = tuple(speed)
        self.background = background
        self.num_objects = num_objects if isinstance(num_objects, int) else tuple(num_objects)
        self.label = label
        self.fps = fps
        self.radius = tuple(radius)

    def splits(self, settings: SplitSettings) -> Splits:
        # Rendered at the model's size; the transform only normalises and puts channels first.
        def make(split: str, size: int) -> MovingShapesClips:
            return MovingShapesClips(
                size,
                settings.num_frames,
                settings.image_size,
                split=split,
                seed=settings.seed,
                num_directions=self.directions,
                speed=self.speed,
                background=self.background,
                fps=self.fps,
                num_objects=self.num_objects,
                label=self.label,
                radius=self.radius,
                transform=ClipToTensor(),
                cache=True,
            )

        train_set = make("train", self.train_size)
        val_set = make("val", self.val_size)
        return Splits(train_set, val_set, train_set, val_set, train_set.num_classes)


class VideoFolderSource(DataSource):
    """Video files under ``root`` in class sub-folders, split like :class:`ImageFolderSource`
    and decoded by PyAV (``pip install av``). Clips are sampled at ``fps`` frames per second, or
    every ``frame_stride``-th frame; training clips start at random with a random resized crop
    (``data.crop_scale``) shared by their frames, evaluation clips are centred. With ``fps`` the
    batches carry ``frame_times [B, T]`` (seconds). Loose videos (no class sub-folders) are
    unlabelled, as for image folders.

    Args:
        root: the video folder.
        fps: sampling rate in frames per second (null: every ``frame_stride``-th decoded frame).
        frame_stride: without ``fps``: take every n-th decoded frame.
        holdout_fraction: share of each class held out for probing when there is no val split.
    """

    clips = True

    def __init__(
        self, root: str = "data", fps: float | None = None, frame_stride: int = 1, holdout_fraction: float = 0.2
    ):
        if fps is not None:
            check_range(fps, "fps", 0, low_open=True)
        check_count(frame_stride, "frame_stride")
        check_fraction(holdout_fraction, "holdout_fraction")
        self.root = root
        self.fps = fps
        self.frame_stride = frame_stride
        self.holdout_fraction = holdout_fraction

    def check(self, option: str = "data.source") -> None:
        check_folder("video", Path(self.root), f"{option}.root")

    def splits(self, settings: SplitSettings) -> Splits:
        def make(path: Path, training: bool, class_to_idx: dict | None) -> Dataset:
            return VideoFolderClips(
                path,
                settings.num_frames,
                settings.image_size,
                fps=self.fps,
                frame_stride=self.frame_stride,
                start="random" if training else "center",
                crop_scale=settings.crop_scale if training else None,
                transform=ClipToTensor(),
                class_to_idx=class_to_idx,
            )

        return folder_splits("video", make, Path(self.root), f"{settings.option}.root", self.holdout_fraction)
