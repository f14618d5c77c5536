"""Images/s of one DataLoader worker reading litdata shards against reading the same JPEG folder.

    python -m ijepa.benchmark.shards [--images 2000] [--size 96]

Writes ``--images`` generated shapes (:mod:`ijepa.data.shapes`) as JPEG files into a temporary
class folder, writes that folder into shards (``ijepa prepare``), then times full passes of a
``DataLoader`` with one worker over each, decode and the evaluation transform (resize, centre
crop, normalise) included, in interleaved rounds. Both read the same bytes (shards keep the
files as they are), so the difference is how they are read: one file per image against
chunked shards. Figures are for comparison within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image
from torch.utils.data import DataLoader

from ijepa.data.datamodule import IJEPADataModule, labeled_collate
from ijepa.data.imagefolder import RobustImageFolder
from ijepa.data.shapes import CLASSES, ShapesDataset
from ijepa.data.shards import ShardImages, prepare


def write_jpeg_folder(root: Path, count: int, size: int) -> None:
    """``count`` generated shapes as JPEG files, one sub-folder per class."""
    images = ShapesDataset(count, size, background="noisy")
    for index in range(count):
        image, label = images[index]
        folder = root / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{index:06d}.jpg", quality=90)


def images_per_s(dataset, batch_size: int) -> float:
    """One full pass of a one-worker loader (its start included), in images per second."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=1, collate_fn=labeled_collate)
    start = time.perf_counter()
    count = sum(len(batch) for batch in loader)
    return count / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder, shards = Path(tmp) / "jpeg", Path(tmp) / "shards"
        write_jpeg_folder(folder, args.images, args.size)
        index = prepare(folder, shards, num_workers=1, chunk_bytes=args.chunk_bytes)
        # patch_size 1: any image size is whole patches; the masks are not used here
        transform = IJEPADataModule(image_size=args.size, patch_size=1).eval_transform()
        readers = {
            "folder": RobustImageFolder(str(folder), transform=transform),
            "shards": ShardImages(
                str(shards / "train"), index["splits"]["train"]["labels"], index["classes"], transform
            ),
        }
        times = {name: [] for name in readers}
        for _ in range(args.rounds):
            for name, dataset in readers.items():
                times[name].append(images_per_s(dataset, args.batch_size))
    result = {"images": args.images, "size": args.size, "batch_size": args.batch_size, "rounds": args.rounds}
    for name, values in times.items():
        result[f"images_per_s_{name}"] = statistics.median(values)
    result["speedup"] = result["images_per_s_shards"] / result["images_per_s_folder"]
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=96, help="image side in pixels (also the transform's)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="full passes per reader, interleaved")
    parser.add_argument("--chunk-bytes", default="64MB")
    result = run(parser.parse_args(argv))
    print(
        f"one worker, {result['images']} JPEGs of {result['size']} px, decode + eval transform: "
        f"folder {result['images_per_s_folder']:.0f} images/s, shards {result['images_per_s_shards']:.0f} images/s "
        f"({result['speedup']:.2f}x)"
    )
    print("BENCHMARK " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
