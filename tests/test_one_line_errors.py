"""The project's own errors reach the user as one line and exit status 2, from every command; an
error raised by a library below it keeps its traceback (it is a bug to report, not advice)."""

import errno
import functools
import json

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from helpers import one_line

from ijepa.cli import main
from ijepa.evaluation.runner import main as evaluate
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA
from ijepa.option_errors import raised_by_project

CONFIG = str(TINY_CONFIG)


def test_a_missing_ckpt_path_is_one_line(capsys, tmp_path):
    err = one_line(capsys, main, ["fit", "--config", CONFIG, f"--ckpt_path={tmp_path / 'nothing.ckpt'}"])
    assert err == f"error: ckpt_path={str(tmp_path / 'nothing.ckpt')!r} is not a file."


def test_a_diverging_fit_names_its_checkpoint_in_one_line(capsys, tmp_path):
    args = [
        "fit",
        "--config",
        CONFIG,
        "--model.optim.lr=1e3",
        "--trainer.max_steps=12",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    err = one_line(capsys, main, args + ["--trainer.check_val_every_n_epoch=100"])
    assert err.startswith("error: non-finite") and "at step" in err, err


def test_a_full_disk_under_the_feature_cache_is_one_line_from_eval(capsys, tmp_path, monkeypatch):
    checkpoint = save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path / "tiny.ckpt")
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if "features" in str(getattr(f, "name", f)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    args = ["--checkpoint", str(checkpoint), "--output_dir", str(tmp_path / "out"), "--accelerator", "cpu"]
    args += ["--data.source", json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 64}})]
    args += ["--data.num_workers", "0", "--protocols", '[{"class_path": "ijepa.evaluation.KNNProtocol"}]']
    err = one_line(capsys, evaluate, args)
    assert err.startswith("error: could not write the feature cache ") and err.endswith("(--cache false)."), err


def test_an_error_from_below_the_project_keeps_its_traceback(tmp_path, monkeypatch):
    def library_bug(*args, **kwargs):  # raised outside the ijepa package
        raise ValueError("a library's own failure")

    monkeypatch.setattr(L.Trainer, "fit", functools.wraps(L.Trainer.fit)(library_bug))
    with pytest.raises(ValueError, match="a library's own failure") as error:
        main(["fit", "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    assert not raised_by_project(error.value)
    assert raised_by_project(a_project_error())


def a_project_error() -> ValueError:
    from ijepa.nn.checks import check_range

    try:
        check_range(-1, "x", 0)
    except ValueError as error:
        return error
    raise AssertionError("check_range accepted -1 for x >= 0")


def test_an_unwritable_default_root_dir_is_refused_before_the_run_in_one_line(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")  # a file where the folder would go: unwritable for any user, root too
    err = one_line(capsys, main, ["fit", "--config", CONFIG, f"--trainer.default_root_dir={blocker / 'run'}"])
    assert err == (
        f"error: trainer.default_root_dir: cannot write the run's logs and checkpoints to {blocker / 'run'} "
        f"(NotADirectoryError: {blocker} is a file, not a folder); point it at a writable folder."
    )


@pytest.mark.parametrize("option", ["output_dir", "cache_dir"])
def test_an_unwritable_eval_folder_is_refused_before_any_extraction(capsys, tmp_path, option, monkeypatch):
    checkpoint = save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path / "tiny.ckpt")
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    extracted = []
    monkeypatch.setattr("ijepa.evaluation.cache.FeatureCache.get", lambda *a, **k: extracted.append(a))
    args = ["--checkpoint", str(checkpoint), "--accelerator", "cpu", f"--{option}", str(blocker / "out")]
    args += ["--protocols", '[{"class_path": "ijepa.evaluation.KNNProtocol"}]']
    if option == "cache_dir":
        args += ["--output_dir", str(tmp_path / "out")]
    err = one_line(capsys, evaluate, args)
    assert err == (
        f"error: {option}: cannot write to {blocker / 'out'} (NotADirectoryError: {blocker} is a file, not a folder); "
        f"point --{option} at a writable folder."
    )
    assert extracted == []
    if option == "cache_dir":  # no cache: nothing to write there
        evaluate_args = [*args, "--cache", "false", "--data.num_workers", "0"]
        evaluate_args += [
            "--data.source",
            json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 64}}),
        ]
        monkeypatch.undo()
        assert evaluate(evaluate_args)[0]["protocol"] == "knn"


class _CheckedItems(torch.utils.data.Dataset):
    """Items whose check is the project's (``ijepa.nn.checks``) or this file's own."""

    def __init__(self, ours: bool):
        self.ours = ours

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        from ijepa.nn.checks import check_range

        if self.ours:
            check_range(-1, "data.example", 0)
        raise ValueError("a library's own message")


def test_an_error_the_project_raises_in_a_dataloader_worker_is_one_line_without_the_workers_traceback():
    from ijepa.option_errors import one_line, raised_by_project

    for ours in (True, False):
        loader = torch.utils.data.DataLoader(_CheckedItems(ours), num_workers=1)
        with pytest.raises(ValueError) as caught:
            next(iter(loader))
        assert str(caught.value).startswith("Caught ValueError in DataLoader worker process 0")
        assert raised_by_project(caught.value) == ours
        if ours:
            line = one_line(caught.value)
            assert line.startswith("data.example") and "got -1" in line and "Traceback" not in line
            assert line.endswith("(in DataLoader worker process 0)") and "\n" not in line
