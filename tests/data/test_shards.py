"""Sharded data (ijepa prepare, ShardsSource): shards give the image folder's images, labels,
order and runs, bit for bit, and refuse bad input with a message naming it."""

from pathlib import Path
from unittest import mock

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from conftest import TINY_CONFIG, TINY_MODEL
from lightning.pytorch.callbacks import ModelCheckpoint
from PIL import Image
from test_datamodule import write_stl10
from test_resume import Recorder, Stop

from ijepa.callbacks import EMATargetUpdate
from ijepa.cli import build_cli, main
from ijepa.data import IJEPADataModule, ImageFolderSource, ShardsSource, STL10Source
from ijepa.data.imagefolder import RobustImageFolder
from ijepa.data.sampling import EpochSampler
from ijepa.data.shapes import CLASSES, ShapesDataset
from ijepa.data.shards import INDEX_FILE, ShardImages
from ijepa.module import IJEPA

pytest.importorskip("litdata", reason="shards need the 'shards' extra")


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


def datamodule(source, **overrides) -> IJEPADataModule:
    kwargs = dict(image_size=32, patch_size=8, batch_size=8, num_workers=0, crop_scale=None, min_keep=2)
    kwargs.update(target_scale=(0.1, 0.15), **overrides)
    return IJEPADataModule(source=source, **kwargs)


@pytest.fixture(scope="module")
def folder_and_shards(tmp_path_factory):
    """Two classes of 10 JPEGs and their shards, written by two processes."""
    root = tmp_path_factory.mktemp("shards")
    folder = write_folder(root / "jpeg", 10)
    return folder, prepare(folder, root / "shards", "--num-workers", "2", "--chunk-bytes", "4KB")


# --- writing and reading ---------------------------------------------------------------------
def test_shards_hold_the_folder_images_pixels_and_labels_in_order(folder_and_shards):
    folder, shards = folder_and_shards
    assert len(list((shards / "train").glob("chunk-1-*.bin"))) > 0  # the second writer wrote chunks too
    images = RobustImageFolder(str(folder))
    read = ShardImages(str(shards / "train"), images.targets, images.classes)
    assert len(read) == len(images) == 20
    for index in range(len(images)):
        (mine, label), (theirs, their_label) = read[index], images[index]
        assert label == their_label
        assert np.array_equal(np.asarray(mine), np.asarray(theirs)), f"image {index} differs"


def test_every_split_of_shards_equals_the_image_folder_split(folder_and_shards):
    folder, shards = folder_and_shards
    ours, theirs = datamodule(ShardsSource(str(shards))), datamodule(ImageFolderSource(str(folder)))
    ours.setup("fit")
    theirs.setup("fit")
    assert ours.num_classes == theirs.num_classes == 2
    for name in ("pretrain", "val", "knn_train", "knn_test"):
        a, b = ours.split(name), theirs.split(name)
        assert len(a) == len(b)
        for index in range(len(a)):
            assert torch.equal(a[index][0], b[index][0]) and a[index][1] == b[index][1], (name, index)


def test_train_and_val_folders_are_written_as_two_splits_numbered_by_train(tmp_path):
    write_folder(tmp_path / "src" / "train", 4, classes=("circle", "square"))
    write_folder(tmp_path / "src" / "val", 2, classes=("square",), split="val")
    shards = prepare(tmp_path / "src", tmp_path / "shards")
    data = datamodule(ShardsSource(str(shards)))
    data.setup("fit")
    assert len(data.split("pretrain")) == 8 and data.split("knn_test").targets == [1, 1]


def test_loose_png_images_are_unlabelled_shards_pretrained_on_whole(tmp_path):
    shards = prepare(write_folder(tmp_path / "loose", 12, classes=None, suffix="png"), tmp_path / "shards")
    data = datamodule(ShardsSource(str(shards)))
    data.setup("fit")
    assert data.num_classes == 0 and len(data.split("pretrain")) == 12
    assert data.split("pretrain")[0][1] == -1


def test_stl10_splits_written_as_png_shards_give_the_stl10_images_and_labels(tmp_path):
    write_stl10(tmp_path / "stl")
    shards = prepare(tmp_path / "stl", tmp_path / "shards", "--split", "train", "--val-split", "test")
    ours = datamodule(ShardsSource(str(shards)), image_size=96)
    theirs = datamodule(STL10Source(str(tmp_path / "stl")), image_size=96)
    assert ours.split("knn_train").classes == theirs.split("knn_train").classes
    for name in ("knn_train", "knn_test"):
        a, b = ours.split(name), theirs.split(name)
        assert len(a) == len(b) > 0
        for index in range(len(a)):
            assert torch.equal(a[index][0], b[index][0]) and a[index][1] == b[index][1], (name, index)


def test_two_ranks_samplers_over_shards_take_disjoint_shares_that_cover_the_epoch(folder_and_shards):
    data = datamodule(ShardsSource(str(folder_and_shards[1])))
    pretrain = data.split("pretrain")
    shares = [[index for index, _ in EpochSampler(pretrain, 4, num_replicas=2, rank=rank, seed=3)] for rank in (0, 1)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(len(pretrain)))


def test_a_shard_split_pickles_without_its_open_stream(folder_and_shards):
    import pickle

    data = datamodule(ShardsSource(str(folder_and_shards[1])))
    dataset = data.split("pretrain").dataset
    dataset[0]
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._stream is None and torch.equal(copy[3][0], dataset[3][0])


# --- whole runs ------------------------------------------------------------------------------
def fit(root: Path, source: dict) -> tuple[list[float], dict]:
    """A 5-step `ijepa fit` of the tiny config on ``source`` (an epoch of 4 batches and a validation,
    then one more); its train losses and final weights."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["trainer"].update(
        max_steps=5,
        default_root_dir=str(root),
        callbacks=[
            {"class_path": "ijepa.callbacks.EMATargetUpdate"},
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
        ],
        logger={"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root)}},
    )
    config["data"].update(source=source, batch_size=4)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["fit", "--config", str(root / "config.yaml")])
    metrics = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()
    column = metrics[0].split(",").index("train/loss")
    losses = [float(row.split(",")[column]) for row in metrics[1:] if row.split(",")[column]]
    return losses, torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)["state_dict"]


@pytest.mark.slow
def test_a_run_on_shards_equals_the_same_run_on_the_folder_bit_for_bit(folder_and_shards, tmp_path):
    folder, shards = folder_and_shards
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    on_folder = fit(tmp_path / "a", {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(folder)}})
    on_shards = fit(tmp_path / "b", {"class_path": "ijepa.data.ShardsSource", "init_args": {"root": str(shards)}})
    assert len(on_folder[0]) == 5 and on_shards[0] == on_folder[0]
    for name, weights in on_folder[1].items():
        assert torch.equal(on_shards[1][name], weights), name


def make(root: Path, shards: Path, recorder: Recorder):
    L.seed_everything(0)
    model = IJEPA(**TINY_MODEL, warmup_steps=2, drop_path_rate=0.1)
    data = datamodule(ShardsSource(str(shards)), batch_size=4, crop_scale=(0.5, 1.0), horizontal_flip=True)
    trainer = L.Trainer(
        max_steps=7,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[
            EMATargetUpdate(momentum=0.9),
            recorder,
            ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=6, save_top_k=-1),
        ],
        default_root_dir=root,
    )
    return model, data, trainer


@pytest.mark.slow
def test_a_run_on_shards_resumed_mid_epoch_equals_the_uninterrupted_run(folder_and_shards, tmp_path):
    shards = folder_and_shards[1]  # 16 training images: 4 batches an epoch; the stop falls inside epoch 1
    full = Recorder()
    model, data, trainer = make(tmp_path / "full", shards, full)
    trainer.fit(model, datamodule=data)
    final = {name: weights.clone() for name, weights in model.state_dict().items()}
    stopped = Recorder(stop_at=6)
    model, data, trainer = make(tmp_path / "resume", shards, stopped)
    with pytest.raises(Stop):
        trainer.fit(model, datamodule=data)
    resumed = Recorder()
    model, data, trainer = make(tmp_path / "resume", shards, resumed)
    trainer.fit(model, datamodule=data, ckpt_path=tmp_path / "resume" / "ckpt" / "epoch=1-step=6.ckpt")
    assert sorted(resumed.losses) == [7]
    assert resumed.batches[7] == full.batches[7] and resumed.losses[7] == full.losses[7]
    for name, weights in trainer.lightning_module.state_dict().items():
        assert torch.equal(weights, final[name]), name


# --- bad input -------------------------------------------------------------------------------
def error_line(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["prepare", *args])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_prepare_refuses_a_missing_source(capsys, tmp_path):
    line = error_line(capsys, str(tmp_path / "nothing"), str(tmp_path / "out"))
    assert line.startswith("error: SRC=") and "is not a directory" in line


def test_prepare_refuses_a_destination_that_is_not_empty(capsys, tmp_path, folder_and_shards):
    line = error_line(capsys, str(folder_and_shards[0]), str(folder_and_shards[1]))
    assert line.startswith("error: DEST=") and "is not an empty folder" in line


def test_prepare_without_litdata_says_how_to_install_it(capsys, tmp_path, folder_and_shards):
    with mock.patch.dict("sys.modules", {"litdata": None}):
        line = error_line(capsys, str(folder_and_shards[0]), str(tmp_path / "out"))
    assert "needs litdata" in line and "pip install -e '.[shards]'" in line


def test_a_missing_shard_folder_is_an_error_naming_the_option(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"shard folder not found: data.source.root='.*nothing' is not a dir"):
        datamodule(ShardsSource(str(tmp_path / "nothing"))).setup("fit")


def test_fit_on_a_folder_that_is_not_shards_names_the_option_and_the_missing_index(tmp_path, folder_and_shards):
    args = ["fit", "--config", str(TINY_CONFIG), f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    args += ["--data.source=ijepa.data.ShardsSource", f"--data.source.root={folder_and_shards[0]}"]
    with mock.patch("sys.argv", ["ijepa"]), pytest.raises(ValueError) as error:
        build_cli(args)
    assert str(error.value).startswith(f"data.source.root='{folder_and_shards[0]}' is not a folder of ijepa shards")
    assert INDEX_FILE in str(error.value)


def test_probe_shards_with_another_class_index_are_refused_naming_both(tmp_path, folder_and_shards):
    other = prepare(write_folder(tmp_path / "other", 4, classes=("circle", "star")), tmp_path / "probe")
    data = datamodule(ShardsSource(str(folder_and_shards[1])), probe_source=ShardsSource(str(other)))
    with pytest.raises(ValueError) as error:
        data.setup("fit")
    assert str(error.value).startswith(
        f"data.probe_source.root='{other}' was written with another class index than "
        f"data.source.root='{folder_and_shards[1]}': ['circle', 'star'] against ['circle', 'ring']."
    )
