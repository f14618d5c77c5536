"""Sharded data on ``litdata`` (Lightning's streaming data): ``ijepa prepare`` writes an image
folder or an STL-10 split into chunked shards, :class:`ShardsSource` reads them by index.

``ijepa prepare SRC DEST`` writes, under ``DEST``:

* ``train/`` (and ``val/`` when ``SRC`` has ``train/`` beside ``val/`` or ``test/``): litdata
  datasets whose items are ``{"image": the encoded file's bytes, "label": int}``. Image files are
  stored as they are (no re-encoding), so decoding gives the pixels the folder gives; STL-10's
  raw pixels are encoded losslessly as PNG. With ``--masks MASKS`` (image folders) items also
  hold ``"mask"``, the bytes of each image's index-PNG class mask, read from ``MASKS`` as
  :class:`~ijepa.data.ImageFolderSource` reads them (``MASKS/train/...`` for ``SRC/train/...``);
* ``ijepa_shards.json``, written last (a folder whose ``prepare`` did not finish has none): the
  class names in index order, where the images came from, each split's labels, so that the
  class-balanced hold-out needs no pass over the images, each split's CRC-32 of its litdata
  ``index.json`` and of every chunk (``chunk_crc32``: ``{file name: 8 hex digits}``, checked
  when a local source is set up), and, with masks, ``"masks": {"ignore_index": int}`` (the items
  are then dense, as the folder's with ``masks``).

:class:`ShardsSource` wraps each split as a map-style dataset over ``litdata.StreamingDataset``'s
random access: the project's samplers keep choosing the order and each DDP rank's share, and
augmentations and masks stay functions of ``(seed, epoch, index)``, so runs and resumes are
exact as for the other sources.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset, Subset

from ijepa.data.batch import IGNORE_INDEX
from ijepa.data.imagefolder import (
    BAD_IMAGE_POLICIES,
    UNKNOWN_COUNT,
    UNLABELLED,
    RobustImageFolder,
    check_mask_options,
    load_mask,
    load_rgb,
    to_rgb,
)
from ijepa.data.sources import DataSource, Splits, SplitSettings, check_fraction, holdout_split
from ijepa.data.stl10 import STL10

INDEX_FILE = "ijepa_shards.json"
FORMAT = "ijepa-shards"
VERSION = 1
STL10_SPLITS = ("train", "test", "unlabeled", "train+unlabeled")
INSTALL = "pip install -e '.[shards]'"
CHECKSUMS = "chunk_crc32"  # a split's {file name: CRC-32} in the index (zlib's: ~25 ms per 64 MB chunk)
_verified: set[tuple] = set()  # (path, size, mtime, crc32) found intact in this process: not hashed again
_noted: set[str] = set()  # roots of shards without checksums, noted once per process


def _litdata(what: str):
    # Imported on use: `litdata` is an optional extra, and every `ijepa` command imports this module.
    try:
        import litdata
    except ImportError:
        raise ImportError(f"{what} needs litdata, which is not installed: {INSTALL}") from None
    return litdata


def _is_url(root: str) -> bool:
    return "://" in root


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if _is_url(root) else os.path.join(root, name)


# --- writing --------------------------------------------------------------------------------
class _FileBytes:
    """``optimize``'s item function for image files: the file's bytes as stored, and its label.
    It must not raise: an exception in a litdata worker leaves ``optimize`` waiting forever."""

    def __init__(self, samples: list[tuple[str, int]], masks: list[Path] | None = None):
        self.samples = samples
        self.masks = masks

    def __call__(self, index: int) -> dict:
        path, label = self.samples[index]
        with open(path, "rb") as f:
            item = {"image": f.read(), "label": int(label)}
        if self.masks is not None:
            with open(self.masks[index], "rb") as f:
                item["mask"] = f.read()
        return item


def image_problem(path: str) -> str | None:
    """Why the image file at ``path`` cannot be trained on (a dangling link, no read permission,
    empty, not an image, truncated, a decompression bomb), or None: decoded as training decodes it."""
    try:
        load_rgb(path)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def bad_images(paths: list[str], num_workers: int) -> dict[str, str]:
    """``{path: problem}`` of the files among ``paths`` that :func:`image_problem` refuses."""
    if num_workers > 1 and len(paths) > 1:
        start = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        with multiprocessing.get_context(start).Pool(num_workers) as pool:
            problems = pool.map(image_problem, paths, chunksize=max(1, len(paths) // (16 * num_workers)))
    else:
        problems = [image_problem(path) for path in paths]
    return {path: problem for path, problem in zip(paths, problems) if problem is not None}


def _listed(problems: dict[str, str], most: int = 5) -> str:
    shown = "; ".join(f"{path} ({problem})" for path, problem in list(problems.items())[:most])
    return shown + (f"; and {len(problems) - most} more" if len(problems) > most else "")


class _PNGBytes:
    """``optimize``'s item function for raw pixels ``[N, H, W, 3]`` uint8: lossless PNG bytes."""

    def __init__(self, pixels: np.ndarray, labels: list[int]):
        self.pixels, self.labels = pixels, labels

    def __call__(self, index: int) -> dict:
        buffer = io.BytesIO()
        Image.fromarray(self.pixels[index]).save(buffer, format="PNG")
        return {"image": buffer.getvalue(), "label": int(self.labels[index])}


def folder_layout(
    root: Path, masks: str | Path | None = None
) -> tuple[list[str], dict[str, list[tuple[str, int]]], str, dict[str, list[Path]] | None]:
    """``(classes, {split: [(path, label)]}, description, {split: [mask path]} or None)`` of an
    image folder, listed and numbered exactly as :class:`ijepa.data.ImageFolderSource` does
    (sorted class folders; ``val/`` or ``test/`` numbered by ``train/``'s classes; loose images
    unlabelled), with each image's mask under ``masks`` when given (every one must exist)."""
    held_out = next((root / name for name in ("val", "test") if (root / name).is_dir()), None)
    has_train = (root / "train").is_dir()
    if held_out is not None and not has_train:
        raise ValueError(f"SRC={str(root)!r} has {held_out.name}/ but no train/ folder beside it.")

    def folder(path: Path, class_to_idx: dict | None = None) -> RobustImageFolder:
        mask_root = None if masks is None else str(Path(masks) / path.relative_to(root))
        return RobustImageFolder(str(path), class_to_idx=class_to_idx, masks=mask_root)

    train = folder(root / "train" if has_train else root)
    folders = {"train": train}
    layout = "train/"
    if held_out is not None:
        index = train.class_to_idx if len(train.classes) >= 2 else None
        folders["val"] = folder(held_out, index)
        layout = f"train/ + {held_out.name}/ (written as val)"
    elif not has_train:
        layout = "class folders" if train.classes else "loose images (unlabelled)"
    splits = {name: images.samples for name, images in folders.items()}
    mask_paths = None
    if masks is not None:
        mask_paths = {name: [images.mask_path(path) for path, _ in images.samples] for name, images in folders.items()}
        layout += f", masks {Path(masks).resolve()}"
    return list(train.classes), splits, f"image folder {root.resolve()} ({layout})", mask_paths


def stl10_layout(root: Path, split: str, val_split: str | None) -> tuple[list[str], dict[str, _PNGBytes], str]:
    """``(classes, {split: item function}, description)`` of STL-10 splits under ``root``."""

    def read(name: str) -> tuple[_PNGBytes, STL10]:
        try:
            data = STL10(str(root), split=name, download=False)
        except RuntimeError as error:  # torchvision's "not found or corrupted"
            raise FileNotFoundError(
                f"STL-10 under {root / 'stl10_binary'} is missing or truncated ({error})."
            ) from error
        pixels = np.ascontiguousarray(data.data.transpose(0, 2, 3, 1))  # as torchvision's STL10 hands them to PIL
        return _PNGBytes(pixels, [int(label) for label in data.labels]), data

    train, dataset = read(split)
    splits = {"train": train}
    if val_split is not None:
        splits["val"] = read(val_split)[0]
    labelled = any(label != UNLABELLED for items in splits.values() for label in items.labels)
    classes = list(dataset.classes) if labelled else []
    held = f" + {val_split} (written as val)" if val_split else ""
    return classes, splits, f"STL-10 {root.resolve()} split {split}{held}"


def prepare(
    src: str | Path,
    dest: str | Path,
    split: str | None = None,
    val_split: str | None = None,
    num_workers: int = 1,
    chunk_bytes: str = "64MB",
    masks: str | Path | None = None,
    ignore_index: int = IGNORE_INDEX,
    bad_images_policy: str = "error",
) -> dict:
    """Write ``src`` (an image folder, or a folder holding ``stl10_binary/``) into shards under
    ``dest`` (missing or empty); returns the index written to ``dest/ijepa_shards.json``.
    ``masks`` (image folders): the folder of each image's index-PNG class mask, stored beside it;
    ``ignore_index``: their value of ignored pixels (see :class:`ijepa.data.ImageFolderSource`).

    Every image of a folder is decoded first, as training decodes it: with ``bad_images_policy``
    ``error`` a file that cannot be (corrupt, empty, not an image, a dangling link, unreadable) is
    named and nothing is written; with ``skip`` such files are left out and listed in the index
    (``skipped``). A failure while writing removes what was written, so DEST is as it was."""
    litdata = _litdata("ijepa prepare")
    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise FileNotFoundError(
            f"SRC={str(src)!r} is not a directory: give an image folder or a folder holding stl10_binary/."
        )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"DEST={str(dest)!r} is not an empty folder: give a new or empty folder for the shards.")
    check_mask_options(None if masks is None else str(masks), ignore_index)
    problems: dict[str, str] = {}  # image files left out (bad_images_policy skip)
    if (src / "stl10_binary").is_dir():
        if masks is not None:
            raise ValueError("--masks reads an image folder's masks; STL-10 has none.")
        classes, functions, description = stl10_layout(src, split or "train+unlabeled", val_split)
        labels = {name: function.labels for name, function in functions.items()}
        sizes = {name: len(function.labels) for name, function in functions.items()}
    else:
        if split is not None or val_split is not None:
            raise ValueError("--split and --val-split choose STL-10 splits; an image folder's layout gives its splits.")
        if bad_images_policy not in BAD_IMAGE_POLICIES:
            raise ValueError(f"--bad-images must be one of {BAD_IMAGE_POLICIES}, got {bad_images_policy!r}.")
        classes, samples, description, mask_paths = folder_layout(src, masks)
        problems = bad_images([path for items in samples.values() for path, _ in items], num_workers)
        if problems and bad_images_policy == "error":
            raise ValueError(
                f"{len(problems)} file{'s' * (len(problems) > 1)} of SRC cannot be decoded as images: "
                f"{_listed(problems)}. Remove them, or pass --bad-images skip to leave them out; nothing was written."
            )
        if problems:
            for name in samples:
                kept = [i for i, (path, _) in enumerate(samples[name]) if path not in problems]
                samples[name] = [samples[name][i] for i in kept]
                if mask_paths is not None:
                    mask_paths[name] = [mask_paths[name][i] for i in kept]
            print(f"skipping {len(problems)} unreadable files: {_listed(problems)}", file=sys.stderr)
        functions = {
            name: _FileBytes(items, None if mask_paths is None else mask_paths[name]) for name, items in samples.items()
        }
        labels = {name: [label for _, label in items] for name, items in samples.items()}
        sizes = {name: len(items) for name, items in samples.items()}
    existed = dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    # fork: spawned workers would import torch again, ~10 s each before the first item.
    start = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    try:
        for name, function in functions.items():
            litdata.optimize(
                fn=function,
                inputs=list(range(sizes[name])),
                output_dir=str(dest / name),
                chunk_bytes=chunk_bytes,
                num_workers=num_workers,
                keep_data_ordered=True,  # each worker writes a contiguous run: shard index == source index
                reorder_files=False,
                start_method=start,
                verbose=False,
            )
        checksums = {name: split_checksums(dest / name) for name in functions}
    except BaseException:  # DEST as it was: a rerun must not find it "not empty"
        for written in list(dest.iterdir()) if existed else [dest]:
            shutil.rmtree(written, ignore_errors=True) if written.is_dir() else written.unlink(missing_ok=True)
        raise
    index = {
        "format": FORMAT,
        "version": VERSION,
        "source": description,
        "classes": classes,
        "splits": {
            name: {
                "size": sizes[name],
                "labels": labels[name] if len(classes) >= 2 else None,
                CHECKSUMS: checksums[name],
            }
            for name in functions
        },
    }
    if masks is not None:
        index["masks"] = {"ignore_index": ignore_index}
    if problems:
        index["skipped"] = problems
    partial = dest / f".{INDEX_FILE}.partial"
    partial.write_text(json.dumps(index))
    partial.replace(dest / INDEX_FILE)  # last, and atomic: its presence means the shards are whole
    return index


def chunk_bytes(text: str) -> str | int:
    """``--chunk-bytes``: a count of bytes, or one with a unit litdata reads (``64MB``, ``512kb``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?b?)\s*", text, flags=re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size > 0 (bytes, or with a unit: 64MB, 512kb)")
    return int(match.group(1)) if not match.group(2) and match.group(1).isdigit() else text.strip()


def file_crc32(path: str | Path) -> str:
    """The CRC-32 (zlib's) of the file at ``path``, as 8 hex digits."""
    value = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            value = zlib.crc32(block, value)
    return f"{value:08x}"


def _crc32s(paths: list[Path]) -> list[str]:
    """:func:`file_crc32` of each path, a few files at a time (zlib releases the GIL)."""
    workers = min(8, os.cpu_count() or 1, len(paths))
    if workers <= 1:
        return [file_crc32(path) for path in paths]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(file_crc32, paths))


def split_checksums(folder: Path) -> dict[str, str]:
    """``{file name: CRC-32}`` of a written split's litdata ``index.json`` and of every chunk it lists."""
    listed = json.loads((folder / "index.json").read_text())
    names = ["index.json", *(chunk["filename"] for chunk in listed.get("chunks", []))]
    return dict(zip(names, _crc32s([folder / name for name in names])))


def check_chunks(root: str, split: str, option: str = "data.source", checksums: dict[str, str] | None = None) -> None:
    """Every chunk a local split's litdata ``index.json`` lists exists with its recorded size (a
    deleted or cut chunk would otherwise fail mid-epoch as litdata's download timeout) and, with
    ``checksums`` (``{file name: CRC-32}`` that ``ijepa prepare`` recorded), holds what was
    written: a chunk changed in place would otherwise decode to wrong images, or fail as
    litdata's bare ``struct.error``. One line naming the file. A file found intact is not hashed
    again in this process while its size and modification time stay."""
    if _is_url(root):
        return  # remote: litdata fetches and checks each chunk as it comes
    folder = Path(root) / split
    try:
        listed = json.loads((folder / "index.json").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{option}.root={root!r}: {folder / 'index.json'} cannot be read ({type(error).__name__}: {error}); "
            "write the shards again with ijepa prepare."
        ) from None
    exact = listed.get("config", {}).get("compression") is None  # compressed chunks record their raw size
    for chunk in listed.get("chunks", []):
        path = folder / chunk["filename"]
        if not path.is_file():
            problem = "is missing"
        elif exact and path.stat().st_size != chunk["chunk_bytes"]:
            problem = f"holds {path.stat().st_size} bytes where index.json records {chunk['chunk_bytes']}"
        else:
            continue
        raise ValueError(
            f"{option}.root={root!r}: the chunk {path} {problem}; the shards were changed after ijepa prepare. "
            "Restore the file or write the shards again."
        )
    if checksums is None:
        return
    names = ["index.json", *(chunk["filename"] for chunk in listed.get("chunks", []))]
    unrecorded = [name for name in names if name not in checksums]
    if unrecorded:
        raise ValueError(
            f"{option}.root={root!r}: {folder / unrecorded[0]} is listed by index.json but has no checksum in "
            f"{INDEX_FILE}: the split was rewritten after ijepa prepare. Re-run `ijepa prepare` to write the shards again."
        )
    paths, keys = [], []
    for name in names:
        stat = (folder / name).stat()
        key = (str((folder / name).resolve()), stat.st_size, stat.st_mtime_ns, checksums[name])
        if key not in _verified:
            paths.append(folder / name)
            keys.append(key)
    for path, key, found in zip(paths, keys, _crc32s(paths)):
        if found != key[-1]:
            what = "its litdata index" if path.name == "index.json" else "the chunk"
            raise ValueError(
                f"{option}.root={root!r}: {what} {path} is corrupt: its CRC-32 is {found} where {INDEX_FILE} records "
                f"{key[-1]} (it changed after ijepa prepare wrote it). Restore the file or re-run `ijepa prepare` to write the "
                "shards again."
            )
        _verified.add(key)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ijepa prepare",
        description="Write an image folder (class sub-folders, loose images, or train/ + val/) or an STL-10 "
        "split into litdata shards, read by ijepa.data.ShardsSource.",
    )
    parser.add_argument("src", metavar="SRC", help="an image folder, or a folder holding stl10_binary/")
    parser.add_argument("dest", metavar="DEST", help="a new or empty folder for the shards")
    parser.add_argument(
        "--split", choices=STL10_SPLITS, default=None, help="STL-10: the split written (default train+unlabeled)"
    )
    parser.add_argument(
        "--val-split", choices=STL10_SPLITS, default=None, help="STL-10: a split written as val (e.g. test)"
    )
    parser.add_argument("--num-workers", type=int, default=1, help="processes writing shards (default 1)")
    parser.add_argument(
        "--bad-images",
        choices=BAD_IMAGE_POLICIES,
        default="error",
        help="image folders: a file that does not decode is refused, naming it (error, default), or left out and "
        "listed (skip)",
    )
    parser.add_argument(
        "--chunk-bytes", type=chunk_bytes, default="64MB", help="bytes per shard file: 64MB (default), 512kb, 1000000"
    )
    parser.add_argument(
        "--masks",
        default=None,
        help="image folders: a folder of index-PNG class masks mirroring SRC (same relative paths, .png), "
        "stored with the images",
    )
    parser.add_argument(
        "--ignore-index",
        type=int,
        default=IGNORE_INDEX,
        help=f"the masks' value of ignored pixels (default {IGNORE_INDEX})",
    )
    return parser


def main(argv: list[str] | None = None) -> dict:
    """The ``ijepa prepare`` command."""
    args = build_parser().parse_args(sys.argv[2:] if argv is None else argv)
    try:
        if args.num_workers < 1:
            raise ValueError(f"--num-workers must be >= 1, got {args.num_workers}.")
        index = prepare(
            args.src,
            args.dest,
            args.split,
            args.val_split,
            args.num_workers,
            args.chunk_bytes,
            masks=args.masks,
            ignore_index=args.ignore_index,
            bad_images_policy=args.bad_images,
        )
    except (ValueError, OSError, ImportError) as error:
        if os.environ.get("IJEPA_DEBUG"):
            raise
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    sizes = ", ".join(f"{name} {split['size']}" for name, split in index["splits"].items())
    print(f"wrote {sizes} images, {len(index['classes'])} classes, to {args.dest} ({index['source']})")
    return index


# --- reading --------------------------------------------------------------------------------
def read_index(root: str, option: str) -> dict:
    """The ``ijepa_shards.json`` of the shards at ``root`` (a folder or a URL litdata reads);
    ``option`` names ``root`` in errors."""
    hint = f"write shards with `ijepa prepare SRC {root}`"
    if _is_url(root):
        fs_provider = _litdata(f"{option}={root!r}").streaming.fs_provider
        with tempfile.TemporaryDirectory() as folder:
            local = os.path.join(folder, INDEX_FILE)
            try:
                fs_provider._get_fs_provider(root).download_file(_join(root, INDEX_FILE), local)
                text = Path(local).read_text()
            except Exception as error:  # each storage client raises its own
                raise FileNotFoundError(
                    f"{option}={root!r}: could not read {_join(root, INDEX_FILE)} ({type(error).__name__}: {error}); {hint}."
                ) from error
    else:
        if not Path(root).is_dir():
            raise FileNotFoundError(f"shard folder not found: {option}={root!r} is not a directory; {hint}.")
        if not (Path(root) / INDEX_FILE).is_file():
            raise ValueError(
                f"{option}={root!r} is not a folder of ijepa shards: it has no {INDEX_FILE} (written last by "
                f"`ijepa prepare`, so an unfinished one has none either); {hint}."
            )
        text = (Path(root) / INDEX_FILE).read_text()
    try:
        index = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{option}={root!r}: {INDEX_FILE} is not JSON ({error}); {hint}.") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION:
        raise ValueError(f"{option}={root!r}: {INDEX_FILE} is not an index of {FORMAT} version {VERSION}; {hint}.")
    return index


def decode(data: bytes | memoryview, name: str) -> Image.Image:
    """Stored image bytes -> 8-bit RGB, as the image folder reads the same file."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return to_rgb(image, name)


class ShardImages(Dataset):
    """One written split as a map-style dataset: ``(transform(image), label)`` by index, in the
    order of the source. The ``StreamingDataset`` opens on first access in each process, so the
    dataset pickles small into DataLoader workers. ``masks`` (``{"ignore_index": int}``, shards
    written with ``--masks``): items are ``transform(image, {"label", "mask", "count": -1})``, as
    an image folder's with ``masks``."""

    def __init__(
        self,
        url: str,
        labels: list[int],
        classes: list[str],
        transform: Callable | None = None,
        cache_dir: str | None = None,
        masks: dict | None = None,
        bad_images: str = "error",
        source: str = "an unknown source",
    ):
        self.url, self.targets, self.classes = url, labels, classes
        self.bad_images, self.source, self.skipped = bad_images, source, set()
        self.class_to_idx = {name: i for i, name in enumerate(classes)}
        self.transform, self.cache_dir = transform, cache_dir
        self.masks = masks
        self._stream = None

    def __len__(self) -> int:
        return len(self.targets)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_stream": None}

    def stream(self):
        if self._stream is None:
            litdata = _litdata(f"reading shards at {self.url}")
            self._stream = litdata.StreamingDataset(self.url, cache_dir=self.cache_dir)
            if len(self._stream) != len(self.targets):
                raise ValueError(
                    f"{self.url} holds {len(self._stream)} images but its {INDEX_FILE} lists {len(self.targets)}: "
                    f"the shards changed after `ijepa prepare`; write them again."
                )
        return self._stream

    def _chunk_of(self, position: int) -> str:
        """`` (chunk <path>)``: the chunk holding item ``position`` by the split's ``index.json``
        (items in the order of its chunks), or ``""`` where that cannot be read (a URL)."""
        try:
            listed = json.loads((Path(self.url) / "index.json").read_text())["chunks"]
        except (OSError, ValueError, KeyError, TypeError):
            return ""
        end = 0
        for chunk in listed:
            end += int(chunk.get("chunk_size", 0))
            if position < end:
                return f" (chunk {Path(self.url) / chunk['filename']})"
        return ""

    def __getitem__(self, index: int):
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images.")
        index = int(index) % len(self)
        stream = self.stream()
        for offset in range(len(self)):  # skip: the next decodable item, as RobustImageFolder
            position = (index + offset) % len(self)
            try:
                item = stream[position]
            except Exception as error:  # a corrupt chunk: litdata's struct.error, RuntimeError, MemoryError, ...
                raise ValueError(
                    f"{self.url} item {position}{self._chunk_of(position)} cannot be read by litdata "
                    f"({type(error).__name__}: {error}): the shards were corrupted or changed after ijepa prepare; "
                    "restore them or re-run `ijepa prepare` to write them again."
                ) from error
            try:
                image = decode(item["image"], f"{self.url} item {position}")
                break
            except (OSError, SyntaxError, ValueError) as error:
                problem = (
                    f"{self.url} item {position} (of {self.source}) cannot be decoded ({type(error).__name__}: {error})"
                )
                if self.bad_images == "error":
                    raise ValueError(
                        f"{problem}: the item changed after ijepa prepare wrote it (shards whose index records "
                        "chunk checksums are checked at setup), or an older ijepa prepare stored it unchecked; write "
                        "the shards again, or set data.source.bad_images=skip to skip such items with a warning."
                    ) from None
                if position not in self.skipped:
                    self.skipped.add(position)
                    warnings.warn(f"skipping {problem}; {len(self.skipped)} skipped so far.", stacklevel=2)
        index = position
        if self.masks is not None:
            name = f"{self.url} item {index}"
            mask = load_mask(f"{name} mask", name, image.size, self.masks["ignore_index"], data=item["mask"])
            target = {"label": int(item["label"]), "mask": mask, "count": UNKNOWN_COUNT}
            return self.transform(image, target) if self.transform is not None else (image, target)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(item["label"])


class ShardsSource(DataSource):
    """Images from shards written by ``ijepa prepare`` (:mod:`ijepa.data.shards`), in a local
    folder or at any URL litdata reads (``s3://``, ``gs://``, ``azure://``, ...). Split like
    :class:`ImageFolderSource`: with a written ``val`` split, that is the probes' queries and
    ``val/loss``; otherwise a deterministic, class-balanced ``holdout_fraction`` of the labelled
    images is held out for probing and not pretrained on (unlabelled images, as STL-10's, are
    always pretrained on). Unlabelled shards pretrain on everything. Shards written with
    ``--masks`` give dense items ``(image, {"label", "mask", "count"})``, as the image folder
    with ``masks`` does (batches :class:`~ijepa.data.batch.DenseBatch`).

    Args:
        root: the folder or URL that ``ijepa prepare`` wrote (holding ``ijepa_shards.json``).
        holdout_fraction: share of each class held out for probing when there is no val split
            (unlabelled shards: the share of the training images that val/loss reuses).
        cache_dir: where litdata keeps chunks downloaded from a URL (null: litdata's default).
        bad_images: an item that does not decode (shards written before ``ijepa prepare`` checked
            every image): ``error`` (raise, naming it and the shards' source) or ``skip`` (warn, take
            the next item).
    """

    def __init__(
        self,
        root: str = "shards",
        holdout_fraction: float = 0.2,
        cache_dir: str | None = None,
        bad_images: str = "error",
    ):
        check_fraction(holdout_fraction, "holdout_fraction")
        if bad_images not in BAD_IMAGE_POLICIES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGE_POLICIES}, got {bad_images!r}.")
        self.bad_images = bad_images
        self.root = root
        self.holdout_fraction = holdout_fraction
        self.cache_dir = cache_dir

    def index(self, option: str = "data.source") -> dict:
        """The shards' ``ijepa_shards.json`` (``option`` names this source in errors)."""
        return read_index(self.root, f"{option}.root")

    def check(self, option: str = "data.source") -> None:
        if not _is_url(self.root):  # the index alone: a missing folder in seconds, before any launch
            self.index(option)

    def check_probe_source(self, probe: DataSource) -> None:
        """Refuse labelled probe shards numbered by another class index than these."""
        if not isinstance(probe, ShardsSource):
            return
        ours, theirs = self.index()["classes"], probe.index("data.probe_source")["classes"]
        if len(ours) >= 2 and len(theirs) >= 2 and ours != theirs:
            raise ValueError(
                f"data.probe_source.root={probe.root!r} was written with another class index than "
                f"data.source.root={self.root!r}: {theirs} against {ours}. Write both from folders with the same class "
                f"folders (or the probe shards from the pretraining data), so that a label means one class."
            )

    def splits(self, settings: SplitSettings) -> Splits:
        index = self.index(settings.option)
        classes, written = index["classes"], index["splits"]
        for name in written:
            check_chunks(self.root, name, settings.option, written[name].get(CHECKSUMS))
        if not _is_url(self.root) and any(CHECKSUMS not in split for split in written.values()):
            if self.root not in _noted:
                _noted.add(self.root)
                warnings.warn(
                    f"{settings.option}.root={self.root!r}: {INDEX_FILE} records no chunk checksums (written before "
                    "ijepa prepare recorded them): chunks are checked for their size only; write the shards again to "
                    "have their contents checked too.",
                    stacklevel=2,
                )
        num_classes = len(classes)

        def labels(name: str) -> list[int]:
            stored = written[name]["labels"]
            return [UNLABELLED] * written[name]["size"] if stored is None else stored

        def make(name: str, transform: Callable) -> ShardImages:
            return ShardImages(
                _join(self.root, name),
                labels(name),
                classes,
                transform,
                self.cache_dir,
                index.get("masks"),
                self.bad_images,
                index["source"],
            )

        train_labels = labels("train")
        pretrain_set = make("train", settings.train_transform)
        eval_set = make("train", settings.eval_transform)
        labelled = [i for i, label in enumerate(train_labels) if label != UNLABELLED]
        if "val" in written:
            held_set = make("val", settings.eval_transform)
            bank = eval_set if len(labelled) == len(eval_set) or num_classes < 2 else Subset(eval_set, labelled)
            return Splits(pretrain_set, held_set, bank, held_set, num_classes)
        if num_classes < 2:
            # As an unlabelled image folder: pretrain on everything; val/loss reuses a share.
            val_idx = holdout_split([0] * len(eval_set), self.holdout_fraction)[1] or [0]
            val_set = Subset(eval_set, val_idx)
            return Splits(pretrain_set, val_set, eval_set, val_set, num_classes)
        kept, held = holdout_split([train_labels[i] for i in labelled], self.holdout_fraction)
        kept, held = [labelled[i] for i in kept], [labelled[i] for i in held]
        if not kept or not held:
            raise ValueError(
                f"{settings.option}.root={self.root!r} has too few labelled images to hold out "
                f"holdout_fraction={self.holdout_fraction} of each class for probing."
            )
        held_set = set(held)
        pretrain_idx = [i for i in range(len(train_labels)) if i not in held_set]  # unlabelled ones too
        return Splits(
            Subset(pretrain_set, pretrain_idx),
            Subset(eval_set, held),
            Subset(eval_set, kept),
            Subset(eval_set, held),
            num_classes,
        )
