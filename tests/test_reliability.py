"""Nothing lost, nothing silently wrong: the run-level faults of docs/reliability.md, through the CLI."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL

from ijepa.checkpoint import estimated_checkpoint_bytes, format_bytes
from ijepa.cli import build_cli
from ijepa.module import IJEPA
from ijepa.schedules import warmup_cosine_schedule

CONFIG = str(TINY_CONFIG)
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


def non_finite_tensors(path):
    state = torch.load(path, weights_only=True, map_location="cpu")["state_dict"]
    return [name for name, value in state.items() if not torch.isfinite(value).all()]


@pytest.mark.slow  # two fits
def test_a_diverging_run_names_a_checkpoint_from_before_the_divergence_that_resumes_at_a_lower_lr(tmp_path):
    # lr 1e3 on the tiny model: the loss stays finite for a few steps while the update turns the
    # weights into NaN. The old guard only checked the loss, so the NaN state was saved (and the
    # save deleted the last finite checkpoint). Then it named the newest finite checkpoint, which
    # already held the diverged state: resumed at a lower lr, or at lr 0, its next step was NaN.
    folder = tmp_path / "ckpt"
    with pytest.raises(FloatingPointError, match=r"non-finite .* at step \d+") as error:
        cli(
            "fit",
            "--config",
            CONFIG,
            "--config",
            every_step_config(tmp_path, folder),
            "--model.lr=1e3",
            "--trainer.max_steps=12",
            "--trainer.check_val_every_n_epoch=100",
            f"--trainer.default_root_dir={tmp_path}",
        )
    saved = sorted(folder.glob("*.ckpt"))
    assert saved, "the finite checkpoints written before the divergence must survive"
    for path in saved:
        assert non_finite_tensors(path) == [], path
    message = str(error.value)
    named, step = re.search(r"Resume from the checkpoint before the newest, (\S+) \(step (\d+)\)", message).groups()
    newest = re.search(r"; the newest, (\S+) \(step (\d+)\)", message).groups()
    assert named == str(folder / "previous-last.ckpt") and newest[0] == str(folder / "last.ckpt")
    assert int(step) < int(newest[1]) == torch.load(newest[0], weights_only=True)["global_step"]
    assert torch.load(named, weights_only=True)["global_step"] == int(step)
    # The free-space check at fit start does not underestimate what a save writes.
    assert Path(newest[0]).stat().st_size <= estimated_checkpoint_bytes(IJEPA(**TINY_MODEL))

    # The named checkpoint, resumed at the config's own lr, trains on to finite weights.
    resumed = cli(
        "fit",
        "--config",
        CONFIG,
        "--config",
        every_step_config(tmp_path, tmp_path / "resumed"),
        f"--ckpt_path={named}",
        "--model.lr=2e-3",
        f"--trainer.max_steps={int(step) + 3}",
        "--trainer.check_val_every_n_epoch=100",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert resumed.trainer.global_step == int(step) + 3
    end = resumed.trainer.checkpoint_callback.last_model_path
    assert torch.load(end, weights_only=True)["global_step"] == int(step) + 3 and non_finite_tensors(end) == []


def test_a_checkpoint_with_non_finite_weights_is_refused_at_load_naming_the_file_and_tensors(tmp_path):
    model = IJEPA(**TINY_MODEL)
    state = model.state_dict()
    state["predictor.mask_token"] = torch.full_like(state["predictor.mask_token"], float("nan"))
    state["encoder.patch_embed.proj.weight"][0, 0, 0, 0] = float("inf")
    path = tmp_path / "nan.ckpt"
    torch.save(
        {"state_dict": state, "hyper_parameters": dict(model.hparams), "pytorch-lightning_version": L.__version__},
        path,
    )
    for command in ("validate", "fit"):
        with pytest.raises(ValueError, match=rf"^ckpt_path='{path}' holds non-finite weights \(2 tensors") as error:
            cli(
                command,
                "--config",
                CONFIG,
                f"--ckpt_path={path}",
                f"--trainer.default_root_dir={tmp_path}",
                "--data.source.init_args={train_size: 64, val_size: 32}",
            )
        assert "encoder.patch_embed.proj.weight, predictor.mask_token" in str(error.value)
    assert not list(tmp_path.rglob("*.ckpt*"))[1:]  # nothing trained, nothing saved: only nan.ckpt


def test_a_checkpoint_with_non_finite_weights_is_refused_and_the_previous_one_kept(tmp_path):
    model = cli(
        "fit",
        "--config",
        CONFIG,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=2",
        "--trainer.check_val_every_n_epoch=100",
    ).trainer
    path = tmp_path / "manual.ckpt"
    model.save_checkpoint(path)
    before = path.read_bytes()
    with torch.no_grad():
        model.lightning_module.predictor.mask_token.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"refusing to write .*non-finite.*predictor\.mask_token"):
        model.save_checkpoint(path)
    assert path.read_bytes() == before


def test_resume_flags_win_over_the_checkpoints_hyperparameters(tmp_path):
    first = cli(
        "fit",
        "--config",
        CONFIG,
        f"--trainer.default_root_dir={tmp_path / 'a'}",
        "--trainer.max_steps=4",
        "--trainer.check_val_every_n_epoch=100",
    )
    last = first.trainer.checkpoint_callback.last_model_path
    resumed = cli(
        "fit",
        "--config",
        CONFIG,
        f"--ckpt_path={last}",
        "--model.lr=1e-5",
        "--model.warmup_steps=500",
        "--model.final_weight_decay=0.1",
        f"--trainer.default_root_dir={tmp_path / 'b'}",
        "--trainer.max_steps=6",
        "--trainer.check_val_every_n_epoch=100",
    )
    model = resumed.model
    assert (model.hparams.lr, model.hparams.warmup_steps, model.hparams.final_weight_decay) == (1e-5, 500, 0.1)
    assert model.hparams.depth == 2  # the architecture still comes from the checkpoint
    # The optimizer ran on the new schedule: after 6 steps the lr is step 6 of a 500-step warm-up to 1e-5.
    expected = warmup_cosine_schedule(6, 6, 6, 1e-5, model.hparams.final_lr, model.hparams.start_lr)
    lr = resumed.trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == pytest.approx(expected, rel=1e-6)
    assert lr < 1e-4  # the checkpoint's lr would be 2e-3 here


def test_conflicting_architecture_flags_are_an_error_listing_them(tmp_path):
    first = cli(
        "fit",
        "--config",
        CONFIG,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=1",
        "--trainer.check_val_every_n_epoch=100",
    )
    last = first.trainer.checkpoint_callback.last_model_path
    with pytest.raises(ValueError, match=r"model\.embed_dim=256 \(checkpoint: 32\), model\.depth=4 \(checkpoint: 2\)"):
        cli(
            "validate",
            "--config",
            CONFIG,
            f"--ckpt_path={last}",
            "--model.depth=4",
            "--model.embed_dim=256",
            f"--trainer.default_root_dir={tmp_path}",
        )
    # A run that does not set the architecture gets the checkpoint's, not the defaults (depth 12, width 192).
    no_model = tmp_path / "no_model.yaml"
    no_model.write_text(
        Path(CONFIG).read_text().split("\nmodel:")[0] + "\ndata:" + Path(CONFIG).read_text().split("\ndata:")[1]
    )
    validated = cli(
        "validate", "--config", str(no_model), f"--ckpt_path={last}", f"--trainer.default_root_dir={tmp_path}"
    )
    assert (validated.model.hparams.depth, validated.model.hparams.embed_dim) == (2, 32)


def _start_fit(tmp_path, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    log = open(tmp_path / "fit.log", "w")
    command = [
        sys.executable,
        "-m",
        "ijepa",
        "fit",
        "--config",
        CONFIG,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.check_val_every_n_epoch=100",
        *args,
    ]
    return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_sigterm_saves_a_resumable_checkpoint_and_exits_non_zero(tmp_path):
    steps = 30  # one schedule for all three runs: its length is max_steps
    (tmp_path / "run").mkdir()
    run = _start_fit(tmp_path / "run", f"--trainer.max_steps={steps}")
    log = tmp_path / "run" / "fit.log"
    deadline = time.time() + 300
    while "k-NN probe (random init" not in log.read_text() and time.time() < deadline:
        assert run.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=300) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    saved = list((tmp_path / "run").rglob("preempted.ckpt"))
    assert len(saved) == 1, log.read_text()[-3000:]
    step = torch.load(saved[0], weights_only=True)["global_step"]
    assert 1 <= step < steps, step
    assert f"--ckpt_path {saved[0]}" in log.read_text()

    # Resumed, it ends where an uninterrupted run ends, bit for bit.
    (tmp_path / "resumed").mkdir()
    (tmp_path / "straight").mkdir()
    resumed = _start_fit(tmp_path / "resumed", f"--ckpt_path={saved[0]}", f"--trainer.max_steps={steps}")
    straight = _start_fit(tmp_path / "straight", f"--trainer.max_steps={steps}")
    assert resumed.wait(timeout=300) == 0 and straight.wait(timeout=300) == 0
    ends = [
        torch.load(next((tmp_path / name).rglob("last.ckpt")), weights_only=True) for name in ("resumed", "straight")
    ]
    assert ends[0]["global_step"] == ends[1]["global_step"] == steps
    for key, value in ends[1]["state_dict"].items():
        assert torch.equal(ends[0]["state_dict"][key], value), key


def test_an_unwritable_checkpoint_folder_fails_before_any_training(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the checkpoint folder should go")
    with pytest.raises(OSError, match=r"cannot write checkpoints to .*not_a_folder/ckpt"):
        cli(
            "fit",
            "--config",
            CONFIG,
            "--config",
            every_step_config(tmp_path, blocker / "ckpt"),
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_steps=2",
        )
    assert not list(tmp_path.rglob("*.ckpt"))


def test_partial_files_of_an_interrupted_save_are_removed_with_a_message(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    stale = folder / ".last.ckpt.tmp-999999999"  # no such process: the writer was killed mid-save
    stale.write_bytes(b"half a checkpoint")
    with pytest.warns(UserWarning, match=f"removed a partial checkpoint left by an interrupted save: {stale}"):
        cli(
            "fit",
            "--config",
            CONFIG,
            "--config",
            every_step_config(tmp_path, folder),
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_steps=1",
            "--trainer.check_val_every_n_epoch=100",
        )
    assert not stale.exists()


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A 1 MB folder: a real tmpfs where this process may mount one (root), else the same folder
    with ``shutil.disk_usage`` reporting 1 MB free there."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True).returncode
        == 0
    )
    if not mounted:
        import shutil

        real = shutil.disk_usage

        def disk_usage(path):
            usage = real(path)
            return usage._replace(free=2**20) if Path(path).resolve().is_relative_to(folder) else usage

        monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_disk_without_room_for_the_checkpoints_is_refused_before_any_training(tmp_path, small_disk):
    size = estimated_checkpoint_bytes(IJEPA(**TINY_MODEL))
    # save_top_k=1, last.ckpt, previous-last.ckpt and a save's temporary: 4 files of about 0.67 MB
    needed = rf"{format_bytes(4 * size)} needed \(4 files of about {format_bytes(size)}: save_top_k=1, last\.ckpt"
    with pytest.raises(
        OSError, match=rf"^not enough free space for checkpoints in {small_disk}/ckpt: .* free \(\d+ bytes\), {needed}"
    ):
        cli(
            "fit",
            "--config",
            CONFIG,
            "--config",
            every_step_config(tmp_path, small_disk / "ckpt"),
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_steps=2",
        )
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_save_that_runs_out_of_space_names_the_folder_and_the_size_needed(tmp_path, monkeypatch):
    import errno

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    folder = tmp_path / "ckpt"
    with pytest.raises(
        OSError,
        match=rf"^could not write the checkpoint {folder}/.*\.ckpt \(OSError: .*No space left on device\): it needs about [\d.]+ kB and {folder} has .* free",
    ):
        cli(
            "fit",
            "--config",
            CONFIG,
            "--config",
            every_step_config(tmp_path, folder),
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_steps=1",
            "--trainer.check_val_every_n_epoch=100",
        )
    assert list(folder.iterdir()) == []  # the temporary file is gone
