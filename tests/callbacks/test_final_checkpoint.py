"""FinalCheckpoint saves the step a run stops at, for a time limit as for max_steps."""

import torch
from conftest import TINY_MODEL, tiny_datamodule, tiny_trainer
from lightning.pytorch.callbacks import ModelCheckpoint, Timer

from ijepa.callbacks import EMATargetUpdate, FinalCheckpoint
from ijepa.module import IJEPA


class StepClock(Timer):
    """A Timer whose clock reads the trainer's step as seconds: a time limit reached at a known step."""

    trainer = None

    def on_fit_start(self, trainer, pl_module):
        self.trainer = trainer

    def time_elapsed(self, stage=None) -> float:
        return float(self.trainer.global_step) if self.trainer is not None else 0.0


def fit(root, max_steps: int, timer: Timer | None = None, ckpt_path=None):
    torch.manual_seed(0)  # the same initial weights in every run
    # 64 images at batch 32: two steps an epoch, validation (and ModelCheckpoint's last.ckpt) after each
    callbacks = [EMATargetUpdate(), FinalCheckpoint(), *([timer] if timer else []), ModelCheckpoint(save_last=True)]
    trainer = tiny_trainer(
        root, max_steps=max_steps, callbacks=callbacks, logger=True, enable_checkpointing=True, limit_val_batches=1
    )
    trainer.fit(IJEPA(**TINY_MODEL, optim={"warmup_steps": 1}), datamodule=tiny_datamodule(), ckpt_path=ckpt_path)
    last = sorted(root.rglob("last.ckpt"), key=lambda path: path.stat().st_mtime)[-1]
    return trainer, torch.load(last, weights_only=False)


def test_a_run_stopped_by_its_time_limit_mid_epoch_saves_the_step_it_stopped_at(tmp_path):
    # The limit falls at step 5, one step after the last validation saved last.ckpt (step 4):
    # without FinalCheckpoint acting on the timer's stop, last.ckpt stays at step 4.
    trainer, checkpoint = fit(tmp_path / "timed", max_steps=40, timer=StepClock(duration={"seconds": 5}))
    assert trainer.global_step == 5 and checkpoint["global_step"] == 5
    # the timer was moved ahead of FinalCheckpoint, whose decision follows the timer's
    names = [type(cb).__name__ for cb in trainer.callbacks]
    assert names.index("StepClock") < names.index("FinalCheckpoint")


def test_a_time_limited_run_resumed_without_the_limit_equals_an_uninterrupted_run(tmp_path):
    timed, _ = fit(tmp_path / "timed", max_steps=10, timer=StepClock(duration={"seconds": 5}))
    stopped = timed.checkpoint_callback.last_model_path
    _, resumed = fit(tmp_path / "resumed", max_steps=10, ckpt_path=stopped)
    _, straight = fit(tmp_path / "straight", max_steps=10)
    assert resumed["global_step"] == straight["global_step"] == 10
    for name, tensor in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, msg=name)
