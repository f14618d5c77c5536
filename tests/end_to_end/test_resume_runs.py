"""Whole `ijepa fit` runs stopped and continued: the last checkpoint and a longer run."""

from unittest import mock

import pytest
import torch
from conftest import TINY_CONFIG

from ijepa.cli import build_cli

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them


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


def test_last_checkpoint_holds_the_final_step_when_max_steps_falls_between_validations(straight_run):
    # Validation, and with it ModelCheckpoint's save, at step 10; Lightning kept that as last.ckpt.
    assert straight_run["global_step"] == 12
    assert straight_run["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 2, "batches": 2}]


@pytest.mark.parametrize("max_steps", [7, 5], ids=["mid-epoch", "epoch-end-without-validation"])
def test_extending_a_run_to_a_larger_max_steps_equals_an_uninterrupted_run(tmp_path, straight_run, max_steps):
    every = "--trainer.check_val_every_n_epoch=2"
    assert fit(tmp_path / "short", f"--trainer.max_steps={max_steps}", every)["global_step"] == max_steps
    (tmp_path / "short" / "checkpoints" / "last.ckpt").rename(tmp_path / "short.ckpt")
    extended = fit(tmp_path / "extended", "--trainer.max_steps=12", every, f"--ckpt_path={tmp_path / 'short.ckpt'}")
    assert extended["global_step"] == straight_run["global_step"] == 12
    for name, value in straight_run["state_dict"].items():
        assert torch.equal(extended["state_dict"][name], value), name
