"""Sharded data (ijepa prepare, ShardsSource): shards give the image folder's images, labels,
order and runs, bit for bit, and refuse bad input with a message naming it."""

import json
import warnings
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import TINY_CONFIG, tiny_datamodule
from helpers import prepare, write_folder, write_folder_and_shards, write_stl10

from ijepa.cli import build_cli, main
from ijepa.data import IJEPADataModule, ImageFolderSource, ShardsSource, STL10Source
from ijepa.data.imagefolder import RobustImageFolder
from ijepa.data.sampling import EpochSampler
from ijepa.data.shards import INDEX_FILE, ShardImages

pytest.importorskip("litdata", reason="shards need the 'shards' extra")


def datamodule(source, **overrides) -> IJEPADataModule:
    return tiny_datamodule(source=source, **{"batch_size": 8, **overrides})


@pytest.fixture(scope="module")
def folder_and_shards(tmp_path_factory):
    return write_folder_and_shards(tmp_path_factory.mktemp("shards"))


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
    for name in ("pretrain", "val", "probe_train", "probe_test"):
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
    assert len(data.split("pretrain")) == 8 and data.split("probe_test").targets == [1, 1]


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
    assert ours.split("probe_train").classes == theirs.split("probe_train").classes
    for name in ("probe_train", "probe_test"):
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


@pytest.mark.parametrize("fault", ["deleted", "cut"])
def test_a_deleted_or_cut_chunk_is_named_at_setup_before_any_step(tmp_path, folder_and_shards, fault):
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(folder_and_shards[1], copy)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[-1]
    size = chunk.stat().st_size
    if fault == "deleted":
        chunk.unlink()
        problem = "is missing"
    else:
        chunk.write_bytes(chunk.read_bytes()[: size // 2])
        problem = f"holds {size // 2} bytes where index.json records {size}"
    with pytest.raises(ValueError) as error:
        datamodule(ShardsSource(str(copy))).setup("fit")
    assert str(error.value) == (
        f"data.source.root={str(copy)!r}: the chunk {chunk} {problem}; the shards were changed after ijepa prepare. "
        "Restore the file or write the shards again."
    )


def copy_of(shards: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(shards, tmp_path / "shards"))


def flip_bytes(path: Path, start: int, count: int = 16) -> None:
    """Invert ``count`` bytes of the file from ``start``: the same size, other contents."""
    data = bytearray(path.read_bytes())
    data[start : start + count] = bytes(255 - byte for byte in data[start : start + count])
    path.write_bytes(bytes(data))


def without_checksums(shards: Path) -> None:
    """The index as ijepa prepare wrote it before it recorded checksums."""
    index = json.loads((shards / INDEX_FILE).read_text())
    for split in index["splits"].values():
        split.pop("chunk_crc32", None)
    (shards / INDEX_FILE).write_text(json.dumps(index))


def test_prepare_records_the_crc32_of_every_chunk_and_intact_shards_pass_it(folder_and_shards):
    shards = folder_and_shards[1]
    recorded = json.loads((shards / INDEX_FILE).read_text())["splits"]["train"]["chunk_crc32"]
    chunks = [chunk["filename"] for chunk in json.loads((shards / "train" / "index.json").read_text())["chunks"]]
    assert list(recorded) == ["index.json", *chunks] and len(chunks) > 1
    for name, crc in recorded.items():
        assert crc == f"{zlib.crc32((shards / 'train' / name).read_bytes()):08x}", name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no note: these shards have checksums
        datamodule(ShardsSource(str(shards))).setup("fit")


def test_a_chunk_corrupted_in_place_is_named_at_setup_with_its_checksums_and_the_advice_to_prepare_again(
    tmp_path, folder_and_shards
):
    copy = copy_of(folder_and_shards[1], tmp_path)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[-1]
    size = chunk.stat().st_size
    recorded = json.loads((copy / INDEX_FILE).read_text())["splits"]["train"]["chunk_crc32"][chunk.name]
    flip_bytes(chunk, size // 2 - 8)  # image bytes: litdata reads on, the JPEG decodes to other pixels
    assert chunk.stat().st_size == size
    found = f"{zlib.crc32(chunk.read_bytes()):08x}"
    with pytest.raises(ValueError) as error:
        datamodule(ShardsSource(str(copy))).setup("fit")
    assert str(error.value) == (
        f"data.source.root={str(copy)!r}: the chunk {chunk} is corrupt: its CRC-32 is {found} where {INDEX_FILE} "
        f"records {recorded} (it changed after ijepa prepare wrote it). Restore the file or re-run `ijepa prepare` to "
        "write the shards again."
    )


def test_old_shards_without_checksums_still_load_with_one_note(tmp_path, folder_and_shards):
    copy = copy_of(folder_and_shards[1], tmp_path)
    without_checksums(copy)
    with pytest.warns(UserWarning) as caught:
        for _ in range(2):
            data = datamodule(ShardsSource(str(copy)))
            data.setup("fit")
    notes = [str(w.message) for w in caught if "checksums" in str(w.message)]
    assert notes == [
        f"data.source.root={str(copy)!r}: {INDEX_FILE} records no chunk checksums (written before ijepa prepare "
        "recorded them): chunks are checked for their size only; write the shards again to have their contents "
        "checked too."
    ]
    assert len(data.split("pretrain")) > 0 and data.split("pretrain")[0][0].shape[0] == 3


def test_an_item_whose_chunk_litdata_cannot_read_names_the_chunk_and_the_shard_folder(tmp_path, folder_and_shards):
    copy = copy_of(folder_and_shards[1], tmp_path)
    without_checksums(copy)  # shards written before the checksums: setup cannot tell
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[0]
    flip_bytes(chunk, 0)  # the chunk's header: its item count and offsets
    dataset = ShardImages(str(copy / "train"), [0] * 20, ["circle", "ring"])
    with pytest.raises(ValueError) as error:
        dataset[0]
    message = str(error.value)
    assert message.startswith(f"{copy / 'train'} item 0 (chunk {chunk}) cannot be read by litdata (")
    assert message.endswith(
        "the shards were corrupted or changed after ijepa prepare; restore them or re-run `ijepa prepare` to write "
        "them again."
    )
    assert "\n" not in message


@pytest.mark.parametrize(("given", "read"), [("64MB", "64MB"), ("512kb", "512kb"), ("1000000", 1_000_000)])
def test_chunk_bytes_takes_a_count_or_a_unit_and_refuses_the_rest_in_one_line(capsys, tmp_path, given, read):
    from ijepa.data.shards import build_parser

    assert build_parser().parse_args(["src", "dest", "--chunk-bytes", given]).chunk_bytes == read
    with pytest.raises(SystemExit) as stop:
        main(["prepare", str(tmp_path), str(tmp_path / "out"), "--chunk-bytes", "4 parsecs"])
    assert stop.value.code == 2 and "'4 parsecs' is not a size > 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def write_bad_files(folder) -> dict:
    """A corrupt, an empty, a text and a dangling file among ``folder``'s images, by kind."""
    bad = {
        "corrupt": folder / "circle" / "corrupt.png",
        "empty": folder / "circle" / "empty.jpg",
        "text": folder / "ring" / "notes.jpg",
        "dangling": folder / "ring" / "gone.jpg",
    }
    good = sorted((folder / "circle").glob("*.jpg"))[0].read_bytes()
    bad["corrupt"].write_bytes(b"\x89PNG\r\n\x1a\n" + good[:200])
    bad["empty"].write_bytes(b"")
    bad["text"].write_text("not an image")
    bad["dangling"].symlink_to(folder / "nowhere.jpg")
    return bad


def test_prepare_refuses_files_that_do_not_decode_naming_them_and_writes_nothing(capsys, tmp_path):
    folder = write_folder(tmp_path / "src", 4)
    bad = write_bad_files(folder)
    line = error_line(capsys, str(folder), str(tmp_path / "out"))
    assert line.startswith("error: 4 files of SRC cannot be decoded as images: ") and "nothing was written" in line
    for path in bad.values():
        assert str(path) in line
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty_dest").mkdir()  # an empty DEST given: still empty
    error_line(capsys, str(folder), str(tmp_path / "empty_dest"))
    assert list((tmp_path / "empty_dest").iterdir()) == []


def test_prepare_skips_and_lists_files_that_do_not_decode_with_bad_images_skip(capsys, tmp_path):
    import json

    folder = write_folder(tmp_path / "src", 10)
    bad = write_bad_files(folder)
    index = prepare(folder, tmp_path / "out", "--bad-images", "skip")
    written = json.loads((index / INDEX_FILE).read_text())
    assert sorted(written["skipped"]) == sorted(map(str, bad.values())) and written["splits"]["train"]["size"] == 20
    assert "skipping 4 unreadable files" in capsys.readouterr().err
    data = datamodule(ShardsSource(str(index)), batch_size=4)
    data.setup("fit")
    splits = data._splits
    assert len(splits["pretrain"]) + len(splits["val"]) == 20  # every kept image, none lost
    assert all(splits["pretrain"][i][0] is not None for i in range(len(splits["pretrain"])))  # each decodes


def test_a_failed_write_leaves_dest_as_it_was(capsys, tmp_path, monkeypatch):
    import litdata

    folder = write_folder(tmp_path / "src", 4)

    def fails(output_dir, **kwargs):
        Path(output_dir).mkdir(parents=True)
        (Path(output_dir) / "chunk-0-0.bin").write_bytes(b"half")
        raise OSError("the disk went away")

    monkeypatch.setattr(litdata, "optimize", fails)
    error_line(capsys, str(folder), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # so that a rerun does not find it "not empty"


@pytest.mark.parametrize("policy", ["error", "skip"])
def test_old_shards_holding_an_undecodable_item_name_it_or_skip_it(tmp_path, monkeypatch, policy):
    import ijepa.data.shards as shards

    folder = write_folder(tmp_path / "src", 4)
    (sorted((folder / "ring").glob("*.jpg"))[0]).write_bytes(b"not a jpeg")  # ring's first: item 4
    monkeypatch.setattr(shards, "bad_images", lambda paths, workers: {})  # as prepare wrote before it checked
    written = prepare(folder, tmp_path / "out")
    dataset = ShardImages(str(written / "train"), [0] * 8, ["circle", "ring"], bad_images=policy, source="SRC")
    if policy == "error":
        with pytest.raises(
            ValueError,
            match=r"train item 4 \(of SRC\) cannot be decoded .*: the item changed after ijepa prepare wrote it \(shards "
            r"whose index records chunk checksums are checked at setup\), or an older ijepa prepare stored it unchecked.*"
            r"data.source.bad_images=skip",
        ):
            dataset[4]
        return
    with pytest.warns(UserWarning, match=r"skipping .*train item 4 \(of SRC\) cannot be decoded"):
        image, _ = dataset[4]
    assert np.array_equal(np.asarray(image), np.asarray(dataset[5][0]))  # the next item instead
