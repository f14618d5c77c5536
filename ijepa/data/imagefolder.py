"""An ``ImageFolder`` that reports unreadable files clearly instead of crashing in a worker."""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from torchvision import datasets

BAD_IMAGE_POLICIES = ("error", "skip")


class RobustImageFolder(datasets.ImageFolder):
    """``torchvision.datasets.ImageFolder`` with a policy for corrupt or truncated image files.

    ``bad_images="error"`` raises ``ValueError`` naming the file (and the option); ``"skip"``
    warns once per file, counts it in ``skipped`` (per process), and returns the next readable
    image instead, so a batch never comes up short. An empty folder raises ``FileNotFoundError``
    naming ``data.root``.
    """

    def __init__(self, root: str, transform=None, bad_images: str = "error"):
        if bad_images not in BAD_IMAGE_POLICIES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGE_POLICIES}, got {bad_images!r}.")
        try:
            super().__init__(root, transform=transform, loader=_load_rgb)
        except FileNotFoundError as error:  # no class folders, or class folders without images
            raise FileNotFoundError(
                f"no images under data.root={root!r}: expected one sub-folder per class holding image files "
                f"({', '.join(sorted(datasets.folder.IMG_EXTENSIONS))}); torchvision said: {error}"
            ) from error
        self.bad_images = bad_images
        self.skipped: set[str] = set()

    def __getitem__(self, index: int):
        for offset in range(len(self)):
            position = (index + offset) % len(self)
            try:
                return super().__getitem__(position)
            except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as error:
                path = self.samples[position][0]
                if self.bad_images == "error":
                    raise ValueError(
                        f"unreadable image {path} ({type(error).__name__}: {error}); remove it, or set "
                        f"data.bad_images=skip to skip unreadable files with a warning."
                    ) from error
                if path not in self.skipped:
                    self.skipped.add(path)
                    warnings.warn(f"skipping unreadable image {path} ({error}); {len(self.skipped)} skipped so far.", stacklevel=2)
        raise ValueError(f"no readable image under {Path(self.root)}.")


def _load_rgb(path: str) -> Image.Image:
    # Decode fully here (not lazily in a transform) so a truncated file fails in this try block.
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
        return image.convert("RGB")
