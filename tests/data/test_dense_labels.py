"""Dense labels (per-pixel class masks and object counts) in the data layer: generated shapes'
masks are their shapes' pixels, the transforms move masks with their images (nearest, class ids
kept), the dense collate stacks them, and image folders read index-PNG masks beside the images,
refusing a missing or mis-sized mask with a message naming the files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_datamodule
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from ijepa.data import IGNORE_INDEX, DenseBatch, ShapesSource, dense_collate, labeled_collate, source_from_config
from ijepa.data.batch import LabeledBatch
from ijepa.data.imagefolder import RobustImageFolder
from ijepa.data.shapes import ShapesDataset, _sample_params
from ijepa.data.sources import ImageFolderSource, SplitSettings
from ijepa.data.transforms import eval_transform


def dense_item(mask: torch.Tensor, label: int = 0, count: int = 1) -> dict:
    return {"label": label, "mask": tv_tensors.Mask(mask), "count": count}


# --- generated shapes ----------------------------------------------------------------------------
def test_a_masks_pixels_are_its_shapes_pixels():
    shapes = ShapesDataset(20, image_size=32, dense=True, num_objects=(1, 3), background="plain")
    for index in range(len(shapes)):
        image, target = shapes[index]
        mask, label = target["mask"], target["label"]
        assert isinstance(mask, tv_tensors.Mask) and mask.dtype == torch.int64 and mask.shape == (32, 32)
        assert set(mask.unique().tolist()) == {0, label + 1}  # background and the image's class only
        pixels = image.float().permute(1, 2, 0) / 255
        background = pixels[mask == 0].median(dim=0).values
        distance = (pixels - background).norm(dim=-1)
        assert (distance[mask != 0] > 0.1).all(), index  # shape pixels are painted in the shape's colour
        # background pixels away from any shape (no shape pixel next to them) are the background's
        near_shape = F.max_pool2d((mask != 0).float()[None, None], 3, stride=1, padding=1)[0, 0].bool()
        assert (distance[~near_shape] < 0.1).all(), index


def test_a_count_is_the_number_of_instances_drawn():
    shapes = ShapesDataset(30, image_size=16, dense=True, num_objects=(1, 4), seed=2)
    counts = [shapes[index][1]["count"] for index in range(len(shapes))]
    drawn = [len(_sample_params(2, "train", index, 16, 10, (1, 4))["objects"]) for index in range(len(shapes))]
    assert counts == drawn == shapes.counts.tolist()
    assert set(counts) == {1, 2, 3, 4}
    three = ShapesDataset(5, image_size=16, dense=True, num_objects=(3, 3), cache=False)
    assert {three[i][1]["count"] for i in range(5)} == {3}


@pytest.mark.parametrize("background", ["plain", "busy"])
def test_dense_items_show_the_images_of_plain_items_bit_for_bit(background):
    options = dict(num_samples=12, image_size=24, num_objects=(1, 3), background=background, seed=5)
    plain, dense = ShapesDataset(**options), ShapesDataset(**options, dense=True)
    assert torch.equal(plain.images, dense.images)
    assert plain.masks is None and dense.masks.shape == (12, 24, 24)
    for index in range(12):
        image, label = plain[index]
        assert isinstance(label, int) and torch.equal(image, dense[index][0])


def test_uncached_dense_items_equal_the_cached_ones():
    options = dict(num_samples=8, image_size=24, num_objects=(1, 3), dense=True)
    cached, lazy = ShapesDataset(**options), ShapesDataset(**options, cache=False)
    for index in (7, 0, 3):
        (image, target), (lazy_image, lazy_target) = cached[index], lazy[index]
        assert torch.equal(image, lazy_image) and torch.equal(target["mask"], lazy_target["mask"])
        assert target["count"] == lazy_target["count"] and target["label"] == lazy_target["label"]


def test_dense_must_be_a_bool():
    with pytest.raises(ValueError, match="dense must be a bool"):
        ShapesDataset(4, image_size=16, dense="yes")
    with pytest.raises(ValueError, match="dense must be a bool"):
        ShapesSource(train_size=4, val_size=4, dense=1)


def test_a_dense_shapes_source_keeps_dense_in_its_config_and_hands_dense_splits():
    source = ShapesSource(train_size=6, val_size=4, dense=True)
    assert source_from_config(source.config()).dense is True
    data = tiny_datamodule(source=source, batch_size=4, probe_batch_size=4)
    for name in ("pretrain", "val", "probe_train", "probe_test"):
        image, target = data.split(name)[0]
        assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
        assert target["mask"].dtype == torch.int64 and target["mask"].shape == (32, 32)
    batch = next(iter(data.probe_train_dataloader()))
    assert isinstance(batch, DenseBatch) and batch.masks.shape == (4, 32, 32)
    pretrain = next(iter(data.train_dataloader()))  # pretraining reads the images of dense samples
    assert pretrain.images.shape == (4, 3, 32, 32) and pretrain.labels.shape == (4,)


# --- transforms --------------------------------------------------------------------------------
def square_sample(size: int = 48) -> tuple[tv_tensors.Image, dict]:
    """A red square (mask 3) on a blue ground (mask 0), with an ignored stripe (IGNORE_INDEX) along
    the left edge."""
    image = torch.zeros(3, size, size, dtype=torch.uint8)
    image[2] = 255
    mask = torch.zeros(size, size, dtype=torch.int64)
    top, bottom = size // 4, size // 2
    image[:, top:bottom, top : bottom + size // 4] = torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1, 1)
    mask[top:bottom, top : bottom + size // 4] = 3
    mask[:, :2] = IGNORE_INDEX
    return tv_tensors.Image(image), dense_item(mask, label=2, count=1)


def assert_mask_matches_red(image: torch.Tensor, mask: torch.Tensor) -> int:
    """Away from edges (a pixel whose 3x3 neighbourhood has one mask value), red pixels are
    the square's; -> how many inner square pixels were checked."""
    inner = F.max_pool2d(mask[None, None].float(), 3, 1, 1) == -F.max_pool2d(-mask[None, None].float(), 3, 1, 1)
    inner = inner[0, 0]
    red = image[0] > image[2]
    assert (red[inner & (mask == 3)]).all() and not red[inner & (mask == 0)].any()
    return int((inner & (mask == 3)).sum())


def test_a_horizontal_flip_flips_image_and_mask_together():
    image, target = square_sample()
    flipped, flipped_target = v2.RandomHorizontalFlip(p=1.0)(image, target)
    assert torch.equal(flipped, image.flip(-1)) and torch.equal(flipped_target["mask"], target["mask"].flip(-1))
    assert flipped_target["label"] == 2 and flipped_target["count"] == 1


def test_the_training_augmentation_crops_and_flips_masks_with_their_images():
    data = tiny_datamodule(crop_scale=(0.3, 1.0), horizontal_flip=True)
    transform = data.train_transform()
    torch.manual_seed(0)
    checked, flips = 0, set()
    for _ in range(8):
        image, target = transform(*square_sample())
        mask = target["mask"]
        assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
        assert mask.dtype == torch.int64 and mask.shape == (32, 32)
        assert set(mask.unique().tolist()) <= {0, 3, IGNORE_INDEX}  # nearest: no value in between
        checked += assert_mask_matches_red(image, mask)
        if (mask == IGNORE_INDEX).any():  # the ignored stripe is on the left, or flipped to the right
            columns = (mask == IGNORE_INDEX).any(0).nonzero().flatten()
            flips.add(bool(columns.min() > 16))
    assert checked > 0 and flips == {False, True}


@pytest.mark.parametrize("size", [20, 32, 72])
def test_the_eval_transform_at_another_size_keeps_mask_values_and_their_places(size):
    image, target = square_sample(48)
    out, out_target = eval_transform(size)(image, target)
    mask = out_target["mask"]
    assert isinstance(mask, tv_tensors.Mask) and mask.dtype == torch.int64 and mask.shape == (size, size)
    assert set(mask.unique().tolist()) <= {0, 3, IGNORE_INDEX} and (mask == 3).any()
    assert out.dtype == torch.float32 and out.shape == (3, size, size)
    assert torch.equal(out, eval_transform(size)(image))  # the image as without a mask
    assert assert_mask_matches_red(out, mask) > 0


def test_the_eval_transform_of_a_non_square_image_crops_its_mask_alike():
    image, target = square_sample(48)
    wide, wide_mask = torch.cat([image, image], dim=-1), torch.cat([target["mask"]] * 2, dim=-1)
    out, out_target = eval_transform(24)(tv_tensors.Image(wide), dense_item(wide_mask))
    assert out_target["mask"].shape == (24, 24) and out.shape == (3, 24, 24)
    assert assert_mask_matches_red(out, out_target["mask"]) > 0


# --- collate -------------------------------------------------------------------------------------
def test_dense_collate_stacks_images_labels_masks_and_counts():
    samples = [
        (torch.rand(3, 8, 8), dense_item(torch.full((8, 8), i, dtype=torch.uint8), label=i, count=i + 1), 77 + i)
        for i in range(3)
    ]
    batch = dense_collate(samples)
    assert isinstance(batch, DenseBatch) and isinstance(batch, LabeledBatch) and len(batch) == 3
    assert batch.images.shape == (3, 3, 8, 8) and batch.images.dtype == torch.float32
    assert batch.masks.shape == (3, 8, 8) and batch.masks.dtype == torch.int64
    assert type(batch.masks) is torch.Tensor
    assert batch.labels.tolist() == [0, 1, 2] and batch.counts.tolist() == [1, 2, 3]
    assert batch.counts.dtype == batch.labels.dtype == torch.int64
    assert isinstance(labeled_collate(samples), DenseBatch)  # the labelled collate hands dense samples on
    plain = labeled_collate([(torch.rand(3, 8, 8), 1), (torch.rand(3, 8, 8), 0)])
    assert type(plain) is LabeledBatch and plain.labels.tolist() == [1, 0]


def test_dense_collate_refuses_plain_samples_and_masks_of_different_sizes():
    with pytest.raises(TypeError, match="sample 0 must be"):
        dense_collate([(torch.rand(3, 8, 8), 1)])
    with pytest.raises(ValueError, match="one size"):
        dense_collate(
            [(torch.rand(3, 8, 8), dense_item(torch.zeros(8, 8))), (torch.rand(3, 8, 8), dense_item(torch.zeros(4, 4)))]
        )


# --- image folders -------------------------------------------------------------------------------
def write_masked_folder(root, masks, size=16, classes=("circle", "square"), per_class=2, mode="L"):
    """Solid images with index-PNG masks (value ``1 + class`` on the left half, 0 or 255 elsewhere)
    at the same relative paths under ``masks``; -> {relative image path: mask values}."""
    written = {}
    for label, name in enumerate(classes):
        for index in range(per_class):
            relative = f"{name}/{index:02d}"
            (root / name).mkdir(parents=True, exist_ok=True)
            (masks / name).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((size, size, 3), 40 * (label + 1), np.uint8)).save(root / f"{relative}.jpg")
            values = np.zeros((size, size), np.uint8)
            values[:, : size // 2] = label + 1
            values[0, :] = 255
            mask = Image.fromarray(values, mode="L")
            if mode == "P":
                mask = mask.convert("P")
                mask.putpalette([v for i in range(256) for v in (i, 255 - i, 0)])
            mask.save(masks / f"{relative}.png")
            written[relative] = values
    return written


@pytest.mark.parametrize("mode", ["L", "P"])
def test_image_folder_masks_are_read_beside_their_images(tmp_path, mode):
    written = write_masked_folder(tmp_path / "images", tmp_path / "masks", mode=mode)
    folder = RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "masks"))
    assert len(folder) == 4
    for index, (path, label) in enumerate(folder.samples):
        image, target = folder[index]
        values = written[f"{folder.classes[label]}/{path.rsplit('/', 1)[1][:-4]}"]
        assert target["label"] == label and target["count"] == -1
        assert target["mask"].dtype == torch.int64 and torch.equal(target["mask"], torch.from_numpy(values).long())
        assert image.size == (16, 16)


def test_an_ignore_index_is_read_as_the_ignore_value(tmp_path):
    write_masked_folder(tmp_path / "images", tmp_path / "masks", classes=("circle",))
    first = np.array(Image.open(tmp_path / "masks" / "circle" / "00.png"))
    first[first == 255] = 0  # no value 255, which would read as ignored
    Image.fromarray(first, mode="L").save(tmp_path / "masks" / "circle" / "00.png")
    folder = RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "masks"), ignore_index=0)
    mask = folder[0][1]["mask"]
    assert set(mask.unique().tolist()) == {1, IGNORE_INDEX}
    assert torch.equal(mask == IGNORE_INDEX, torch.from_numpy(first == 0))
    with pytest.raises(ValueError, match="holds the value 255, which reads as ignored"):
        folder[1]


def test_an_image_folder_source_with_masks_gives_dense_splits_at_the_model_size(tmp_path):
    for split, per_class in (("train", 3), ("val", 1)):
        write_masked_folder(tmp_path / "images" / split, tmp_path / "masks" / split, per_class=per_class)
    source = ImageFolderSource(str(tmp_path / "images"), masks=str(tmp_path / "masks"))
    transform = eval_transform(8)
    splits = source.splits(SplitSettings(8, 0, 0, transform, transform, None))
    assert len(splits.pretrain) == 6 and len(splits.val) == 2 and splits.num_classes == 2
    batch = dense_collate([splits.val[0], splits.val[1]])
    assert batch.images.shape == (2, 3, 8, 8) and batch.masks.shape == (2, 8, 8)
    assert batch.labels.tolist() == [0, 1] and batch.counts.tolist() == [-1, -1]
    assert set(batch.masks[1].unique().tolist()) <= {0, 2, IGNORE_INDEX}


def test_a_missing_mask_is_an_error_naming_the_image_and_the_expected_mask(tmp_path):
    write_masked_folder(tmp_path / "images", tmp_path / "masks")
    (tmp_path / "masks" / "square" / "01.png").unlink()
    expected = rf"square/01\.jpg -> {tmp_path / 'masks' / 'square' / '01.png'}"
    with pytest.raises(FileNotFoundError, match=rf"no mask for 1 of 4 image\(s\).*{expected}"):
        RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "masks"))
    folder = RobustImageFolder(str(tmp_path / "images"))  # no masks asked for: plain items
    assert isinstance(folder[0][1], int)
    with pytest.raises(FileNotFoundError, match="mask folder not found: masks="):
        RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "nowhere"))


def test_a_mask_removed_after_reading_the_folder_is_an_error_naming_image_and_mask(tmp_path):
    write_masked_folder(tmp_path / "images", tmp_path / "masks", per_class=1)
    folder = RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "masks"), bad_images="skip")
    (tmp_path / "masks" / "circle" / "00.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"no mask for image .*circle/00\.jpg: expected .*circle/00\.png"):
        folder[0]


def test_a_mask_of_another_size_than_its_image_is_an_error_naming_both_sizes(tmp_path):
    write_masked_folder(tmp_path / "images", tmp_path / "masks", per_class=1)
    Image.fromarray(np.zeros((8, 12), np.uint8), mode="L").save(tmp_path / "masks" / "circle" / "00.png")
    folder = RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "masks"))
    with pytest.raises(ValueError, match=r"circle/00\.png is 12x8 \(WxH\) but its image .*circle/00\.jpg is 16x16"):
        folder[0]


def test_a_mask_that_is_not_an_index_png_is_an_error_naming_its_mode(tmp_path):
    write_masked_folder(tmp_path / "images", tmp_path / "masks", per_class=1)
    Image.new("RGB", (16, 16)).save(tmp_path / "masks" / "circle" / "00.png")
    folder = RobustImageFolder(str(tmp_path / "images"), masks=str(tmp_path / "masks"))
    with pytest.raises(ValueError, match="has mode 'RGB'; masks are index PNGs of mode L or P"):
        folder[0]


@pytest.mark.parametrize("ignore_index", [-1, 256, 1.5, True])
def test_an_ignore_index_outside_an_index_pngs_values_is_refused(tmp_path, ignore_index):
    with pytest.raises(ValueError, match=r"ignore_index must be an int in \[0, 255\]"):
        ImageFolderSource(str(tmp_path), masks=str(tmp_path), ignore_index=ignore_index)
    with pytest.raises(ValueError, match="masks must be a folder path"):
        ImageFolderSource(str(tmp_path), masks="")


# --- shards --------------------------------------------------------------------------------------
def test_shards_written_with_masks_give_the_folders_dense_items(tmp_path):
    pytest.importorskip("litdata", reason="shards need the 'shards' extra")
    from helpers import prepare

    from ijepa.data.shards import ShardsSource

    for split, per_class in (("train", 2), ("val", 1)):
        write_masked_folder(tmp_path / "images" / split, tmp_path / "masks" / split, per_class=per_class)
    shards = prepare(tmp_path / "images", tmp_path / "shards", "--masks", str(tmp_path / "masks"))
    transform = eval_transform(8)
    settings = SplitSettings(8, 0, 0, transform, transform, None)
    ours = ShardsSource(str(shards)).splits(settings)
    theirs = ImageFolderSource(str(tmp_path / "images"), masks=str(tmp_path / "masks")).splits(settings)
    for name in ("pretrain", "val"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert len(a) == len(b)
        for index in range(len(a)):
            (image, target), (their_image, their_target) = a[index], b[index]
            assert torch.equal(image, their_image) and torch.equal(target["mask"], their_target["mask"])
            assert target["label"] == their_target["label"] and target["count"] == -1


def test_prepare_refuses_masks_missing_for_an_image_naming_it(tmp_path, capsys):
    pytest.importorskip("litdata", reason="shards need the 'shards' extra")
    from helpers import prepare

    write_masked_folder(tmp_path / "images", tmp_path / "masks", per_class=1)
    (tmp_path / "masks" / "circle" / "00.png").unlink()
    with pytest.raises(SystemExit):
        prepare(tmp_path / "images", tmp_path / "shards", "--masks", str(tmp_path / "masks"))
    assert "circle/00.jpg -> " in capsys.readouterr().err
