"""`ijepa eval` never trusts a wrong score and its feature cache never blocks it: non-finite
weights are refused, non-finite features never cached, an unreadable cache file is re-extracted,
a killed write's temporary removed, a full disk names the way out."""

import errno
import json

import pytest
import torch
from conftest import TINY_MODEL
from lightning.fabric import Fabric

from ijepa.data.sources import ShapesSource
from ijepa.evaluation import EvalData, Evaluation, KNNProtocol
from ijepa.evaluation.cache import FeatureCache
from ijepa.evaluation.runner import main
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA

SOURCE = {"train_size": 160, "val_size": 64}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("faults") / "tiny.ckpt")


def evaluate(checkpoint, tmp_path, **options):
    data = EvalData(source=ShapesSource(**SOURCE), batch_size=32, num_workers=0, val_fraction=0.2)
    options = {"data": data, "output_dir": str(tmp_path / "out"), "accelerator": "cpu", **options}
    return Evaluation(str(checkpoint), [KNNProtocol(ks=[5])], **options).run()[0]


def test_a_nan_in_the_evaluated_encoder_is_refused_in_one_line_naming_the_tensor_and_nothing_is_cached(
    checkpoint, tmp_path, capsys
):
    poisoned = tmp_path / "nan.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    saved["state_dict"]["target_encoder.patch_embed.proj.weight"][0, 0, 0, 0] = float("nan")
    torch.save(saved, poisoned)
    args = ["--checkpoint", str(poisoned), "--output_dir", str(tmp_path / "out"), "--accelerator", "cpu"]
    args += ["--data.source", json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": SOURCE})]
    args += ["--data.num_workers", "0", "--protocols", '[{"class_path": "ijepa.evaluation.KNNProtocol"}]']
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"error: checkpoint={str(poisoned)!r}: its target encoder holds non-finite weights (1 tensor with NaN or inf: "
        "patch_embed.proj.weight); refusing to evaluate it."
    ), err
    assert not list(tmp_path.rglob("*.pt"))
    # the online encoder is finite: it may be evaluated
    assert evaluate(poisoned, tmp_path / "online", encoder="online")["test_top1"] >= 0


def fabric():
    return Fabric(accelerator="cpu", devices=1)


def test_non_finite_features_are_refused_and_never_written(tmp_path):
    cache = FeatureCache(tmp_path, {"checkpoint": "x"})
    features = torch.ones(4, 2, 8)
    features[1, 0, 3] = float("inf")
    with pytest.raises(FloatingPointError, match=r"^the train split's blocks features hold 1 non-finite values"):
        cache.get(fabric(), "train", "blocks", 1, lambda: {"features": features, "labels": torch.zeros(4)})
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_or_non_finite_cache_file_is_named_then_extracted_again_and_replaced(checkpoint, tmp_path):
    first = evaluate(checkpoint, tmp_path)
    files = sorted((tmp_path / "out" / "features").glob("*.pt"))
    assert len(files) == 2 and sorted(map(tuple, first["features"]["extracted"])) == [
        ("test", "blocks"),
        ("train", "blocks"),
    ]
    truncated, poisoned = files
    truncated.write_bytes(truncated.read_bytes()[:100])
    entry = torch.load(poisoned, weights_only=True)
    entry["features"][0] = float("nan")
    torch.save(entry, poisoned)
    with pytest.warns(UserWarning) as warned:
        again = evaluate(checkpoint, tmp_path)
    messages = [str(w.message) for w in warned]
    assert any(m.startswith(f"the feature cache {truncated} cannot be read") for m in messages), messages
    assert any(m.startswith(f"the feature cache {poisoned} holds non-finite features") for m in messages), messages
    assert len(again["features"]["extracted"]) == 2 and again["test_top1"] == first["test_top1"]
    # replaced: the next run reads both
    assert len(evaluate(checkpoint, tmp_path)["features"]["reused"]) == 2


def test_a_temporary_left_by_a_killed_write_is_removed_by_the_next_evaluation(checkpoint, tmp_path):
    folder = tmp_path / "out" / "features"
    folder.mkdir(parents=True)
    dead = folder / ".train-blocks-0123456789ab.pt.tmp-4194999"  # above Linux's largest pid: no such writer
    dead.write_bytes(b"half a tensor")
    alive = folder / ".train-blocks-0123456789ab.pt.tmp-1"  # pid 1 runs: another evaluation's write in progress
    alive.write_bytes(b"being written")
    evaluate(checkpoint, tmp_path)
    assert not dead.exists() and alive.exists()


def test_a_full_disk_during_the_cache_write_names_the_cache_options_not_the_trainers(tmp_path, monkeypatch):
    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    cache = FeatureCache(tmp_path, {"checkpoint": "x"})
    with pytest.raises(OSError) as error:
        cache.get(fabric(), "train", "blocks", 1, lambda: {"features": torch.ones(4, 1, 8), "labels": torch.zeros(4)})
    message = str(error.value)
    assert message.startswith(f"could not write the feature cache {tmp_path}/train-blocks-"), message
    assert message.endswith("point --cache_dir at a disk with room, or evaluate without a cache (--cache false).")
    assert "default_root_dir" not in message and list(tmp_path.iterdir()) == []
