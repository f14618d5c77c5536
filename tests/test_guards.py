"""Guards that keep a run honest: non-finite loss stops it, collapse is flagged."""

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL, tiny_trainer
from helpers import random_loader
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import CollapseMonitor, EMATargetUpdate, feature_std, rankme
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig


def test_rankme_and_std_on_known_spectra():
    # rank-1 data: one singular value -> RankMe 1; isotropic data in D dims -> close to D
    direction = torch.randn(1, 16)
    collapsed = torch.randn(200, 1) * direction
    assert rankme(collapsed) == pytest.approx(1.0, abs=1e-3)
    assert rankme(torch.randn(4000, 16)) > 15.0
    # two equal singular values -> exactly 2
    two = torch.zeros(4, 8)
    two[0, 0], two[1, 1] = 3.0, 3.0
    assert rankme(two) == pytest.approx(2.0, abs=1e-4)
    assert feature_std(torch.ones(10, 4) * 7.0) == 0
    assert feature_std(torch.tensor([[0.0], [2.0]])) == pytest.approx(2**0.5)


def _validate(model, tmp_path, monitor):
    trainer = tiny_trainer(tmp_path, callbacks=[monitor])
    trainer.validate(model, dataloaders=random_loader(num_images=48, batch_size=16), verbose=False)
    return trainer.callback_metrics


def test_collapse_monitor_flags_a_collapsed_encoder(tmp_path):
    monitor = CollapseMonitor(std_threshold=0.01, rankme_threshold=1.5)
    healthy = _validate(IJEPA(**TINY_MODEL), tmp_path, monitor)
    assert healthy["val/target_std"] > 0.1 and healthy["val/rankme"] > 3

    collapsed = IJEPA(**TINY_MODEL)
    with torch.no_grad():  # every image maps to the same feature: the norm's output is its bias
        collapsed.target_encoder.transformer.norm.weight.zero_()
    with pytest.warns(UserWarning, match="Possible collapse at step 0: val/target_std=0 < std_threshold=0.01"):
        metrics = _validate(collapsed, tmp_path, monitor)
    assert metrics["val/target_std"] == 0 and metrics["val/rankme"] < 1.5


def test_non_finite_loss_stops_without_overwriting_the_last_good_checkpoint(tmp_path, make_trainer):
    class BlowsUp(IJEPA):
        def jepa_loss(self, batch):
            loss = super().jepa_loss(batch)
            return loss * float("nan") if self.global_step == 3 else loss

    model = BlowsUp(**TINY_MODEL, optim=OptimConfig(warmup_steps=1))
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_last=True)
    trainer = make_trainer(max_steps=6, callbacks=[EMATargetUpdate(), checkpoint], enable_checkpointing=True)
    with pytest.raises(
        FloatingPointError,
        match=r"non-finite train/loss \(nan\) at step 3 .*The only checkpoint left, .*/last\.ckpt \(step 2\)",
    ):
        trainer.fit(model, train_dataloaders=random_loader(num_images=64))
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2  # the step-2 checkpoint, untouched
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())


def test_truncated_or_missing_checkpoint_is_a_clear_error(tmp_path):
    from unittest import mock

    from ijepa.cli import IJEPACLI
    from ijepa.data import IJEPADataModule

    model = IJEPA(**TINY_MODEL)
    good = tmp_path / "good.ckpt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "pytorch-lightning_version": L.__version__,
        },
        good,
    )
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    config = str(TINY_CONFIG)

    def validate(path):
        with mock.patch("sys.argv", ["ijepa"]):
            IJEPACLI(
                IJEPA,
                IJEPADataModule,
                args=["validate", "--config", config, f"--ckpt_path={path}", f"--trainer.default_root_dir={tmp_path}"],
            )

    with pytest.raises(
        ValueError,
        match=f"^ckpt_path: cannot read {truncated} .*truncated or not a Lightning checkpoint; "
        f"resume from {good}, an intact earlier checkpoint",
    ):
        validate(truncated)
    with pytest.raises(FileNotFoundError, match="ckpt_path='.*missing.ckpt' is not a file"):
        validate(tmp_path / "missing.ckpt")


def test_checkpoints_are_written_atomically(tmp_path):
    from ijepa.checkpoint import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    path = tmp_path / "ckpt" / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("preempted while writing")

    with pytest.raises(RuntimeError, match="preempted"):
        io.save_checkpoint({"step": torch.tensor(2), "half": Unpicklable()}, path)
    assert torch.load(path, weights_only=True)["step"] == 1  # the previous checkpoint survives whole
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind
    io.save_checkpoint({"step": torch.tensor(3)}, path)
    assert torch.load(path, weights_only=True)["step"] == 3


def test_a_save_over_last_ckpt_keeps_the_state_it_replaces_as_previous_last(tmp_path):
    from ijepa.checkpoint import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    for step in (1, 2, 3):
        io.save_checkpoint({"step": torch.tensor(step)}, path)
        io.save_checkpoint({"step": torch.tensor(step)}, tmp_path / "epoch=0-step=1.ckpt")
    assert torch.load(path, weights_only=True)["step"] == 3
    assert torch.load(tmp_path / "previous-last.ckpt", weights_only=True)["step"] == 2
    # only last.ckpt keeps its previous version, and no temporary stays behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=1.ckpt", "last.ckpt", "previous-last.ckpt"]
    AtomicCheckpointIO(keep_previous=False).save_checkpoint({"step": torch.tensor(4)}, path)
    assert torch.load(tmp_path / "previous-last.ckpt", weights_only=True)["step"] == 2


def test_the_cli_writes_checkpoints_atomically(tmp_path):
    from unittest import mock

    import ijepa.checkpoint_io
    from ijepa.checkpoint import AtomicCheckpointIO
    from ijepa.cli import build_cli

    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli([f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    # configs saved by earlier runs name the plugin by its old path
    assert ijepa.checkpoint_io.AtomicCheckpointIO is AtomicCheckpointIO


def test_collapse_monitor_warns_on_dimensional_collapse_relative_to_the_width(tmp_path):
    model = IJEPA(**TINY_MODEL)
    with torch.no_grad():  # features vary in 2 of the 32 channels only: rankme <= 2 < 10% of 32
        model.target_encoder.transformer.norm.weight[2:].zero_()
    with pytest.warns(
        UserWarning, match=r"val/rankme=.* < 3.2 \(rankme_threshold=1.5, rankme_fraction=0.1 of the width 32\)"
    ):
        metrics = _validate(model, tmp_path, CollapseMonitor(rankme_threshold=1.5, rankme_fraction=0.1))
    assert 1.0 <= metrics["val/rankme"] <= 2.0 + 1e-4
    assert CollapseMonitor(rankme_threshold=1.5, rankme_fraction=0.1).rankme_floor(768) == pytest.approx(76.8)
    with pytest.raises(ValueError, match="rankme_fraction must be in"):
        CollapseMonitor(rankme_fraction=1.5)


def test_collapse_monitor_logs_the_random_init_reference_at_step_0(tmp_path, make_datamodule, make_trainer):
    from lightning.pytorch.loggers import CSVLogger

    data = make_datamodule(train_size=32, val_size=32, batch_size=16)
    logger = CSVLogger(tmp_path)
    trainer = make_trainer(callbacks=[CollapseMonitor()], logger=logger, max_steps=1, limit_val_batches=0)
    model = IJEPA(**TINY_MODEL)
    trainer.fit(model, datamodule=data)
    import csv

    rows = list(csv.DictReader(open(f"{logger.log_dir}/metrics.csv")))
    at_start = [r for r in rows if r.get("val/rankme") and r["step"] == "0"]
    assert len(at_start) == 1
    # the logged value is the RankMe of the random-init target encoder's pooled val features
    loader = data.val_dataloader()
    with torch.no_grad():
        features = torch.cat([model.target_encoder(b.images).mean(1) for b in loader])
    assert float(at_start[0]["val/rankme"]) == pytest.approx(float(rankme(features)), rel=1e-4)
