"""A run stopped after step k and resumed from its checkpoint continues exactly."""

import lightning as L
import pytest
import torch
from conftest import TINY_MODEL, tiny_datamodule, tiny_trainer
from helpers import Recorder, Stop
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import EMATargetUpdate
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig

STOP_AT = 7  # 5 batches per epoch: the run stops inside epoch 1, resumes there and crosses into epoch 2
MAX_STEPS = 12


def make(tmp_path, recorder, num_workers=0):
    L.seed_everything(0)
    model = IJEPA(**TINY_MODEL, optim=OptimConfig(warmup_steps=2), drop_path_rate=0.1)
    data = tiny_datamodule(
        train_size=80,
        val_size=20,
        batch_size=16,
        num_workers=num_workers,
        crop_scale=(0.5, 1.0),
        horizontal_flip=True,
    )
    trainer = tiny_trainer(
        tmp_path,
        max_steps=MAX_STEPS,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[
            EMATargetUpdate(momentum=0.9),
            recorder,
            ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1),
        ],
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


def test_the_loader_position_saved_after_a_max_steps_stop_is_the_epoch_its_batches_came_from(tmp_path):
    # Once fit has stopped at step 7 (epoch 1, 2 of its 5 batches), Lightning counts epoch 1 as
    # completed; the position used to pair that count with the 2 batches: (2, 2).
    model, data, trainer = make(tmp_path, Recorder())
    trainer.fit_loop.epoch_loop.max_steps = STOP_AT
    trainer.fit(model, datamodule=data)
    trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    saved = torch.load(tmp_path / "after_fit.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 2}]
