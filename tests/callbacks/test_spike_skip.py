"""LossSpikeSkip: a batch whose loss spikes is skipped without a trace, the skips are counted, a
run of them stops the run naming a checkpoint, and a resumed run decides as the uninterrupted one."""

import copy
import math
import statistics
import warnings

import lightning as L
import pytest
import torch
from conftest import TINY_MODEL, tiny_datamodule, tiny_trainer
from helpers import Recorder, Stop
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import EMATargetUpdate, LossSpikeSkip, SpikeTracker
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig


class Spiking(IJEPA):
    """The tiny model whose training loss is multiplied by 1e6 at the given batches (0-based,
    counted over the whole run, so a resumed run spikes at the same ones)."""

    def __init__(self, spikes=(), **kwargs):
        super().__init__(**kwargs)
        self.spikes = set(spikes)

    def jepa_loss(self, batch):
        loss = super().jepa_loss(batch)
        if self.training and self.trainer.fit_loop.epoch_loop.total_batch_idx in self.spikes:
            return loss * 1e6
        return loss


class Snapshots(L.Callback):
    """Everything a step may change, after the batch's forward (the weight decay is set by then)
    and after the batch (after the EMA update), and the metrics logged by then."""

    def __init__(self):
        self.before, self.after, self.metrics = {}, {}, {}

    @staticmethod
    def state(trainer, pl_module):
        optimizer = trainer.optimizers[0]
        return {
            "weights": copy.deepcopy(pl_module.state_dict()),  # target encoder included
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "lr": [group["lr"] for group in optimizer.param_groups],
            "scheduler": copy.deepcopy(trainer.lr_scheduler_configs[0].scheduler.state_dict()),
            "global_step": trainer.global_step,
        }

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        self.before[trainer.fit_loop.epoch_loop.total_batch_idx] = self.state(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[trainer.fit_loop.epoch_loop.total_batch_idx] = self.state(trainer, pl_module)
        self.metrics[trainer.fit_loop.epoch_loop.total_batch_idx] = dict(trainer.callback_metrics)


def assert_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_equal(x, y)
    else:
        assert a == b


def fit(tmp_path, spikes, max_steps, guard, *callbacks, ckpt_path=None, every_n_train_steps=1, **trainer_options):
    L.seed_everything(0)
    model = Spiking(spikes, **TINY_MODEL, optim=OptimConfig(warmup_steps=2), drop_path_rate=0.1)
    data = tiny_datamodule(train_size=80, val_size=20, batch_size=16)
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=every_n_train_steps, save_top_k=-1, save_last=True
    )
    trainer = tiny_trainer(
        tmp_path,
        max_steps=max_steps,
        limit_val_batches=0,
        enable_checkpointing=True,
        # the EMA first: the skipped step must already be undone when it looks
        callbacks=[EMATargetUpdate(momentum=0.9), guard, *callbacks, checkpoint],
        **trainer_options,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model, trainer


def test_the_threshold_is_the_mean_plus_num_std_population_stds_of_the_last_window_accepted_losses():
    tracker = SpikeTracker(window=4, num_std=2.0)
    assert tracker.threshold() is None and not tracker.is_spike(1e30)
    tracker.accept(1.0)
    assert tracker.threshold() is None  # one loss has no spread
    for loss in (2.0, 3.0, 4.0, 5.0):
        tracker.accept(loss)
    kept = [2.0, 3.0, 4.0, 5.0]  # the window: the first loss has left
    expected = statistics.fmean(kept) + 2.0 * statistics.pstdev(kept)  # 3.5 + 2 * sqrt(1.25)
    assert tracker.stats() == pytest.approx((3.5, math.sqrt(1.25)))
    assert tracker.threshold() == pytest.approx(expected)
    assert tracker.is_spike(expected + 1e-9) and not tracker.is_spike(expected - 1e-9)

    restored = SpikeTracker(window=4, num_std=2.0)
    restored.load_state_dict(tracker.state_dict())
    assert list(restored.losses) == kept and restored.threshold() == tracker.threshold()


def test_an_injected_spike_is_skipped_and_leaves_the_state_unchanged(tmp_path):
    guard, snapshots = LossSpikeSkip(warmup_steps=3, window=3, num_std=6.0), Snapshots()
    model, trainer = fit(tmp_path, {4}, 6, guard, snapshots)

    # batch 4 came at step 4 and left every part of the state as it found it
    assert_equal(snapshots.before[4], snapshots.after[4])
    assert snapshots.after[4]["global_step"] == 4
    # the batches around it did train (the comparison above can fail)
    for batch in (3, 5):
        weights_before, weights_after = snapshots.before[batch]["weights"], snapshots.after[batch]["weights"]
        assert not torch.equal(
            weights_before["encoder.patch_embed.proj.weight"], weights_after["encoder.patch_embed.proj.weight"]
        )
        assert not torch.equal(
            weights_before["target_encoder.patch_embed.proj.weight"],
            weights_after["target_encoder.patch_embed.proj.weight"],
        )
        assert snapshots.before[batch]["lr"] != snapshots.after[batch]["lr"]
    # the run went on to max_steps, one batch later
    assert trainer.global_step == 6 and sorted(snapshots.after) == list(range(7))
    assert guard.skipped == 1 and guard.in_a_row == 0
    assert snapshots.metrics[3]["train/skipped_steps"] == 0
    assert snapshots.metrics[4]["train/skipped_steps"] == 1 and snapshots.metrics[6]["train/skipped_steps"] == 1
    assert snapshots.metrics[4]["train/spike_loss"] > 1e3
    # the window holds the accepted losses only
    assert len(guard.tracker.losses) == 3 and max(guard.tracker.losses) < 1e3
    assert model.step_guards == []  # fit is over: the guard is gone


def test_no_step_is_skipped_before_warmup_steps_and_the_loss_then_joins_the_window(tmp_path):
    guard, snapshots = LossSpikeSkip(warmup_steps=5, window=3, num_std=6.0), Snapshots()
    _, trainer = fit(tmp_path, {3}, 5, guard, snapshots)
    assert guard.skipped == 0 and trainer.global_step == 5 and sorted(snapshots.after) == list(range(5))
    assert snapshots.after[3]["global_step"] == 4
    assert max(guard.tracker.losses) > 1e3  # accepted, so it sets the threshold


def test_a_guard_that_skips_nothing_trains_bit_for_bit_as_no_guard(tmp_path):
    guard = LossSpikeSkip(warmup_steps=2, window=3, num_std=6.0)
    guarded, _ = fit(tmp_path / "guarded", (), 7, guard)
    plain, _ = fit(tmp_path / "plain", (), 7, L.Callback())  # no guard at all
    assert guard.skipped == 0 and len(guard.tracker.losses) == 3  # it watched, and let every step through
    for (name, a), b in zip(guarded.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_run_resumed_from_before_a_skip_ends_with_the_uninterrupted_runs_weights_and_tracker(tmp_path):
    spikes, max_steps = {5}, 7  # 5 batches an epoch: the spike opens epoch 1
    full_guard, full_recorder = LossSpikeSkip(warmup_steps=3, window=3), Recorder()
    full, _ = fit(tmp_path / "full", spikes, max_steps, full_guard, full_recorder)
    assert full_guard.skipped == 1
    after_skip = torch.load(tmp_path / "full" / "ckpt" / "epoch=1-step=6.ckpt", weights_only=True)
    assert after_skip["callbacks"]["LossSpikeSkip"]["skipped"] == 1  # a checkpoint after the skip holds it

    with pytest.raises(Stop):
        fit(tmp_path / "resume", spikes, max_steps, LossSpikeSkip(warmup_steps=3, window=3), Recorder(stop_at=4))
    before_skip = tmp_path / "resume" / "ckpt" / "epoch=0-step=4.ckpt"
    guard, recorder = LossSpikeSkip(warmup_steps=3, window=3), Recorder()
    resumed, trainer = fit(tmp_path / "resume", spikes, max_steps, guard, recorder, ckpt_path=before_skip)

    assert trainer.global_step == max_steps and guard.skipped == 1
    assert guard.state_dict() == full_guard.state_dict()
    for step in recorder.losses:
        assert recorder.losses[step] == full_recorder.losses[step], f"different loss at step {step}"
    for (name, a), b in zip(resumed.state_dict().items(), full.state_dict().values()):
        assert torch.equal(a, b), name


def test_max_in_a_row_spikes_stop_the_run_naming_the_checkpoint_to_resume_from(tmp_path):
    guard = LossSpikeSkip(warmup_steps=3, window=3, max_in_a_row=3)
    with pytest.raises(
        FloatingPointError,
        match=r"^3 loss spikes in a row \(LossSpikeSkip\.max_in_a_row=3\), the last train/loss .* at step 4 "
        r"\(epoch 1\); stopping without saving\. The only checkpoint left, .*/ckpt/last\.ckpt \(step 4\)",
    ):
        fit(tmp_path, {4, 5, 6, 7}, 10, guard)
    assert guard.skipped == 2 and guard.in_a_row == 3
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["global_step"] == 4


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("warmup_steps", -1, "warmup_steps must be >= 0, got -1"),
        ("window", 1, "window must be >= 2, got 1"),
        ("num_std", 0.0, "num_std must be > 0, got 0.0"),
        ("num_std", math.nan, "num_std must be > 0, got nan"),
        ("max_in_a_row", 0, "max_in_a_row must be >= 1, got 0"),
    ],
)
def test_an_option_out_of_range_is_refused_naming_it_and_its_range(option, value, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        LossSpikeSkip(**{option: value})


def test_gradient_accumulation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="LossSpikeSkip needs trainer.accumulate_grad_batches 1, got 2"):
        fit(tmp_path, (), 2, LossSpikeSkip(), accumulate_grad_batches=2)


def test_a_warmup_that_the_run_never_passes_is_warned_at_fit_start_naming_it_and_max_steps(tmp_path):
    # steps 0..2: warm-up 3 covers them all, so no step could ever be skipped
    with pytest.warns(UserWarning) as caught:
        fit(tmp_path / "never", (), 3, LossSpikeSkip(warmup_steps=3))
    lines = [str(w.message) for w in caught if "LossSpikeSkip" in str(w.message)]
    assert lines == [
        "LossSpikeSkip.warmup_steps=3 is not below the run's trainer.max_steps=3: no step comes after the warm-up, "
        "so it will never act (no loss spike is skipped). Set warmup_steps below the run's length, or remove the "
        "callback."
    ]
    # one step past the warm-up: the guard can act there, so nothing is said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path / "acts", (), 3, LossSpikeSkip(warmup_steps=2))
    assert not [w for w in caught if "LossSpikeSkip" in str(w.message)]


def test_a_warmup_past_a_run_bounded_by_epochs_names_its_steps_and_max_epochs(tmp_path):
    with pytest.warns(UserWarning, match=r"^LossSpikeSkip.warmup_steps=100 is not below the run's 5 optimizer steps "):
        fit(tmp_path, (), -1, LossSpikeSkip(), max_epochs=1)  # 80 images in batches of 16
