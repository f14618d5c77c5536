"""``ijepa eval``'s dense protocols: segmentation and counting run end to end on dense shapes
(a tiny random-init checkpoint and raw pixels), learn what features that hold the answer give
(an oracle encoder: near-perfect mIoU and counts; noise: not), and refuse, in one line, data
without masks or counts and bad settings."""

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, TINY_MODEL
from lightning.fabric import Fabric
from PIL import Image
from torch.utils.data import Dataset

from ijepa.classifiers import token_grid_ceiling
from ijepa.data.batch import IGNORE_INDEX
from ijepa.data.sources import ImageFolderSource, ShapesSource
from ijepa.evaluation import (
    CountingProtocol,
    EvalData,
    Evaluation,
    SegmentationProtocol,
    protocol_kinds,
    read_results,
)
from ijepa.evaluation.cache import FeatureCache
from ijepa.evaluation.context import EvalContext
from ijepa.evaluation.encoders import PIXELS, FrozenEncoder, PixelEncoder
from ijepa.evaluation.runner import build_parser, main
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA

DENSE = {"train_size": 64, "val_size": 32, "num_objects": (1, 3), "dense": True}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("dense") / "tiny.ckpt")


def data(**source) -> EvalData:
    return EvalData(ShapesSource(**{**DENSE, **source}), batch_size=16, num_workers=0, val_fraction=0.25)


def segmentation(**options) -> SegmentationProtocol:
    return SegmentationProtocol(**{"lrs": [1e-3, 1e-2], "weight_decays": [0.0, 1e-3], "epochs": 2, **options})


def counting(**options) -> CountingProtocol:
    options = {
        "linear": {"lrs": [0.01, 0.1], "weight_decays": [0.0], "epochs": 2},
        "attentive": {"lrs": [1e-3], "weight_decays": [0.0], "num_heads": 2, "epochs": 1},
        **options,
    }
    return CountingProtocol(**options)


def test_segmentation_and_counting_run_end_to_end_on_dense_shapes_and_write_miou_and_counts(
    checkpoint, tmp_path, capsys
):
    out = tmp_path / "out"
    results = Evaluation(
        str(checkpoint),
        [segmentation(last_blocks=2), counting()],
        data=data(),
        output_dir=str(out),
        accelerator="cpu",
    ).run()
    printed = capsys.readouterr().out
    seg, count = results
    for result in results:
        assert read_results(out / f"{result['name']}.json") == json.loads(json.dumps(result))
    ceiling = f"(ceiling {100 * seg['ceiling_miou']:.2f})"
    assert f"segmentation: test mIoU {100 * seg['test_miou']:.2f} {ceiling}, pixel accuracy" in printed
    masks = data().dataset("test", TINY_MODEL["image_size"]).masks  # the ceiling of the test split, 4 x 4 tokens
    assert seg["ceiling_miou"] == token_grid_ceiling(masks, (4, 4), 11)["miou"]
    assert len(seg["heads"]) == 4 and seg["num_classes"] == 11  # background + 10 shape classes
    assert seg["val_miou"] == max(head["val_miou"] for head in seg["heads"])
    assert seg["selected"] == next(h["name"] for h in seg["heads"] if h["val_miou"] == seg["val_miou"])
    assert all(h["settings"]["last_blocks"] == 2 and h["settings"]["batch_norm"] for h in seg["heads"])
    assert 0 < seg["test_miou"] <= 1 and 0 < seg["test_pixel_accuracy"] <= 1 and len(seg["test_iou"]) == 11
    assert ["train", "patches"] in seg["features"]["extracted"]

    assert count["count_classes"] == [1, 2, 3]
    assert {h["settings"]["probe"] for h in count["heads"]} == {"linear", "attentive"} and len(count["heads"]) == 3
    assert set(count["probes"]) == {"linear", "attentive"}
    assert count["val_top1"] == max(h["val_top1"] for h in count["heads"])
    assert count["test_top1"] == count["probes"][count["selected"].split("/")[0]]["test_top1"]
    assert count["settings"]["linear"]["augment"] is False and count["settings"]["attentive"]["num_heads"] == 2


def test_raw_pixel_patches_are_a_segmentation_and_counting_baseline(tmp_path):
    results = Evaluation(
        PIXELS,
        [segmentation(), counting()],
        data=EvalData(ShapesSource(**DENSE), image_size=32, batch_size=16, num_workers=0, val_fraction=0.25, seed=1),
        output_dir=str(tmp_path),
        accelerator="cpu",
        cache=False,
    ).run()
    assert results[0]["checkpoint"]["format"] == PIXELS and 0 < results[0]["test_miou"] <= 1
    assert 0 <= results[1]["test_top1"] <= 1


def test_augmented_training_crops_and_flips_each_mask_with_its_image(checkpoint, tmp_path):
    source = ShapesSource(**{**DENSE, "background": "plain"})
    data = EvalData(source, batch_size=16, num_workers=0, val_fraction=0.25, augment_scale=(0.3, 1.0))
    encoder = PixelEncoder(32, 8)
    ctx = EvalContext(Fabric(accelerator="cpu", devices=1), encoder, data, FeatureCache(None, {}), 32, 0)
    view = ctx.with_target("masks", "test")
    agreements = []
    for tokens, masks in view.augmented_batches(0, 16, "patches", 1):
        images = tokens.view(16, 4, 4, 3, 8, 8).permute(0, 3, 1, 4, 2, 5).reshape(16, 3, 32, 32)
        for image, mask in zip(images, masks):  # a plain background: shape pixels are far from its colour
            colour = image[:, mask == 0].median(1).values
            far = (image - colour[:, None, None]).norm(dim=0) > 0.8
            agreements.append(float((far == (mask > 0)).float().mean()))
    # pixels at the shapes' edges (bilinear image, nearest mask) disagree; a mask flipped apart: 0.73 on average
    assert min(agreements) > 0.9 and sum(agreements) / len(agreements) > 0.94, agreements
    assert not torch.equal(masks, view.features("train", "patches", 1)[1][view.train_idx][:16].long())
    result = Evaluation(
        str(checkpoint), [segmentation(augment=True, epochs=1)], data=data, output_dir=str(tmp_path), accelerator="cpu"
    ).run()[0]
    assert result["steps"] >= 1 and 0 < result["test_miou"] <= 1


# An oracle: images whose first channel is each pixel's class, constant over 4 x 4 patches, with
# masks that ignore a few pixels, 1 to 3 foreground patches (the count) and labels unrelated to it.
SIZE, PATCH, CLASSES = 16, 4, 4


class PatchClasses(Dataset):
    def __init__(self, size: int, seed: int, counts_known: bool = True):
        self.items, g = [], torch.Generator().manual_seed(seed)
        for i in range(size):
            count = 1 + (i // 2) % 3
            patches = torch.zeros(16, dtype=torch.int64)
            patches[torch.randperm(16, generator=g)[:count]] = torch.randint(1, CLASSES, (count,), generator=g)
            classes = patches.view(4, 4).repeat_interleave(PATCH, 0).repeat_interleave(PATCH, 1)
            mask = classes.clone()
            mask[torch.rand(SIZE, SIZE, generator=g) < 0.05] = IGNORE_INDEX
            image = torch.stack([classes.float(), torch.zeros(SIZE, SIZE), torch.zeros(SIZE, SIZE)])
            target = {"label": i % 2, "mask": mask, "count": count if counts_known else -1}
            self.items.append((image, target))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


class OracleData(EvalData):
    def __init__(self, counts_known: bool = True):
        super().__init__(batch_size=16, num_workers=0, val_fraction=0.25)
        self.counts_known = counts_known

    def _splits(self, size, augment):
        self.num_classes = 2
        return PatchClasses(96, 0, self.counts_known), PatchClasses(48, 1, self.counts_known)


class OracleEncoder(FrozenEncoder):
    """Tokens: the share of each class in the patch (``noise``: random tokens); pooled feature:
    the one-hot number of foreground patches."""

    def __init__(self, noise: bool = False):
        super().__init__()
        self.image_size, self.patch_size, self.depth, self.width, self.noise = SIZE, PATCH, 1, CLASSES, noise

    def block_tokens(self, images, last_blocks, frame_times=None):
        if self.noise:
            g = torch.Generator().manual_seed(int(images.sum() * 1000) % 2**31)
            return torch.randn(images.size(0), 1, 16, CLASSES, generator=g)
        onehot = F.one_hot(images[:, 0].round().long(), CLASSES).permute(0, 3, 1, 2).float()
        return F.avg_pool2d(onehot, PATCH).flatten(2).transpose(1, 2).unsqueeze(1)

    def tokens(self, images, frame_times=None):
        return self.block_tokens(images, 1)[:, 0]

    def block_means(self, images, last_blocks, frame_times=None):
        foreground = (self.tokens(images)[..., 0] < 0.5).sum(1)
        return F.one_hot(foreground, 17).float().unsqueeze(1)


def oracle_context(noise: bool = False, counts_known: bool = True) -> EvalContext:
    fabric = Fabric(accelerator="cpu", devices=1)
    return EvalContext(fabric, OracleEncoder(noise), OracleData(counts_known), FeatureCache(None, {}), SIZE, 0)


def test_segmentation_reaches_miou_near_1_on_tokens_that_hold_the_patch_class_and_not_on_noise():
    protocol = lambda: SegmentationProtocol(lrs=[0.1, 1.0], weight_decays=[0.0], epochs=20)  # noqa: E731
    oracle = protocol().run(oracle_context())
    assert oracle["num_classes"] == CLASSES
    # Not 1: bilinear upsampling gives a lone patch's corner pixels to its neighbours (0.625^2 of
    # their weight is its own); logits that one-hot the patch class score 0.915 mIoU here.
    assert oracle["test_miou"] > 0.9 and oracle["test_pixel_accuracy"] > 0.98, oracle
    noise = protocol().run(oracle_context(noise=True))
    assert noise["test_miou"] < 0.5, noise


def test_counting_predicts_the_count_not_the_label_from_features_that_hold_it():
    result = CountingProtocol(probes=["linear"], linear={"lrs": [0.3, 1.0], "weight_decays": [0.0], "epochs": 20}).run(
        oracle_context()
    )
    assert result["count_classes"] == [1, 2, 3]
    assert result["test_top1"] > 0.95, result  # labels (i % 2) are unrelated to the count: ~1/3 if misread


def test_counting_refuses_data_without_counts_and_segmentation_data_without_masks(checkpoint, tmp_path):
    with pytest.raises(
        ValueError, match=r"needs object counts: .* does not know them \(96 of 96 train images have count -1\)"
    ):
        CountingProtocol(probes=["linear"]).run(oracle_context(counts_known=False))
    flat = EvalData(ShapesSource(train_size=64, val_size=32), batch_size=16, num_workers=0)
    options = {"data": flat, "output_dir": str(tmp_path), "accelerator": "cpu"}
    with pytest.raises(ValueError, match=r"counting \(counting\) needs object counts: .*dense: true"):
        Evaluation(str(checkpoint), [counting()], **options).run()
    with pytest.raises(
        ValueError, match=r"needs masks: data.source ShapesSource gives none; set .*dense: true.*masks:"
    ):
        Evaluation(str(checkpoint), [segmentation()], **options).run()


def write_cells(images: Path, masks: Path, split: str, per_class: int, seed: int) -> None:
    """32 x 32 images of 8 x 8 cells, each of a class 0..2 drawn at random (class c: channel c lit), in
    two image classes, and their index-PNG masks at the same relative paths under ``masks``."""
    g = torch.Generator().manual_seed(seed)
    for label in ("a", "b"):
        for index in range(per_class):
            cells = torch.randint(0, 3, (4, 4), generator=g)
            classes = cells.repeat_interleave(8, 0).repeat_interleave(8, 1).numpy().astype(np.uint8)
            image = np.stack([(classes == c) * 255 for c in range(3)], -1).astype(np.uint8)  # class c: channel c
            for root, picture in ((images, Image.fromarray(image)), (masks, Image.fromarray(classes, mode="L"))):
                (root / split / label).mkdir(parents=True, exist_ok=True)
                picture.save(root / split / label / f"{index:02d}.png")


def cell_segmentation(images: Path, masks: Path, out: Path, num_classes: int | None) -> dict:
    protocol = SegmentationProtocol(lrs=[0.1], weight_decays=[0.0], epochs=20, num_classes=num_classes)
    data = EvalData(
        ImageFolderSource(str(images), masks=str(masks)),
        image_size=32,
        batch_size=8,
        num_workers=0,
        val_fraction=0.25,
    )
    return Evaluation(PIXELS, [protocol], data=data, output_dir=str(out), accelerator="cpu", cache=False).run()[0]


@pytest.mark.parametrize("num_classes", [None, 4])
def test_a_test_mask_label_outside_the_training_classes_is_named_and_ignored_as_mmsegmentation_ignores_it(
    tmp_path, num_classes
):
    images, masks, clean = tmp_path / "images", tmp_path / "masks", tmp_path / "clean"
    write_cells(images, masks, "train", 8, 0)
    write_cells(images, masks, "val", 2, 1)  # the test split
    shutil.copytree(masks, clean)
    stray = masks / "val" / "b" / "01.png"
    values = np.array(Image.open(stray))
    values[4:8, 8:12] = 7  # one 4 x 4 patch of a class the train split never shows
    Image.fromarray(values, mode="L").save(stray)
    values[4:8, 8:12] = IGNORE_INDEX  # the same pixels, ignored by the masks themselves
    Image.fromarray(values, mode="L").save(clean / "val" / "b" / "01.png")

    with pytest.warns(UserWarning) as caught:
        found = cell_segmentation(images, masks, tmp_path / "stray", num_classes)
    known = "1 + the largest class id of the train split's masks" if num_classes is None else "num_classes=4"
    classes = num_classes or 3
    assert [str(w.message) for w in caught if "outside the classes" in str(w.message)] == [
        f"segmentation: 1 test mask(s) hold label(s) [7] outside the classes 0..{classes - 1} ({known}); their 16 "
        f"pixels are ignored, as mmsegmentation ignores them (ignore_index 255): {stray}: label 7 (16 pixels). Fix "
        "those masks (then evaluate with --cache false: the feature cache holds the masks as read), or set "
        "num_classes to score such labels as classes."
    ]
    assert found["ignored_test_labels"] == {"7": 16}
    assert found["num_classes"] == classes and len(found["test_iou"]) == classes  # one IoU per class the heads know

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*outside the classes")
        expected = cell_segmentation(images, clean, tmp_path / "clean_out", num_classes)
    assert expected["ignored_test_labels"] == {}
    assert found["test_miou"] == expected["test_miou"] and found["test_iou"] == expected["test_iou"]
    assert found["test_pixel_accuracy"] == expected["test_pixel_accuracy"]
    assert found["val_miou"] == expected["val_miou"]


def run_cli(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "protocol, dense, expected",
    [
        ({"class_path": "ijepa.evaluation.SegmentationProtocol"}, False, "needs masks: data.source ShapesSource"),
        ({"class_path": "ijepa.evaluation.SegmentationProtocol", "init_args": {"lrs": []}}, True, "lrs must hold"),
        (
            {"class_path": "ijepa.evaluation.SegmentationProtocol", "init_args": {"last_blocks": 3}},
            True,
            "last_blocks must be in 1..2 (the encoder's depth), got 3",
        ),
        (
            {"class_path": "ijepa.evaluation.CountingProtocol", "init_args": {"linear": {"augment": True}}},
            True,
            "augment must be false for counting",
        ),
        (
            {"class_path": "ijepa.evaluation.CountingProtocol", "init_args": {"attentive": {"weight_decays": []}}},
            True,
            "weight_decays must hold at least one value",
        ),
    ],
    ids=["no-masks", "zero-heads", "last-blocks-above-depth", "augmented-counts", "zero-weight-decays"],
)
def test_bad_dense_input_is_one_line_naming_it(checkpoint, tmp_path, capsys, protocol, dense, expected):
    source = {"class_path": "ijepa.data.ShapesSource", "init_args": {**DENSE, "dense": dense}}
    args = ["--checkpoint", str(checkpoint), "--output_dir", str(tmp_path), "--accelerator", "cpu"]
    args += ["--data.source", json.dumps(source), "--data.num_workers", "0", "--data.batch_size", "16"]
    err = run_cli([*args, "--protocols", json.dumps([protocol])], capsys)
    assert expected in err.splitlines()[0], err


@pytest.mark.parametrize("overlay", [None, "segmentation", "counting"])
def test_the_dense_shapes_config_builds_segmentation_and_counting_on_a_dense_source(overlay):
    configs = [ROOT / "configs/eval/dense_shapes.yaml"]
    configs += [ROOT / f"configs/eval/protocols/{overlay}.yaml"] if overlay else []
    args = [arg for config in configs for arg in ("--config", str(config))]
    parser = build_parser()
    init = getattr(parser, "instantiate", parser.instantiate_classes)(
        parser.parse_args([*args, "--checkpoint", "x.ckpt"])
    )
    kinds = [p.kind for p in init["protocols"]]
    assert kinds == ([overlay] if overlay else ["segmentation", "counting"])
    assert sorted(protocol_kinds()) == sorted([*protocol_kinds("labels"), "segmentation", "counting"])
    source = init["data"].source
    assert isinstance(source, ShapesSource) and source.dense and source.num_objects == (1, 4)
