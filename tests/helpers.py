"""Helpers that several test modules share, so that no test module imports another: files in the
layouts the sources read, in-process CLI runs, callbacks that record a run, comparisons.
Fixtures are in conftest.py."""

import fractions
import os
from pathlib import Path
from unittest import mock

import lightning as L
import numpy as np
import pytest
import torch
from conftest import TINY_MODEL, save_tiny_checkpoint
from PIL import Image
from torch.utils.data import DataLoader

from ijepa.cli import build_cli, main
from ijepa.data.collate import MaskCollator
from ijepa.data.shapes import CLASSES, ShapesDataset
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA

# --- STL-10's binary layout, written for the stl10 source -----------------------------------------
STL_SIZE = 96
STL_GRID = STL_SIZE // 8
STL_CLASSES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")
# Image ids are stored in pixel [channel 0, row 0, col 0], so every image is identifiable.
TRAIN_IDS = list(range(0, 20))
UNLABELED_IDS = list(range(100, 130))
TEST_IDS = list(range(200, 210))


def stl_pattern(image_id: int) -> np.ndarray:
    """The image ``[3, H, W]`` (uint8, CHW, rows first) a reader must return for ``image_id``.

    ``value = id + 3 * channel + row + 2 * col`` is not symmetric under a row/column transpose,
    and pixel ``[0, 0, 0]`` is the id itself.
    """
    c = np.arange(3)[:, None, None]
    r = np.arange(STL_SIZE)[None, :, None]
    col = np.arange(STL_SIZE)[None, None, :]
    return ((image_id + 3 * c + r + 2 * col) % 256).astype(np.uint8)


def stl_label(image_id: int) -> int:
    """0-based label of a labelled image (the file stores ``label + 1``)."""
    return (image_id * 7 + 3) % 10


def write_stl_images(path: Path, ids: list[int]) -> None:
    images = np.stack([stl_pattern(i) for i in ids])  # [N, 3, H, W], H = rows
    # STL-10 stores each channel column-major: torchvision reads [N, 3, 96, 96] and swaps the
    # last two axes, so the file holds the transpose of what the reader must return.
    np.ascontiguousarray(images.transpose(0, 1, 3, 2)).tofile(path)


def write_stl10(root: Path) -> Path:
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    write_stl_images(folder / "train_X.bin", TRAIN_IDS)
    np.array([stl_label(i) + 1 for i in TRAIN_IDS], dtype=np.uint8).tofile(folder / "train_y.bin")
    write_stl_images(folder / "test_X.bin", TEST_IDS)
    np.array([stl_label(i) + 1 for i in TEST_IDS], dtype=np.uint8).tofile(folder / "test_y.bin")
    write_stl_images(folder / "unlabeled_X.bin", UNLABELED_IDS)
    (folder / "class_names.txt").write_text("\n".join(STL_CLASSES) + "\n")
    return folder


# --- videos ---------------------------------------------------------------------------------------
def write_video(path, num_frames: int, fps: float, size: int = 32):
    """An mp4 whose frame k is a flat grey of level 8k, so a decoded frame tells its index."""
    import av  # the 'video' extra: only the tests that write videos need it

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fractions.Fraction(fps).limit_denominator(1000))
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for k in range(num_frames):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), 8 * k, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def make_video_folder(root, per_class: int = 4):
    """``root/{train,val}/{a,b}/`` videos at 10 and 20 fps."""
    for split, count in (("train", per_class), ("val", 2)):
        for name in ("a", "b"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for k in range(count):
                write_video(folder / f"{k}.mp4", 20, 10 if k % 2 else 20, size=24)
    return root


# --- image folders and shards ---------------------------------------------------------------------
def write_folder(root: Path, per_class: int, classes=CLASSES[:2], suffix: str = "jpg", split: str = "train") -> Path:
    """``per_class`` generated shapes of each of ``classes`` under ``root/<class>/`` (JPEG or PNG);
    ``classes=None``: loose, unlabelled images directly in ``root``."""
    images = ShapesDataset(per_class * len(classes or [0]), 32, split=split, background="noisy")
    for index in range(len(images)):
        image, label = images[index]
        folder = root / classes[label % len(classes)] if classes else root
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{index:03d}.{suffix}")
    return root


def prepare(src: Path, dest: Path, *args: str) -> Path:
    main(["prepare", str(src), str(dest), *args])
    return dest


def write_folder_and_shards(root: Path) -> tuple[Path, Path]:
    """Two classes of 10 JPEGs and their shards, written by two processes."""
    folder = write_folder(root / "jpeg", 10)
    return folder, prepare(folder, root / "shards", "--num-workers", "2", "--chunk-bytes", "4KB")


# --- runs -----------------------------------------------------------------------------------------
class Stop(Exception):
    pass


class Recorder(L.Callback):
    """Loss and first-sample checksums of every trained batch, and an optional hard stop."""

    def __init__(self, stop_at=None):
        self.losses, self.batches, self.stop_at = {}, {}, stop_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.stop_at:
            raise Stop  # like a preemption: nothing after the last checkpoint survives

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        self.losses[step] = outputs["loss"].item()
        self.batches[step] = (
            float(batch.images.sum()),
            batch.context_indices.tolist(),
            batch.target_indices.sum().item(),
        )


EVERY_STEP = """
trainer:
  callbacks:
    - class_path: ijepa.callbacks.EMATargetUpdate
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: {dirpath}
        every_n_train_steps: 1
        save_last: true
"""


def cli(*args):
    """``ijepa <args>`` in this process; returns the LightningCLI."""
    with mock.patch("sys.argv", ["ijepa"]):
        return build_cli([*args])


def every_step_config(tmp_path, dirpath):
    path = tmp_path / "every_step.yaml"
    path.write_text(EVERY_STEP.format(dirpath=dirpath))
    return str(path)


def fake_commands(folder: Path, **scripts: str) -> str:
    """A PATH with shell scripts named as the keys in front of the real one."""
    folder.mkdir()
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def random_loader(num_images=32, batch_size=4, image_size=32, patch_size=8):
    images = torch.randn(num_images, 3, image_size, image_size)
    samples = [(images[i], i % 3) for i in range(num_images)]
    sampler = MultiBlockMaskSampler(image_size // patch_size, target_scale=(0.1, 0.15), min_keep=2)
    return DataLoader(samples, batch_size=batch_size, collate_fn=MaskCollator(sampler))


# --- models and results ---------------------------------------------------------------------------
INTEROP_MODEL = {**TINY_MODEL, "pos_embed": "sincos", "predictor_pos_embed": "sincos", "predictor_mode": "per_block"}


def trained_like(seed: int = 0) -> IJEPA:
    torch.manual_seed(seed)
    model = IJEPA(**INTEROP_MODEL).eval()
    with torch.no_grad():  # online and target differ, as after training
        for p in model.target_encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model


def save_teacher(path: Path) -> Path:
    """A distillation teacher (TINY_MODEL: width 32, 2 blocks, patch 8 at 32 px) whose online and
    target encoders differ, saved as an untrained checkpoint at ``path``."""
    torch.manual_seed(1)
    teacher = IJEPA(**TINY_MODEL)
    with torch.no_grad():
        for p in teacher.target_encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return save_tiny_checkpoint(teacher, path)


def assert_same(checkpointed: dict, plain: dict, tolerance: float = 1e-6) -> None:
    assert checkpointed.keys() == plain.keys() and any(k.startswith("predictor.") for k in plain)
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, rtol=tolerance, atol=tolerance, msg=name)


def heads_by_name(result: dict) -> dict[str, float]:
    return {head["name"]: head["val_top1"] for head in result["heads"]}


def one_line(capsys, command, args) -> str:
    """The project's one-line error of ``command(args)`` (exit status 2, no traceback)."""
    with pytest.raises(SystemExit) as exit:
        command(args)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()
