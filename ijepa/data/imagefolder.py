"""An ``ImageFolder`` that reports unreadable files clearly instead of crashing in a worker, reads
every image mode PIL opens as 8-bit RGB, numbers its classes by another split's index when told
to, also reads a folder of loose (unlabelled) images, never walks a folder twice through a
directory link (a loop such as ``circle/loop -> ..``), and reads per-pixel class masks from a
folder beside the images (``masks``: index PNGs, the ADE20K / VOC convention)."""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision import datasets, tv_tensors

from ijepa.data.batch import IGNORE_INDEX

BAD_IMAGE_POLICIES = ("error", "skip")
UNLABELLED = -1  # the label of an image with no class folder (as STL-10's unlabeled split)
# Modes PIL's own convert("RGB") maps correctly (no alpha, 8 bits per channel).
PLAIN_MODES = ("1", "L", "RGB", "RGBX", "CMYK", "YCbCr", "LAB", "HSV")
# Modes that carry (or, for palettes, may carry) an alpha channel.
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA", "P")
# Single-channel modes of more than 8 bits, which convert("RGB") clips at 255.
HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
MASK_MODES = ("L", "P")  # index PNGs: one 8-bit class id per pixel (a palette image's indices)
UNKNOWN_COUNT = -1  # the object count of an image folder's dense items


def check_mask_options(masks: str | None, ignore_index: int) -> None:
    """The checks of the mask options a :class:`RobustImageFolder` and its source share."""
    if masks is not None and (not isinstance(masks, (str, os.PathLike)) or not str(masks)):
        raise ValueError(f"masks must be a folder path (or None: no masks), got {masks!r}.")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int) or not 0 <= ignore_index <= 255:
        raise ValueError(f"ignore_index must be an int in [0, 255] (an index PNG's values), got {ignore_index!r}.")


def mask_path(image_path: str | Path, root: str | Path, masks: str | Path) -> Path:
    """Where the mask of ``image_path`` (under ``root``) is: the same relative path under
    ``masks``, with a ``.png`` extension."""
    return (Path(masks) / Path(image_path).relative_to(root)).with_suffix(".png")


def load_mask(
    path: str | Path,
    image_path: str,
    image_size: tuple[int, int],
    ignore_index: int = IGNORE_INDEX,
    data: bytes | memoryview | None = None,
):
    """The class mask at ``path`` (an index PNG, mode ``L`` or ``P``) of the image at
    ``image_path`` of ``image_size`` ``(W, H)`` -> ``tv_tensors.Mask`` int64 ``[H, W]``, the pixels
    of value ``ignore_index`` set to :data:`~ijepa.data.batch.IGNORE_INDEX`. ``data``: the file's
    bytes, read instead of ``path`` (shards; ``path`` then only names it). ``FileNotFoundError``
    for a missing file, ``ValueError`` for another mode, size or a class value that would read as
    ignored, each naming the files."""
    if data is None and not os.path.isfile(path):
        raise FileNotFoundError(
            f"no mask for image {image_path}: expected {path} (masks mirror the image folder, with a .png extension)."
        )
    with Image.open(path if data is None else io.BytesIO(data)) as mask:
        mask.load()
        if mask.mode not in MASK_MODES:
            raise ValueError(
                f"mask {path} of image {image_path} has mode {mask.mode!r}; masks are index PNGs of mode "
                f"{' or '.join(MASK_MODES)} (one class id per pixel)."
            )
        if mask.size != tuple(image_size):
            raise ValueError(
                f"mask {path} is {mask.size[0]}x{mask.size[1]} (WxH) but its image {image_path} is "
                f"{image_size[0]}x{image_size[1]}: a mask must have its image's size."
            )
        values = torch.from_numpy(np.array(mask, dtype=np.uint8)).to(torch.int64)
    if ignore_index != IGNORE_INDEX:
        if (values == IGNORE_INDEX).any():
            raise ValueError(
                f"mask {path} holds the value {IGNORE_INDEX}, which reads as ignored (IGNORE_INDEX) while "
                f"ignore_index={ignore_index}: renumber that class, or set ignore_index={IGNORE_INDEX}."
            )
        values[values == ignore_index] = IGNORE_INDEX
    return tv_tensors.Mask(values)


def find_classes(directory: str | Path, class_to_idx: dict[str, int] | None = None) -> tuple[list[str], dict[str, int]]:
    """The class sub-folders of ``directory`` and their indices ``(classes, class_to_idx)``.

    Without ``class_to_idx``: the sub-folders in sorted order, numbered 0, 1, ... (torchvision's
    rule), or ``([], {})`` when there are none (a folder of loose, unlabelled files). With
    ``class_to_idx`` (the training split's index): that index, so that every split numbers a class
    alike; a sub-folder that it lacks raises ``ValueError`` naming it.
    """
    try:
        classes, own_index = datasets.folder.find_classes(directory)
    except FileNotFoundError:
        if not Path(directory).is_dir():
            raise
        classes, own_index = [], {}  # no class sub-folders: loose files
    if class_to_idx is None:
        return classes, own_index
    if class_to_idx and not classes:
        raise ValueError(
            f"{directory} has no class folders but the training split has the classes {sorted(class_to_idx)}: "
            f"put its images in sub-folders named like train/'s, so that they are labelled alike."
        )
    unknown = sorted(set(classes) - set(class_to_idx))
    if unknown:
        raise ValueError(
            f"class folder(s) {unknown} under {directory} are not among the training split's classes "
            f"{sorted(class_to_idx)}: every class of val/ (or test/) needs a folder of the same name under train/, "
            f"so that both splits number it alike. Add the folder(s) to train/ or remove them from {directory}."
        )
    return sorted(class_to_idx, key=class_to_idx.get), dict(class_to_idx)


def class_files(directory: str | Path, class_folders: list[str], keep: Callable[[str], bool]) -> dict[str, list[str]]:
    """The files that ``keep`` accepts under each of ``class_folders`` (sub-folders of
    ``directory``), recursively, in torchvision's order (folders by path, files by name).

    Directory links are followed (a class folder may link to data stored elsewhere), but no real
    folder is read twice: a link is skipped when it leads back into ``directory`` (into its own
    or another class folder, or above it, as ``circle/loop -> ..``), to a folder above the link,
    or to a folder read already. A link loop made ``os.walk`` read the tree again at every
    level, counting each image many times under the wrong class, or never end. The skipped links
    are named in one warning.
    """
    real_root = os.path.realpath(directory)
    folders = {name: os.path.join(directory, name) for name in class_folders}
    folders = {name: folder for name, folder in folders.items() if os.path.isdir(folder)}
    seen = {_identity(folder) for folder in folders.values()}  # each class folder is read as itself
    skipped: list[str] = []
    found = {name: [] for name in class_folders}
    for name, class_folder in folders.items():
        listed = []  # (folder, its files)
        pending = [class_folder]
        while pending:
            folder = pending.pop()
            real_folder = os.path.realpath(folder)
            files = []
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if not entry.is_dir():  # as os.walk: a broken link is a file, reported when read
                    if keep(entry.path):
                        files.append(entry.path)
                    continue
                target = os.path.realpath(entry.path)
                identity = _identity(entry.path)
                if identity in seen or (
                    entry.is_symlink() and (_is_within(target, real_root) or _is_within(real_folder, target))
                ):
                    link = os.readlink(entry.path) if entry.is_symlink() else target  # as the user wrote it
                    skipped.append(f"{os.path.relpath(entry.path, directory)} -> {link}")
                    continue
                seen.add(identity)
                pending.append(entry.path)
            listed.append((folder, files))
        found[name] = [path for _, files in sorted(listed) for path in files]
    if skipped:
        shown = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        warnings.warn(
            f"not following {len(skipped)} directory link(s) under {directory} that lead back into it, to a "
            f"folder above them, or to a folder read already, so that each file is read once, labelled by the "
            f"class folder it is in (remove the links, or point them at folders outside {directory}, to silence "
            f"this): {shown}",
            stacklevel=2,
        )
    return found


def _identity(path: str) -> tuple[int, int]:
    """A folder's (device, inode): one key however many links or mounts lead to it."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _is_within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


class RobustImageFolder(datasets.ImageFolder):
    """``torchvision.datasets.ImageFolder`` with a policy for corrupt or truncated image files.

    ``bad_images="error"`` raises ``ValueError`` naming the file (and the option); ``"skip"``
    warns once per file, counts it in ``skipped`` (per process), and returns the next readable
    image instead, so a batch never comes up short. An empty folder raises ``FileNotFoundError``
    naming ``data.source.root``.

    ``class_to_idx`` numbers the classes by another split's index (see :func:`find_classes`): a
    held-out split built with the training split's index labels a class as training does, even
    when it lacks some of the training classes. A folder with no class sub-folders holds loose,
    unlabelled images: ``classes`` is empty and every label is ``-1``. Images are read by
    :func:`load_rgb`, which maps every PIL mode to 8-bit RGB.

    ``masks``: a folder holding each image's per-pixel class mask at the image's path relative to
    ``root``, with a ``.png`` extension (:func:`load_mask`: index PNGs of mode ``L`` or ``P``, the
    value the class, ``ignore_index`` mapped to :data:`~ijepa.data.batch.IGNORE_INDEX`). Items
    are then ``(image, {"label": int, "mask": Mask int64 [H, W], "count": -1})`` and
    ``transform`` is called as ``transform(image, target)``, so that torchvision v2 transforms
    move the mask with the image (nearest). A missing mask is an error when the folder is read;
    an unreadable mask, or one whose size is not its image's, when the item is.
    """

    def __init__(
        self,
        root: str,
        transform=None,
        bad_images: str = "error",
        class_to_idx: dict[str, int] | None = None,
        masks: str | None = None,
        ignore_index: int = IGNORE_INDEX,
    ):
        if bad_images not in BAD_IMAGE_POLICIES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGE_POLICIES}, got {bad_images!r}.")
        check_mask_options(masks, ignore_index)
        self._given_class_to_idx = class_to_idx  # read by find_classes, which ImageFolder.__init__ calls
        try:
            # allow_empty: a split numbered by the training index may lack some training classes.
            super().__init__(root, transform=transform, loader=load_rgb, allow_empty=class_to_idx is not None)
        except FileNotFoundError as error:  # no images at all, or class folders without images
            raise FileNotFoundError(
                f"no images under data.source.root={root!r}: expected image files "
                f"({', '.join(sorted(datasets.folder.IMG_EXTENSIONS))}), in one sub-folder per class or "
                f"directly in the folder (unlabelled); torchvision said: {error}"
            ) from error
        self.bad_images = bad_images
        self.skipped: set[str] = set()
        self.masks = None if masks is None else str(masks)
        self.ignore_index = ignore_index
        if self.masks is not None:
            self._check_masks_exist()

    def _check_masks_exist(self) -> None:
        if not os.path.isdir(self.masks):
            raise FileNotFoundError(f"mask folder not found: masks={self.masks!r} is not a directory.")
        missing = [(path, self.mask_path(path)) for path, _ in self.samples if not self.mask_path(path).is_file()]
        if missing:
            shown = "; ".join(f"{image} -> {mask}" for image, mask in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise FileNotFoundError(
                f"no mask for {len(missing)} of {len(self.samples)} image(s) under {self.root} "
                f"(expected at the same relative path under {self.masks}, with a .png extension): {shown}{more}."
            )

    def mask_path(self, image_path: str) -> Path:
        """Where the mask of the image at ``image_path`` is (:func:`mask_path`)."""
        return mask_path(image_path, self.root, self.masks)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        return find_classes(directory, self._given_class_to_idx)

    @staticmethod
    def make_dataset(
        directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False
    ) -> list[tuple[str, int]]:
        """torchvision's ``(path, class index)`` samples, walked by :func:`class_files` (no folder
        read twice through a link), or, with no classes, the loose images directly in
        ``directory``, labelled ``-1``."""
        if (extensions is None) == (is_valid_file is None):
            raise ValueError("make_dataset needs either extensions or is_valid_file, not both or neither.")
        valid = is_valid_file or (lambda name: datasets.folder.has_file_allowed_extension(name, extensions))
        if class_to_idx:
            found = class_files(directory, sorted(class_to_idx), valid)
            samples = [(path, class_to_idx[name]) for name, paths in found.items() for path in paths]
            empty = sorted(name for name, paths in found.items() if not paths)
            if empty and not allow_empty:
                raise FileNotFoundError(
                    f"Found no valid file for the classes {', '.join(empty)}. "
                    f"Supported extensions are: {', '.join(extensions or ())}"
                )
        else:  # no class folders: the image files directly in the folder, unlabelled
            samples = [
                (entry.path, UNLABELLED)
                for entry in sorted(os.scandir(directory), key=lambda e: e.name)
                if entry.is_file() and valid(entry.path)
            ]
        if not samples:
            raise FileNotFoundError(f"found no image files in {directory}.")
        return samples

    def __getitem__(self, index: int):
        if not -len(self) <= index < len(self):  # ends iteration (the skip below wraps around)
            raise IndexError(f"index {index} out of range for {len(self)} images.")
        for offset in range(len(self)):
            position = (index + offset) % len(self)
            try:
                if self.masks is None:
                    return super().__getitem__(position)
                image = self.loader(self.samples[position][0])
            except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as error:
                path = self.samples[position][0]
                if self.bad_images == "error":
                    action = (
                        "remove or downscale it (a trusted file can be read by raising PIL.Image.MAX_IMAGE_PIXELS "
                        "in Python before training)"
                        if isinstance(error, ImageTooLarge)
                        else "remove it"
                    )
                    raise ValueError(
                        f"unreadable image {path} ({type(error).__name__}: {error}); {action}, or set "
                        f"data.source.bad_images=skip to skip unreadable files with a warning."
                    ) from error
                if path not in self.skipped:
                    self.skipped.add(path)
                    warnings.warn(
                        f"skipping unreadable image {path} ({error}); {len(self.skipped)} skipped so far.", stacklevel=2
                    )
                continue
            return self._dense_item(position, image)
        raise ValueError(f"no readable image under {Path(self.root)}.")

    def _dense_item(self, position: int, image: Image.Image) -> tuple:
        """``(image, {"label", "mask", "count"})`` through the transform; mask errors are raised,
        never skipped (a bad mask is not a bad image)."""
        path, label = self.samples[position]
        mask = load_mask(self.mask_path(path), path, image.size, self.ignore_index)
        if self.target_transform is not None:
            label = self.target_transform(label)
        target = {"label": label, "mask": mask, "count": UNKNOWN_COUNT}
        if self.transform is not None:
            return self.transform(image, target)
        return image, target


class ImageTooLarge(ValueError):
    """An image of more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``, PIL's guard against
    decompression bombs (a small file that decodes to gigabytes)."""


def load_rgb(path: str) -> Image.Image:
    """The image at ``path`` as 8-bit RGB (see :func:`to_rgb`); :class:`ImageTooLarge` for one
    of more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``."""
    # Decode fully here (not lazily in a transform) so a truncated file fails in the caller's try block.
    with open(path, "rb") as f:
        try:
            # PIL only warns up to twice its limit and decodes anyway; one limit, refused alike.
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(f)
                image.load()  # some formats (GIF, TIFF frames) check sizes only here
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            pixels = re.search(r"\((\d+) pixels\)", str(error))
            raise ImageTooLarge(
                f"{int(pixels[1]) if pixels else 'too many'} pixels, more than PIL.Image.MAX_IMAGE_PIXELS="
                f"{Image.MAX_IMAGE_PIXELS}, PIL's guard against decompression bombs"
            ) from error
        return to_rgb(image, path)


def to_rgb(image: Image.Image, path: str = "<image>") -> Image.Image:
    """``image`` in any mode PIL opens -> 8-bit ``RGB``; ``ValueError`` naming ``path`` and the
    mode for anything that has no faithful conversion (never a blank image).

    * ``1``, ``L``, ``RGB``, ``RGBX``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``: PIL's conversion.
    * With alpha (``RGBA``, ``LA``, ``PA``, ``P``, any mode with a ``transparency`` key):
      composited over white, as a viewer shows it on a white page (dropping alpha would reveal
      whatever colour the transparent pixels happen to store, often black).
    * 16-bit (``I;16``, ``I;16B``, ...): ``round(value / 257)``, mapping 0..65535 onto 0..255.
    * ``I`` (32-bit integer; some Pillow versions open 16-bit PNGs so): values within 0..65535
      are 16-bit samples, as above; any other range is stretched by the image's own min..max.
    * ``F`` (32-bit float): values within [0, 1] are scaled by 255; any other range is
      stretched by the image's own min..max. NaN or infinite values are refused.

    A constant image stretched by its own range becomes black.
    """
    mode = image.mode
    if mode in HIGH_BIT_MODES:
        return Image.fromarray(_to_uint8(np.asarray(image), mode, path)).convert("RGB")
    if mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode in PLAIN_MODES:
        return image.convert("RGB")
    raise ValueError(f"image mode {mode!r} of {path} has no known conversion to 8-bit RGB; convert the file to RGB.")


def _to_uint8(values: np.ndarray, mode: str, path: str) -> np.ndarray:
    """A single-channel high-bit-depth array ``[H, W]`` -> ``uint8 [H, W]`` by :func:`to_rgb`'s rules."""
    values = values.astype(np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"image mode {mode!r} of {path} holds NaN or infinite values; no 8-bit RGB conversion.")
    low, high = (values.min(), values.max()) if values.size else (0.0, 0.0)
    if mode.startswith("I;16") or (mode == "I" and low >= 0 and high <= 65535):
        scaled = values / 257
    elif mode == "F" and low >= 0 and high <= 1:
        scaled = values * 255
    else:  # an unknown range: stretch the image's own
        scaled = (values - low) * (255 / (high - low)) if high > low else np.zeros_like(values)
    return np.rint(scaled).clip(0, 255).astype(np.uint8)
