"""Data faults from the CLI fault sweep: one class index for every split, every PIL image
mode read as 8-bit RGB, unlabelled folders, a batch larger than the data, folders with link
loops, and images too large to decode. The CLI tests run ``ijepa fit`` in-process for a few
steps of a tiny model."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import struct
import time
import warnings
import zlib
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import yaml
from conftest import TINY_CONFIG, tiny_datamodule
from helpers import write_video
from PIL import Image

from ijepa.cli import build_cli
from ijepa.data.datamodule import IJEPADataModule
from ijepa.data.imagefolder import RobustImageFolder, load_rgb, to_rgb
from ijepa.data.sources import ImageFolderSource, VideoFolderSource
from ijepa.data.video_folder import find_videos
from ijepa.masks import SpatioTemporalMasks

TINY = TINY_CONFIG
PROBES = [
    {"class_path": "ijepa.callbacks.KNNProbe"},
    {"class_path": "ijepa.callbacks.LinearProbe", "init_args": {"max_iter": 20}},
]
SKIP_WARNING = "skipped: the data is unlabelled"


# --- helpers --------------------------------------------------------------------------------
def write_images(folder: Path, count: int, rgb: tuple[int, int, int], size: int = 40) -> None:
    """``count`` uniform ``rgb`` PNGs in ``folder``, each a shade apart in blue."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (size, size), (rgb[0], rgb[1], (rgb[2] + 3 * i) % 256)).save(folder / f"img_{i:02d}.png")


def run_fit(tmp_path: Path, data: dict, callbacks: list[dict], max_steps: int):
    """``ijepa fit`` on ``tests/tiny.yaml`` with ``data`` overrides and ``callbacks``, logging to a
    CSV file; returns the CLI (its trainer and datamodule)."""
    config = yaml.safe_load(TINY.read_text())
    config["trainer"].update(
        max_steps=max_steps,
        default_root_dir=str(tmp_path),
        enable_checkpointing=False,
        callbacks=[{"class_path": "ijepa.callbacks.EMATargetUpdate"}, *callbacks],
        logger={"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}},
    )
    config["data"].update(data)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with mock.patch("sys.argv", ["ijepa"]):
        return build_cli(["fit", "--config", str(path)], run=True)


def folder_source(root: Path) -> dict:
    """The YAML of an image-folder source at ``root``."""
    return {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(root)}}


def logged_metrics(cli) -> set[str]:
    """Every metric name written to the run's CSV log (including those logged outside the loops)."""
    with open(Path(cli.trainer.logger.log_dir) / "metrics.csv") as f:
        return {name for row in csv.DictReader(f) for name, value in row.items() if value}


# --- 1. one class index for every split ------------------------------------------------------
def two_class_folder(root: Path) -> Path:
    """``train/{circle,square}`` and ``val/{square}``: red and blue, perfectly separable."""
    write_images(root / "train" / "circle", 8, (220, 20, 0))
    write_images(root / "train" / "square", 8, (0, 20, 220))
    write_images(root / "val" / "square", 4, (0, 20, 220))
    return root


def test_val_folder_uses_train_class_index(tmp_path):
    data = tiny_datamodule(source=ImageFolderSource(root=str(two_class_folder(tmp_path))), batch_size=4)
    data.setup("fit")
    assert data.num_classes == 2
    square = data.split("probe_train").class_to_idx["square"]
    assert square == 1
    assert data.split("probe_test").targets == [square] * 4
    assert data.split("val").class_to_idx == {"circle": 0, "square": 1}


def test_probes_score_a_val_folder_with_fewer_classes_through_the_cli(tmp_path):
    """val/ holds only ``square``: numbered by its own folder it was class 0 (train's ``circle``),
    so both probes scored 0.0 on images they classify perfectly."""
    cli = run_fit(
        tmp_path,
        {"source": folder_source(two_class_folder(tmp_path / "data")), "batch_size": 8},
        PROBES,
        max_steps=2,
    )
    metrics = cli.trainer.callback_metrics
    assert float(metrics["val/knn_top1"]) == 1.0
    assert float(metrics["val/linear_top1"]) == 1.0


def test_val_class_missing_from_train_is_an_error_naming_class_and_folders(tmp_path):
    root = two_class_folder(tmp_path)
    write_images(root / "val" / "triangle", 2, (0, 200, 0))
    data = tiny_datamodule(source=ImageFolderSource(root=str(root)))
    with pytest.raises(
        ValueError,
        match=r"\['triangle'\] under .*val are not among the training split's classes "
        r"\['circle', 'square'\].*train/",
    ):
        data.setup("fit")


def test_video_val_folder_uses_train_class_index(tmp_path):
    pytest.importorskip("av", reason="the videofolder dataset needs the 'video' extra")
    for split, names in (("train", ("a", "b")), ("val", ("b",))):
        for name in names:
            (tmp_path / split / name).mkdir(parents=True)
            write_video(tmp_path / split / name / "0.mp4", 8, 10, size=16)
    data = IJEPADataModule(
        source=VideoFolderSource(root=str(tmp_path)),
        num_frames=4,
        image_size=16,
        patch_size=4,
        batch_size=1,
        num_workers=0,
        masks=SpatioTemporalMasks(target_scale=(0.1, 0.15)),
    )
    data.setup("fit")
    assert data.num_classes == 2 and data.split("probe_test").targets == [1]
    (tmp_path / "val" / "c").mkdir()
    write_video(tmp_path / "val" / "c" / "0.mp4", 8, 10, size=16)
    with pytest.raises(ValueError, match=r"\['c'\] under .*val are not among"):
        IJEPADataModule(
            source=VideoFolderSource(root=str(tmp_path)), num_frames=4, image_size=16, patch_size=4, num_workers=0
        ).setup("fit")


# --- 2. image modes ---------------------------------------------------------------------------
GRADIENT16 = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0..65520


def rgb_array(image: Image.Image) -> np.ndarray:
    assert image.mode == "RGB"
    return np.asarray(image)


def test_16_bit_grayscale_png_keeps_its_gradient(tmp_path):
    """Converted by PIL, a 16-bit PNG clips at 255: 99.6% of this gradient came out white."""
    path = tmp_path / "depth.png"
    Image.fromarray(GRADIENT16).save(path)
    assert Image.open(path).mode == "I;16"
    pixels = rgb_array(load_rgb(str(path)))
    expected = np.rint(GRADIENT16 / 257).astype(np.uint8)
    assert len(np.unique(pixels)) > 200
    for channel in range(3):
        np.testing.assert_array_equal(pixels[..., channel], expected)


@pytest.mark.parametrize("dtype", [">u2", "<u2"])
def test_16_bit_modes_of_either_byte_order_map_0_65535_onto_0_255(dtype):
    image = Image.fromarray(GRADIENT16.astype(dtype))
    assert image.mode in ("I;16", "I;16B")
    np.testing.assert_array_equal(rgb_array(to_rgb(image))[..., 1], np.rint(GRADIENT16 / 257).astype(np.uint8))


def test_32_bit_integer_image_in_16_bit_range_is_divided_by_257_else_stretched(tmp_path):
    path = tmp_path / "counts.tif"
    Image.fromarray(GRADIENT16.astype(np.int32)).save(path)
    assert Image.open(path).mode == "I"
    np.testing.assert_array_equal(rgb_array(load_rgb(str(path)))[..., 0], np.rint(GRADIENT16 / 257).astype(np.uint8))
    wide = Image.fromarray(np.array([[-1000, 0], [500, 99000]], dtype=np.int32))
    assert rgb_array(to_rgb(wide))[..., 0].tolist() == [[0, 3], [4, 255]]  # (v + 1000) * 255 / 100000


def test_float_image_in_unit_range_is_scaled_by_255_else_stretched(tmp_path):
    path = tmp_path / "unit.tif"
    Image.fromarray(np.array([[0.0, 0.5], [0.25, 1.0]], dtype=np.float32)).save(path)
    assert Image.open(path).mode == "F"
    assert rgb_array(load_rgb(str(path)))[..., 2].tolist() == [[0, 128], [64, 255]]
    kelvin = Image.fromarray(np.array([[290.0, 300.0], [295.0, 310.0]], dtype=np.float32))
    assert rgb_array(to_rgb(kelvin))[..., 2].tolist() == [[0, 128], [64, 255]]


def test_float_image_with_nan_is_refused_naming_file_and_mode(tmp_path):
    (tmp_path / "a").mkdir()
    path = tmp_path / "a" / "nan.tif"
    Image.fromarray(np.array([[0.0, np.nan]], dtype=np.float32)).save(path)
    with pytest.raises(ValueError, match=rf"image mode 'F' of {path} holds NaN"):
        load_rgb(str(path))
    with pytest.raises(ValueError, match=rf"unreadable image {path} .*mode 'F'"):
        RobustImageFolder(str(tmp_path))[0]


def test_palette_with_transparency_is_composited_over_white(tmp_path):
    path = tmp_path / "icon.png"
    image = Image.new("P", (2, 1))
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    image.putpixel((1, 0), 1)
    image.info["transparency"] = 0  # palette entry 0 (red) is transparent
    image.save(path)
    assert rgb_array(load_rgb(str(path))).tolist() == [[[255, 255, 255], [0, 0, 255]]]
    opaque = Image.new("P", (1, 1))
    opaque.putpalette([10, 200, 30] + [0] * 765)
    assert rgb_array(to_rgb(opaque)).tolist() == [[[10, 200, 30]]]


@pytest.mark.parametrize(
    "mode, colour, expected",
    [
        ("LA", (100, 255), (100, 100, 100)),
        ("LA", (0, 0), (255, 255, 255)),
        ("LA", (0, 128), (127, 127, 127)),
        ("RGBA", (0, 0, 255, 0), (255, 255, 255)),
        ("RGBA", (10, 20, 30, 255), (10, 20, 30)),
    ],
)
def test_alpha_is_composited_over_white(tmp_path, mode, colour, expected):
    path = tmp_path / "alpha.png"
    Image.new(mode, (2, 2), colour).save(path)
    assert tuple(rgb_array(load_rgb(str(path)))[0, 0]) == expected


@pytest.mark.parametrize("suffix", ["jpg", "tif"])
def test_cmyk_reads_as_rgb(tmp_path, suffix):
    path = tmp_path / f"print.{suffix}"
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(path)  # no cyan, full magenta and yellow: red
    assert Image.open(path).mode == "CMYK"
    red, green, blue = rgb_array(load_rgb(str(path)))[4, 4].astype(int)
    assert red > 240 and green < 15 and blue < 15


@pytest.mark.parametrize(
    "mode, value, expected",
    [
        ("1", 1, (255, 255, 255)),
        ("L", 77, (77, 77, 77)),
        ("YCbCr", (128, 128, 128), (128, 128, 128)),
    ],
)
def test_plain_modes_read_as_rgb(mode, value, expected):
    assert tuple(rgb_array(to_rgb(Image.new(mode, (2, 2), value)))[1, 1]) == expected


def test_an_image_folder_of_mixed_modes_loads_every_image(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    Image.fromarray(GRADIENT16).save(folder / "a16.png")
    Image.new("LA", (8, 8), (50, 255)).save(folder / "b_la.png")
    Image.new("CMYK", (8, 8), (0, 0, 0, 0)).save(folder / "c_cmyk.jpg")
    Image.new("1", (8, 8), 0).save(folder / "d_bits.png")
    images = [image for image, _ in RobustImageFolder(str(tmp_path))]  # iteration ends: IndexError past the end
    assert [image.mode for image in images] == ["RGB"] * 4
    assert len(np.unique(np.asarray(images[0]))) > 200  # not the all-white 16-bit image


# --- 3. unlabelled data -----------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["loose", "one_class"])
def test_unlabelled_folder_pretrains_on_every_image_and_probes_skip_with_one_warning(tmp_path, layout):
    """Loose images (or a single class folder) crashed at step 0 in the probes' torchmetrics; with
    the probes removed, 20% of the images were held out and never used."""
    root = tmp_path / "data"
    write_images(root if layout == "loose" else root / "only", 24, (30, 140, 90))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = run_fit(
            tmp_path,
            {"source": folder_source(root), "batch_size": 8},
            [*PROBES, {"class_path": "ijepa.callbacks.CollapseMonitor"}],
            max_steps=4,
        )
    data = cli.datamodule
    assert cli.trainer.global_step == 4
    assert data.num_classes == (0 if layout == "loose" else 1)
    assert len(data.split("pretrain")) == 24
    skips = [str(w.message) for w in caught if SKIP_WARNING in str(w.message)]
    assert len(skips) == 1 and "KNNProbe, LinearProbe" in skips[0] and "data.probe_source" in skips[0], skips
    logged = logged_metrics(cli)
    assert not any("top1" in name for name in logged), logged
    assert {"val/loss", "val/rankme"} <= logged


def test_unlabelled_val_reuses_a_spread_share_of_the_training_images(tmp_path):
    write_images(tmp_path, 20, (10, 10, 10))
    data = tiny_datamodule(source=ImageFolderSource(root=str(tmp_path), holdout_fraction=0.2), batch_size=4)
    data.setup("fit")
    pretrain, val = data.split("pretrain"), data.split("val")
    assert len(pretrain) == 20 and pretrain.targets == [-1] * 20
    assert list(val.indices) == [4, 9, 14, 19]
    assert {val.dataset.samples[i][0] for i in val.indices} <= {path for path, _ in pretrain.samples}
    assert sum(batch.images.size(0) for batch in data.train_dataloader()) == 20


def test_probe_source_gives_the_probes_a_labelled_folder(tmp_path):
    root = tmp_path / "unlabelled"
    write_images(root, 16, (90, 90, 90))
    probe_root = two_class_folder(tmp_path / "labelled")
    cli = run_fit(
        tmp_path,
        {"source": folder_source(root), "probe_source": folder_source(probe_root), "batch_size": 8},
        PROBES,
        max_steps=2,
    )
    data = cli.datamodule
    assert len(data.split("pretrain")) == 16 and data.num_classes == 2
    assert len(data.split("probe_train")) == 16 and data.split("probe_test").targets == [1] * 4
    assert float(cli.trainer.callback_metrics["val/knn_top1"]) == 1.0


def test_unlabelled_probe_source_is_an_error_naming_the_option(tmp_path):
    write_images(tmp_path / "loose", 4, (0, 0, 0))
    data = tiny_datamodule(train_size=8, val_size=4, probe_source=ImageFolderSource(root=str(tmp_path / "loose")))
    with pytest.raises(ValueError, match=r"data.probe_source=ImageFolderSource\(root=.* at least two classes, got 0"):
        data.setup("fit")


def test_loose_videos_are_unlabelled(tmp_path):
    pytest.importorskip("av", reason="the videofolder dataset needs the 'video' extra")
    for k in range(3):
        write_video(tmp_path / f"{k}.mp4", 8, 10, size=16)
    data = IJEPADataModule(
        source=VideoFolderSource(root=str(tmp_path)),
        num_frames=4,
        image_size=16,
        patch_size=4,
        batch_size=1,
        num_workers=0,
        masks=SpatioTemporalMasks(target_scale=(0.1, 0.15)),
    )
    data.setup("fit")
    assert data.num_classes == 0 and len(data.split("pretrain")) == 3 and data.split("pretrain").targets == [-1] * 3


# --- 4. a batch larger than the data ------------------------------------------------------------
def test_batch_larger_than_the_dataset_is_an_error_naming_data_batch_size(tmp_path):
    """drop_last=True left no batch at all: fit exited 0 having trained nothing."""
    with pytest.raises(
        ValueError,
        match=r"data.batch_size=32 is larger than the 20 training images per device "
        r"\(20 in the pretrain split over 1 device\(s\)\).*1\.\.20",
    ):
        run_fit(
            tmp_path,
            {"source": {"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 20}}, "batch_size": 32},
            [],
            max_steps=2,
        )


def test_batch_size_is_checked_against_each_devices_share():
    data = tiny_datamodule(train_size=21, val_size=4, batch_size=12)
    data.trainer = SimpleNamespace(world_size=2)  # 11 images per rank (DistributedSampler pads 21 to 22)
    with pytest.raises(
        ValueError,
        match=r"data.batch_size=12 .* 11 training images per device \(21 in the pretrain "
        r"split over 2 device\(s\)\).*1\.\.11",
    ):
        data.setup("fit")
    data.hparams.batch_size = 11
    data.setup("fit")
    data.setup("validate")  # only fit trains


# --- 5. folders that cannot loop ----------------------------------------------------------------
LINK_WARNING = "not following"


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail with ``TimeoutError`` after ``seconds`` (where SIGALRM exists), so that a walk that
    would never end fails the test instead of hanging the suite."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(*_):
        raise TimeoutError(f"still walking the folder after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def folder_data(root: Path, **source) -> IJEPADataModule:
    return tiny_datamodule(source=ImageFolderSource(root=str(root), **source), batch_size=4)


def every_sample(data: IJEPADataModule) -> list[tuple[str, int]]:
    """The ``(path, label)`` of every image the fit splits hold (pretrain and held out)."""
    pretrain, held_out = data.split("pretrain"), data.split("probe_test")
    return [pretrain.dataset.samples[i] for i in pretrain.indices] + [
        held_out.dataset.samples[i] for i in held_out.indices
    ]


def test_symlink_loops_in_an_image_folder_give_each_image_once_with_its_class_and_a_warning(tmp_path):
    """``circle/loop -> ..`` turned 40 images into 18,040 samples, 91% mislabelled; with a second
    loop per level the walk never ended."""
    root = tmp_path / "data"
    write_images(root / "circle", 12, (220, 20, 0))
    write_images(root / "circle" / "more", 8, (220, 20, 0))
    write_images(root / "square", 20, (0, 20, 220))
    loops = {
        "circle/loop": "..",
        "circle/again": ".",
        "circle/more/up": "../..",
        "circle/more/back": "..",
        "square/loop": "..",
        "square/self": ".",
    }
    for link, target in loops.items():
        os.symlink(target, root / link, target_is_directory=True)
    start = time.perf_counter()
    with deadline(30), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = folder_data(root)
        data.setup("fit")
    assert time.perf_counter() - start < 10
    samples = every_sample(data)
    assert len(samples) == 40 and len({path for path, _ in samples}) == 40
    index = data.split("pretrain").dataset.class_to_idx
    assert index == {"circle": 0, "square": 1}
    assert all(label == index[Path(path).relative_to(root).parts[0]] for path, label in samples)
    assert all(Path(path).resolve() == Path(path) for path, _ in samples)  # never read through a link
    messages = [str(w.message) for w in caught if LINK_WARNING in str(w.message)]
    assert messages, [str(w.message) for w in caught]
    assert messages[0].startswith(f"not following 6 directory link(s) under {root}"), messages[0]
    for link, target in loops.items():
        assert f"{link} -> {target}" in messages[0], messages[0]


def test_a_directory_link_to_a_folder_outside_the_root_is_read_once(tmp_path):
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    write_images(root / "circle", 10, (220, 20, 0))
    write_images(root / "square", 10, (0, 20, 220))
    write_images(elsewhere / "circles", 10, (220, 20, 0))
    os.symlink(elsewhere / "circles", root / "circle" / "stored", target_is_directory=True)
    os.symlink(elsewhere / "circles", root / "circle" / "stored_again", target_is_directory=True)
    os.symlink("..", elsewhere / "circles" / "up", target_is_directory=True)  # a loop outside the root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = folder_data(root)
        data.setup("fit")
    samples = every_sample(data)
    assert len(samples) == 30 and len({path for path, _ in samples}) == 30
    linked = sorted(path for path, _ in samples if "stored" in path)
    assert linked == [str(root / "circle" / "stored" / f"img_{i:02d}.png") for i in range(10)]
    assert {label for path, label in samples if "circle" in path} == {0}
    messages = [str(w.message) for w in caught if LINK_WARNING in str(w.message)]
    assert messages and f"circle/stored_again -> {elsewhere / 'circles'}" in messages[0], messages
    assert "circle/stored/up -> .." in messages[0], messages


def test_symlink_loops_in_a_video_folder_give_each_video_once(tmp_path):
    pytest.importorskip("av", reason="the videofolder dataset needs the 'video' extra")
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        write_video(root / name / "0.mp4", 4, 10, size=16)
        os.symlink("..", root / name / "loop", target_is_directory=True)
        os.symlink(".", root / name / "self", target_is_directory=True)
    elsewhere.mkdir()
    write_video(elsewhere / "1.mp4", 4, 10, size=16)
    os.symlink(elsewhere, root / "b" / "stored", target_is_directory=True)
    with deadline(30), pytest.warns(UserWarning, match=rf"not following 4 directory link\(s\) under {root}"):
        samples, _, _ = find_videos(root)
    assert samples == [(root / "a" / "0.mp4", 0), (root / "b" / "0.mp4", 1), (root / "b" / "stored" / "1.mp4", 1)]


# --- 6. images too large to decode ------------------------------------------------------------------
def declare_size(path: Path, width: int, height: int) -> None:
    """Rewrite the PNG at ``path`` to declare ``width x height`` in its header (a decompression
    bomb as PIL sees it: the size is read before any pixel)."""
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack(">II", width, height)  # IHDR's data starts after the 8-byte signature, length, type
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))


def bomb_folder(root: Path, kind: str, monkeypatch) -> tuple[Path, int, int]:
    """Two classes of 40x40 images, one of which PIL refuses as too large: its header declares
    100,000 x 100,000 pixels (``kind="header"``, past twice PIL's limit, where PIL raises), or it
    is 64x64 against a limit lowered to 3,000 pixels (``kind="limit"``, between the limit and twice
    it, where PIL only warns and decodes). Returns the image, its pixels and the limit."""
    write_images(root / "circle", 8, (220, 20, 0))
    write_images(root / "square", 8, (0, 20, 220))
    bomb = root / "square" / "img_03.png"
    if kind == "header":
        declare_size(bomb, 100_000, 100_000)
        return bomb, 100_000 * 100_000, Image.MAX_IMAGE_PIXELS
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3_000)
    Image.new("RGB", (64, 64), (0, 20, 220)).save(bomb)
    return bomb, 64 * 64, 3_000


def read_everything(data: IJEPADataModule) -> dict[str, int]:
    """The images each loader of a fit gives, by split: every image is read by one of them."""
    loaders = {"pretrain": data.train_dataloader, "probe_train": data.probe_train_dataloader}
    loaders["probe_test"] = data.probe_test_dataloader
    return {name: sum(batch.images.size(0) for batch in loader()) for name, loader in loaders.items()}


@pytest.mark.parametrize("kind", ["header", "limit"])
def test_an_image_too_large_to_decode_is_an_error_naming_file_pixels_and_limit(tmp_path, kind, monkeypatch):
    """A header-declared bomb ended in PIL's bare DecompressionBombError; one just over the limit
    was decoded without a word."""
    bomb, pixels, limit = bomb_folder(tmp_path, kind, monkeypatch)
    data = folder_data(tmp_path)
    data.setup("fit")
    with pytest.raises(ValueError) as raised:
        read_everything(data)
    first_line = str(raised.value).splitlines()[0]
    assert first_line.startswith(
        f"unreadable image {bomb} (ImageTooLarge: {pixels} pixels, more than PIL.Image.MAX_IMAGE_PIXELS={limit}"
    ), first_line
    assert "remove or downscale it" in first_line and "data.source.bad_images=skip" in first_line


@pytest.mark.parametrize("kind", ["header", "limit"])
def test_an_image_too_large_to_decode_is_skipped_and_counted_under_skip(tmp_path, kind, monkeypatch):
    bomb, pixels, _ = bomb_folder(tmp_path, kind, monkeypatch)
    data = folder_data(tmp_path, bad_images="skip")
    data.setup("fit")
    with pytest.warns(UserWarning, match=rf"skipping unreadable image {bomb} \({pixels} pixels"):
        read = read_everything(data)
    # a skipped image is replaced by the next readable one: no batch comes up short
    assert read["probe_train"] == len(data.split("probe_train")) and read["probe_test"] == len(data.split("probe_test"))
    assert data.split("probe_train").dataset.skipped == {str(bomb)}
