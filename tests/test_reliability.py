"""Nothing lost, nothing silently wrong: the run-level faults of docs/reliability.md, through the CLI."""

import os
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from helpers import cli, every_step_config

from ijepa.checkpoint import estimated_checkpoint_bytes, format_bytes
from ijepa.module import IJEPA
from ijepa.schedules import warmup_cosine_schedule

CONFIG = str(TINY_CONFIG)


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
        "--model.optim.lr=1e-5",
        "--model.optim.start_lr=1e-6",  # at most lr (refused above it)
        "--model.optim.warmup_steps=500",
        "--model.optim.final_weight_decay=0.1",
        f"--trainer.default_root_dir={tmp_path / 'b'}",
        "--trainer.max_steps=6",
        "--trainer.check_val_every_n_epoch=100",
    )
    model = resumed.model
    assert (model.optim.lr, model.optim.warmup_steps, model.optim.final_weight_decay) == (1e-5, 500, 0.1)
    assert model.hparams.depth == 2  # the architecture still comes from the checkpoint
    # The optimizer ran on the new schedule: after 6 steps the lr is step 6 of a 500-step warm-up to 1e-5.
    expected = warmup_cosine_schedule(6, 6, 6, 1e-5, model.optim.final_lr, model.optim.start_lr)
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
