"""IJEPADataModule: STL-10 (from a tiny folder in STL-10's binary layout), image folders,
generated shapes, and argument validation. Everything is offline, tiny and single-process."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL
from helpers import (
    STL_CLASSES,
    STL_GRID,
    STL_SIZE,
    TEST_IDS,
    TRAIN_IDS,
    UNLABELED_IDS,
    stl_label,
    stl_pattern,
    write_stl10,
)
from PIL import Image
from torch.utils.data import Subset

from ijepa.data.batch import GridBatch, LabeledBatch
from ijepa.data.datamodule import IJEPADataModule
from ijepa.data.sources import (
    ImageFolderSource,
    MovingShapesSource,
    ShapesSource,
    STL10Source,
    VideoFolderSource,
    source_from_config,
)
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from ijepa.masks import MultiBlockMasks


# --- helpers --------------------------------------------------------------------------------
def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Undo ``ToDtype(scale=True)`` + ``Normalize(ImageNet)``: float ``[..., 3, H, W]`` -> uint8."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    restored = (images * std + mean) * 255.0
    assert (restored - restored.round()).abs().max() < 1e-2, "not an exactly normalised uint8 image"
    return restored.round().clamp(0, 255).to(torch.uint8)


def check_masked_batch(batch: GridBatch, batch_size: int, image_size: int, num_patches: int) -> None:
    assert type(batch) is GridBatch and batch.context_mask is None and batch.target_mask is None
    assert batch.patch_size is None
    images, labels = batch.images, batch.labels
    context, targets = batch.context_indices, batch.target_indices
    assert images.shape == (batch_size, 3, image_size, image_size)
    assert images.dtype == torch.float32
    assert labels.shape == (batch_size,)
    assert context.dim() == 2 and context.size(0) == batch_size and context.size(1) >= 1
    assert targets.dim() == 3 and targets.size(0) == batch_size and targets.size(2) >= 1
    assert context.dtype == targets.dtype == torch.long
    for indices in (context, targets):
        assert indices.min() >= 0 and indices.max() < num_patches
    for b in range(batch_size):  # context and targets never share a patch
        assert not set(context[b].tolist()) & set(targets[b].flatten().tolist())


def stl_module(root: Path, **overrides) -> IJEPADataModule:
    kwargs = dict(
        source=STL10Source(root=str(root)),
        image_size=STL_SIZE,
        patch_size=8,
        batch_size=8,
        probe_batch_size=8,
        num_workers=0,
        crop_scale=None,
    )
    kwargs.update(overrides)
    return IJEPADataModule(**kwargs)


@pytest.fixture
def stl_root(tmp_path: Path) -> Path:
    write_stl10(tmp_path)
    return tmp_path


# --- STL-10 ---------------------------------------------------------------------------------
def test_stl10_splits_sizes_and_labels(stl_root):
    dm = stl_module(stl_root)
    dm.setup("fit")
    assert dm.num_classes == 10
    assert len(dm.split("pretrain")) == len(TRAIN_IDS) + len(UNLABELED_IDS) == 50
    assert len(dm.split("probe_train")) == 20
    assert len(dm.split("probe_test")) == 10
    assert len(dm.split("val")) == 10
    assert list(dm.split("probe_train").classes) == list(STL_CLASSES)


def test_stl10_images_read_back_exactly_with_orientation(stl_root):
    """Each image written at position i comes back as written (ids, rows vs columns, channels)."""
    dm = stl_module(stl_root)
    dm.setup("fit")
    pretrain = dm.split("pretrain")
    for position, image_id in enumerate(TRAIN_IDS + UNLABELED_IDS):
        image, label = pretrain[position]
        assert isinstance(image, torch.Tensor) and image.shape == (3, STL_SIZE, STL_SIZE)
        np.testing.assert_array_equal(to_uint8(image).numpy(), stl_pattern(image_id), err_msg=f"position {position}")
        assert label == (stl_label(image_id) if image_id in TRAIN_IDS else -1)
    # Spell out the orientation: one row down adds 1, one column right adds 2.
    first = to_uint8(pretrain[0][0]).int()
    assert first[0, 1, 0] - first[0, 0, 0] == 1
    assert first[0, 0, 1] - first[0, 0, 0] == 2
    assert first[1, 0, 0] - first[0, 0, 0] == 3


def test_stl10_train_loader_end_to_end(stl_root):
    dm = stl_module(stl_root)
    dm.setup("fit")
    seen = []
    batches = list(dm.train_dataloader())
    assert len(batches) == 50 // 8  # drop_last keeps mask shapes uniform per batch
    for batch in batches:
        check_masked_batch(batch, 8, STL_SIZE, STL_GRID**2)
        images = to_uint8(batch.images)
        for image, label in zip(images, batch.labels.tolist()):
            image_id = int(image[0, 0, 0])
            assert image_id in TRAIN_IDS or image_id in UNLABELED_IDS
            np.testing.assert_array_equal(image.numpy(), stl_pattern(image_id))
            assert label == (stl_label(image_id) if image_id in TRAIN_IDS else -1)
            seen.append(image_id)
    assert len(seen) == len(set(seen)) == 48
    assert any(i in UNLABELED_IDS for i in seen) and any(i in TRAIN_IDS for i in seen)


def test_stl10_knn_loaders_are_labelled_only(stl_root):
    dm = stl_module(stl_root)
    dm.setup("fit")
    for loader, ids in ((dm.probe_train_dataloader(), TRAIN_IDS), (dm.probe_test_dataloader(), TEST_IDS)):
        seen, labels = [], []
        for batch in loader:
            assert type(batch) is LabeledBatch
            assert batch.images.shape[1:] == (3, STL_SIZE, STL_SIZE)
            seen += [int(i) for i in to_uint8(batch.images)[:, 0, 0, 0]]
            labels += batch.labels.tolist()
        assert seen == ids  # in file order, no unlabeled image, none missing
        assert labels == [stl_label(i) for i in ids]
        assert min(labels) >= 0 and max(labels) <= 9
    assert set(stl_label(i) for i in TRAIN_IDS) == set(range(10))
    # predict uses the k-NN queries
    predict_ids = [int(i) for b in dm.predict_dataloader() for i in to_uint8(b.images)[:, 0, 0, 0]]
    assert predict_ids == TEST_IDS


def test_stl10_val_loader_is_masked_test_split(stl_root):
    dm = stl_module(stl_root)
    dm.setup("validate")
    batches = list(dm.val_dataloader())
    assert [b.images.size(0) for b in batches] == [8, 2]  # no drop_last on evaluation
    ids = []
    for batch in batches:
        check_masked_batch(batch, batch.images.size(0), STL_SIZE, STL_GRID**2)
        ids += [int(i) for i in to_uint8(batch.images)[:, 0, 0, 0]]
    assert ids == TEST_IDS
    assert sum(b.images.size(0) for b in dm.test_dataloader()) == 10


def test_stl10_random_crop_keeps_shapes(stl_root):
    dm = stl_module(stl_root, crop_scale=(0.3, 1.0), horizontal_flip=True)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    check_masked_batch(batch, 8, STL_SIZE, STL_GRID**2)
    assert torch.isfinite(batch.images).all()


def test_stl10_jepa_loss_finite(stl_root):
    from ijepa.module import IJEPA

    dm = stl_module(stl_root)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    model = IJEPA(**{**TINY_MODEL, "image_size": STL_SIZE, "depth": 1})
    loss = model.jepa_loss(batch)
    assert loss.dim() == 0 and torch.isfinite(loss) and loss > 0
    loss.backward()
    assert any(p.grad is not None for p in model.encoder.parameters())


def test_stl10_missing_root_mentions_download(tmp_path):
    dm = stl_module(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="download"):
        dm.setup("fit")


def test_stl10_truncated_file_is_reported(stl_root):
    path = stl_root / "stl10_binary" / "train_X.bin"
    path.write_bytes(path.read_bytes()[:-100])  # no longer a whole number of 3x96x96 images
    assert path.stat().st_size % (3 * 96 * 96) != 0
    dm = stl_module(stl_root)
    with pytest.raises(FileNotFoundError, match="(?i)truncated|incomplete"):
        dm.setup("fit")


@pytest.mark.parametrize("labels_file", ["train_y.bin", "test_y.bin"])
def test_stl10_label_count_mismatch_is_reported(stl_root, labels_file):
    """A short labels file must fail at setup, not with an IndexError deep inside an epoch."""
    path = stl_root / "stl10_binary" / labels_file
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(FileNotFoundError, match="(?i)truncated|incomplete"):
        stl_module(stl_root).setup("fit")


@pytest.mark.parametrize("missing", ["test_y.bin", "unlabeled_X.bin"])
def test_stl10_missing_file_is_reported(stl_root, missing):
    (stl_root / "stl10_binary" / missing).unlink()
    with pytest.raises(FileNotFoundError, match="download"):
        stl_module(stl_root).setup("fit")


# --- image folder ---------------------------------------------------------------------------
FOLDER_CLASSES = ("apple", "banana", "cherry")


def write_png(path: Path, rgb: tuple[int, int, int], size: int = 40) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), rgb).save(path)


def write_image_folder(root: Path, per_class: int, marker: int = 0) -> None:
    """``per_class`` uniform PNGs per class; red = ``marker``, green = class, blue = index."""
    for c, name in enumerate(FOLDER_CLASSES):
        for i in range(per_class):
            write_png(root / name / f"img_{i:02d}.png", (marker, 60 * c, 10 * i))


def folder_module(root: Path, **overrides) -> IJEPADataModule:
    # the folder's own options go to its source, the rest to the DataModule
    own = {key: overrides.pop(key) for key in ("bad_images", "holdout_fraction") if key in overrides}
    kwargs = dict(
        source=ImageFolderSource(root=str(root), **own),
        image_size=32,
        patch_size=4,
        batch_size=4,
        probe_batch_size=5,
        num_workers=0,
        crop_scale=None,
    )
    kwargs.update(overrides)
    return IJEPADataModule(**kwargs)


def test_imagefolder_flat_holdout_is_disjoint_balanced_and_deterministic(tmp_path):
    write_image_folder(tmp_path, per_class=10)
    dm = folder_module(tmp_path, holdout_fraction=0.2)
    dm.setup("fit")
    assert dm.num_classes == 3
    splits = {name: dm.split(name) for name in ("pretrain", "val", "probe_train", "probe_test")}
    assert all(isinstance(s, Subset) for s in splits.values())
    pretrain, test = set(splits["pretrain"].indices), set(splits["probe_test"].indices)
    assert not pretrain & test
    assert pretrain | test == set(range(30))
    assert set(splits["probe_train"].indices) == pretrain
    assert set(splits["val"].indices) == test
    assert len(test) == 6  # 20% of 30
    targets = splits["probe_test"].dataset.targets
    assert sorted(targets[i] for i in test) == [0, 0, 1, 1, 2, 2]  # every class, balanced

    again = folder_module(tmp_path, holdout_fraction=0.2)
    again.setup("fit")
    assert list(again.split("probe_test").indices) == list(splits["probe_test"].indices)
    assert list(again.split("pretrain").indices) == list(splits["pretrain"].indices)

    # the loaders really serve those images: k-NN queries never come from the pretrain subset
    files = splits["probe_test"].dataset.samples
    pretrain_files = {files[i][0] for i in pretrain}
    test_files = {files[i][0] for i in test}
    assert not pretrain_files & test_files
    labels = torch.cat([b.labels for b in dm.probe_test_dataloader()])
    assert sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]
    total = 0
    for batch in dm.train_dataloader():
        check_masked_batch(batch, 4, 32, 64)
        total += batch.images.size(0)
    assert total == 24 // 4 * 4


def test_imagefolder_images_match_their_labels(tmp_path):
    write_image_folder(tmp_path, per_class=10)
    dm = folder_module(tmp_path)
    dm.setup("fit")
    for batch in dm.probe_train_dataloader():
        assert type(batch) is LabeledBatch
        pixels = to_uint8(batch.images).int()
        assert batch.images.shape[1:] == (3, 32, 32)
        # green channel encodes the class folder; uniform images stay uniform after resizing
        assert ((pixels[:, 1, 0, 0] - 60 * batch.labels).abs() <= 1).all()


@pytest.mark.parametrize("held_out", ["val", "test"])
def test_imagefolder_train_val_layout_uses_the_folders(tmp_path, held_out):
    write_image_folder(tmp_path / "train", per_class=4, marker=10)
    write_image_folder(tmp_path / held_out, per_class=2, marker=200)
    dm = folder_module(tmp_path)
    dm.setup("fit")
    assert dm.num_classes == 3
    assert len(dm.split("pretrain")) == len(dm.split("probe_train")) == 12
    assert len(dm.split("val")) == len(dm.split("probe_test")) == 6
    assert list(dm.split("probe_train").classes) == list(FOLDER_CLASSES)

    def markers(loader) -> set[int]:
        return {int(m) for b in loader for m in to_uint8(b.images)[:, 0, 0, 0]}

    assert markers(dm.train_dataloader()) == {10}
    assert markers(dm.probe_train_dataloader()) == {10}
    assert markers(dm.probe_test_dataloader()) == {200}
    assert markers(dm.val_dataloader()) == {200}
    labels = sorted(int(label) for b in dm.probe_test_dataloader() for label in b.labels)
    assert labels == [0, 0, 1, 1, 2, 2]


def test_imagefolder_train_alone_holds_out_from_train(tmp_path):
    write_image_folder(tmp_path / "train", per_class=10)
    dm = folder_module(tmp_path, holdout_fraction=0.3)
    dm.setup("fit")
    assert dm.num_classes == 3  # the class folders, not "train" as a single class
    assert len(dm.split("probe_test")) == 9 and len(dm.split("pretrain")) == 21


def test_imagefolder_val_without_train_is_an_error(tmp_path):
    write_image_folder(tmp_path / "val", per_class=2)
    with pytest.raises(ValueError, match="no train/ folder"):
        folder_module(tmp_path).setup("fit")


def test_imagefolder_missing_root_names_data_root(tmp_path):
    dm = folder_module(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="data.source.root"):
        dm.setup("fit")


# --- shapes ---------------------------------------------------------------------------------
def shapes_module(**overrides) -> IJEPADataModule:
    kwargs = dict(
        source=ShapesSource(train_size=20, val_size=10),
        image_size=32,
        patch_size=4,
        batch_size=4,
        probe_batch_size=6,
        num_workers=0,
    )
    kwargs.update(overrides)
    return IJEPADataModule(**kwargs)


def test_shapes_loaders():
    dm = shapes_module()
    dm.num_classes = -1  # setup must set it from the dataset
    dm.setup("fit")
    assert dm.num_classes == dm.split("pretrain").num_classes == 10
    assert len(dm.split("pretrain")) == len(dm.split("probe_train")) == 20
    assert len(dm.split("val")) == len(dm.split("probe_test")) == 10

    train = list(dm.train_dataloader())
    assert len(train) == 5
    for batch in train:
        check_masked_batch(batch, 4, 32, 64)
        assert batch.labels.min() >= 0 and batch.labels.max() < dm.num_classes

    val = list(dm.val_dataloader())
    assert sum(b.images.size(0) for b in val) == 10
    for batch in val:
        check_masked_batch(batch, batch.images.size(0), 32, 64)

    knn = list(dm.probe_train_dataloader())
    assert sum(b.images.size(0) for b in knn) == 20
    for batch in knn:
        assert type(batch) is LabeledBatch
        assert batch.images.dtype == torch.float32 and batch.images.shape[1:] == (3, 32, 32)
    labels = torch.cat([b.labels for b in knn])
    assert labels.tolist() == dm.split("probe_train").targets  # unshuffled, in order
    probe_test = list(dm.probe_test_dataloader())
    assert all(type(b) is LabeledBatch for b in probe_test)
    assert sum(b.images.size(0) for b in probe_test) == 10


def test_shapes_eval_loaders_are_deterministic():
    dm = shapes_module()
    dm.setup("fit")
    first = torch.cat([b.images for b in dm.probe_test_dataloader()])
    second = torch.cat([b.images for b in dm.probe_test_dataloader()])
    torch.testing.assert_close(first, second, rtol=0, atol=0)


# --- argument validation --------------------------------------------------------------------
def test_a_source_must_be_a_data_source():
    with pytest.raises(TypeError, match="data.source must be a DataSource"):
        IJEPADataModule(source="cifar10")


def test_clip_sources_need_frames_and_image_sources_none():
    with pytest.raises(ValueError, match=r"data.source is MovingShapesSource \(clips\), got num_frames=0"):
        IJEPADataModule(source=MovingShapesSource())
    with pytest.raises(ValueError, match=r"data.source is ShapesSource \(images\), got num_frames=4"):
        IJEPADataModule(source=ShapesSource(), num_frames=4)


def test_a_source_is_stored_in_the_checkpoint_as_plain_values_and_rebuilt_from_them():
    dm = IJEPADataModule(source=ShapesSource(train_size=30, background="busy"), probe_source=ImageFolderSource("x"))
    stored = dm.hparams["source"]
    assert stored == {
        "class_path": "ijepa.data.sources.ShapesSource",
        "init_args": {
            "train_size": 30,
            "val_size": 2000,
            "background": "busy",
            "num_objects": (1, 1),
            "radius": (0.2, 0.42),
            "dense": False,
        },
    }
    rebuilt = source_from_config(stored)
    assert type(rebuilt) is ShapesSource and vars(rebuilt) == vars(dm.source)
    assert source_from_config(dm.hparams["probe_source"]).root == "x"
    assert IJEPADataModule().source.config()["class_path"].endswith("STL10Source")  # the default
    with pytest.raises(ValueError, match="is not a DataSource"):
        source_from_config({"class_path": "ijepa.data.datamodule.IJEPADataModule"})


def test_image_size_not_divisible_by_patch_size():
    with pytest.raises(ValueError) as info:
        IJEPADataModule(source=ShapesSource(), image_size=50, patch_size=8)
    assert "image_size" in str(info.value) and "patch_size" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(probe_batch_size=0), "probe_batch_size"),
        (dict(num_workers=-1), "num_workers"),
        (dict(crop_scale=(0.5, 0.2)), "crop_scale"),
        (dict(crop_scale=(0.0, 1.0)), "crop_scale"),
        (dict(crop_scale=(0.5, 1.5)), "crop_scale"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        IJEPADataModule(source=ShapesSource(), **kwargs)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: ImageFolderSource(holdout_fraction=0.0), "holdout_fraction"),
        (lambda: ImageFolderSource(holdout_fraction=1.0), "holdout_fraction"),
        (lambda: ImageFolderSource(bad_images="ignore"), "bad_images"),
        (lambda: ShapesSource(train_size=0), "train_size"),
        (lambda: MovingShapesSource(val_size=0), "val_size"),
        (lambda: MovingShapesSource(fps=0.0), "fps"),
        (lambda: VideoFolderSource(frame_stride=0), "frame_stride"),
    ],
)
def test_bad_source_options_name_the_option(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_impossible_masks_fail_at_setup():
    # 4 target blocks of 100% of a 2x2 grid leave no context: fail fast, before any loader runs
    dm = shapes_module(image_size=16, patch_size=8, masks=MultiBlockMasks(target_scale=(1.0, 1.0), min_keep=1))
    with pytest.raises(ValueError, match="min_keep"):
        dm.setup("fit")
    assert math.isfinite(dm.grid_size) and dm.grid_size == 2


# --- unreadable and missing images ------------------------------------------------------------
def break_files(root: Path) -> tuple[Path, Path]:
    """Truncate one PNG and replace another with text; return both paths."""
    truncated = root / FOLDER_CLASSES[0] / "img_01.png"
    truncated.write_bytes(truncated.read_bytes()[:40])
    garbage = root / FOLDER_CLASSES[1] / "img_02.png"
    garbage.write_text("not an image")
    return truncated, garbage


def test_unreadable_image_is_an_error_naming_the_file_and_the_option(tmp_path):
    write_image_folder(tmp_path, per_class=10)
    truncated, _ = break_files(tmp_path)
    dm = folder_module(tmp_path)
    dm.setup("fit")
    with pytest.raises(ValueError, match=f"unreadable image {truncated}.*data.source.bad_images=skip"):
        for _ in dm.probe_train_dataloader():
            pass


@pytest.mark.parametrize("num_workers", [0, 1])
def test_unreadable_images_are_skipped_and_counted_with_a_warning(tmp_path, num_workers):
    write_image_folder(tmp_path, per_class=10)
    break_files(tmp_path)
    dm = folder_module(tmp_path, bad_images="skip", num_workers=num_workers)
    dm.setup("fit")
    with pytest.warns(UserWarning, match="skipping unreadable image") if num_workers == 0 else contextlib.nullcontext():
        train_batches, knn_batches = list(dm.train_dataloader()), list(dm.probe_train_dataloader())
    assert all(torch.isfinite(b.images).all() for b in train_batches + knn_batches)
    # a skipped file is replaced by the next readable one: no short batches, no lost positions
    assert sum(b.images.size(0) for b in knn_batches) == len(dm.split("probe_train"))
    if num_workers == 0:
        base = dm.split("probe_train").dataset
        assert len(base.skipped) == 2


def test_empty_image_folder_names_data_root(tmp_path):
    (tmp_path / "cats").mkdir()
    with pytest.raises(FileNotFoundError, match=f"no images under data.source.root='{tmp_path}"):
        folder_module(tmp_path).setup("fit")


def test_unknown_bad_image_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"bad_images must be one of \('error', 'skip'\)"):
        IJEPADataModule(source=ImageFolderSource(bad_images="ignore"))


def test_horizontal_flip_applies_without_a_random_crop():
    # It used to be dropped silently when crop_scale was None (the quickstart's setting).
    from torchvision import tv_tensors

    from ijepa.data import IJEPADataModule

    image = tv_tensors.Image(torch.arange(3 * 16 * 16, dtype=torch.uint8).reshape(3, 16, 16))
    flips = IJEPADataModule(source=ShapesSource(), image_size=16, patch_size=4, crop_scale=None, horizontal_flip=True)
    plain = IJEPADataModule(source=ShapesSource(), image_size=16, patch_size=4, crop_scale=None, horizontal_flip=False)
    reference = plain.train_transform()(image)
    torch.manual_seed(0)
    outputs = [flips.train_transform()(image) for _ in range(32)]
    assert all(torch.equal(plain.train_transform()(image), reference) for _ in range(4))
    assert any(torch.equal(out, reference.flip(-1)) for out in outputs)
    assert any(torch.equal(out, reference) for out in outputs)
    assert all(torch.equal(out, reference) or torch.equal(out, reference.flip(-1)) for out in outputs)
