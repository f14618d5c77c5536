"""A run stopped after step k and resumed from its checkpoint continues exactly."""

import lightning as L
import pytest
import torch
from conftest import TINY_MODEL
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import EMATargetUpdate
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
            float(batch["images"].sum()),
            batch["context_indices"].tolist(),
            batch["target_indices"].sum().item(),
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
