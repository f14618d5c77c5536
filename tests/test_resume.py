"""A run stopped after step k and resumed from its checkpoint continues exactly."""

from unittest import mock

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import EMATargetUpdate
from ijepa.cli import build_cli
from ijepa.data import IJEPADataModule
from ijepa.data.sources import ShapesSource
from ijepa.module import IJEPA

STOP_AT = 7  # 5 batches per epoch: the run stops inside epoch 1, resumes there and crosses into epoch 2
MAX_STEPS = 12


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


def make(tmp_path, recorder, num_workers=0):
    L.seed_everything(0)
    model = IJEPA(**TINY_MODEL, warmup_steps=2, drop_path_rate=0.1)
    data = IJEPADataModule(
        source=ShapesSource(train_size=80, val_size=20),
        image_size=32,
        patch_size=8,
        batch_size=16,
        num_workers=num_workers,
        crop_scale=(0.5, 1.0),
        horizontal_flip=True,
        target_scale=(0.1, 0.15),
        min_keep=2,
    )
    trainer = L.Trainer(
        max_steps=MAX_STEPS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[
            EMATargetUpdate(momentum=0.9),
            recorder,
            ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1),
        ],
        default_root_dir=tmp_path,
    )
    return model, data, trainer


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resumed_run_reproduces_the_uninterrupted_losses(tmp_path, num_workers):
    full = Recorder()
    model, data, trainer = make(tmp_path / "full", full, num_workers)
    trainer.fit(model, datamodule=data)
    assert sorted(full.losses) == list(range(1, MAX_STEPS + 1))
    # the five batches of an epoch are different images, and epochs are reshuffled
    assert len({full.batches[s][0] for s in range(1, 6)}) == 5
    assert full.batches[1][0] != full.batches[6][0]

    stopped = Recorder(stop_at=STOP_AT)
    model, data, trainer = make(tmp_path / "resume", stopped, num_workers)
    with pytest.raises(Stop):
        trainer.fit(model, datamodule=data)
    checkpoint = tmp_path / "resume" / "ckpt" / f"epoch=1-step={STOP_AT}.ckpt"
    assert checkpoint.is_file()

    resumed = Recorder()
    model, data, trainer = make(tmp_path / "resume", resumed, num_workers)
    trainer.fit(model, datamodule=data, ckpt_path=checkpoint)
    assert sorted(resumed.losses) == list(range(STOP_AT + 1, MAX_STEPS + 1))
    for step in resumed.losses:
        assert resumed.batches[step] == full.batches[step], f"different batch at step {step}"
        assert resumed.losses[step] == full.losses[step], f"different loss at step {step}"
    for (name, a), b in zip(trainer.lightning_module.state_dict().items(), full_state(tmp_path)):
        assert torch.equal(a, b), name


def full_state(tmp_path):
    saved = torch.load(tmp_path / "full" / "ckpt" / f"epoch=2-step={MAX_STEPS}.ckpt", weights_only=True)
    return saved["state_dict"].values()


# The tiny config on 40 images (5 batches of 8 an epoch), without probes. Every schedule's
# horizon is max_steps (docs/training.md), so these are flat: a run extended to a larger
# max_steps can then equal one that ran there straight, and any difference is a batch trained
# twice or skipped, or a wrong loop state.
FLAT_SCHEDULES = """
trainer:
  logger: false
  enable_model_summary: false
  callbacks:
    - class_path: ijepa.callbacks.EMATargetUpdate
      init_args: {momentum: 0.99, final_momentum: 0.99}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true}
model:
  final_lr: 2.0e-3
  final_weight_decay: 0.04
data:
  source:
    class_path: ijepa.data.ShapesSource
    init_args: {train_size: 40, val_size: 16}
  batch_size: 8
"""


def fit(root, *args):
    """``ijepa fit`` on the tiny config with flat schedules, into ``root``; returns its last.ckpt."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "flat.yaml").write_text(FLAT_SCHEDULES)
    with mock.patch("sys.argv", ["ijepa"]):
        build_cli(
            [
                "fit",
                "--config",
                str(TINY_CONFIG),
                "--config",
                str(root / "flat.yaml"),
                f"--trainer.default_root_dir={root}",
            ]
            + list(args)
        )
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """last.ckpt of an uninterrupted 12-step run validating every other epoch, as the quickstart."""
    return fit(tmp_path_factory.mktemp("straight"), "--trainer.max_steps=12", "--trainer.check_val_every_n_epoch=2")


@pytest.mark.slow  # one fit, shared
def test_last_checkpoint_holds_the_final_step_when_max_steps_falls_between_validations(straight_run):
    # Validation, and with it ModelCheckpoint's save, at step 10; Lightning kept that as last.ckpt.
    assert straight_run["global_step"] == 12
    assert straight_run["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 2, "batches": 2}]


@pytest.mark.slow  # two fits per case, and one shared
@pytest.mark.parametrize("max_steps", [7, 5], ids=["mid-epoch", "epoch-end-without-validation"])
def test_extending_a_run_to_a_larger_max_steps_equals_an_uninterrupted_run(tmp_path, straight_run, max_steps):
    every = "--trainer.check_val_every_n_epoch=2"
    assert fit(tmp_path / "short", f"--trainer.max_steps={max_steps}", every)["global_step"] == max_steps
    (tmp_path / "short" / "checkpoints" / "last.ckpt").rename(tmp_path / "short.ckpt")
    extended = fit(tmp_path / "extended", "--trainer.max_steps=12", every, f"--ckpt_path={tmp_path / 'short.ckpt'}")
    assert extended["global_step"] == straight_run["global_step"] == 12
    for name, value in straight_run["state_dict"].items():
        assert torch.equal(extended["state_dict"][name], value), name


def test_the_loader_position_saved_after_a_max_steps_stop_is_the_epoch_its_batches_came_from(tmp_path):
    # Once fit has stopped at step 7 (epoch 1, 2 of its 5 batches), Lightning counts epoch 1 as
    # completed; the position used to pair that count with the 2 batches: (2, 2).
    model, data, trainer = make(tmp_path, Recorder())
    trainer.fit_loop.epoch_loop.max_steps = STOP_AT
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    saved = torch.load(tmp_path / "after_fit.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 2}]
