"""Runs on shards equal the same runs on the image folder, bit for bit, resumed or not."""

from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
import yaml
from conftest import TINY_CONFIG, TINY_MODEL, tiny_datamodule, tiny_trainer
from helpers import Recorder, Stop, write_folder_and_shards
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import EMATargetUpdate
from ijepa.cli import build_cli
from ijepa.data import ShardsSource
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

pytest.importorskip("litdata", reason="shards need the 'shards' extra")


@pytest.fixture(scope="module")
def folder_and_shards(tmp_path_factory):
    return write_folder_and_shards(tmp_path_factory.mktemp("shards"))


def fit(root: Path, source: dict) -> tuple[list[float], dict]:
    """A 5-step `ijepa fit` of the tiny config on ``source`` (an epoch of 4 batches and a validation,
    then one more); its train losses and final weights."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["trainer"].update(
        max_steps=5,
        default_root_dir=str(root),
        callbacks=[
            {"class_path": "ijepa.callbacks.EMATargetUpdate"},
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
        ],
        logger={"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root)}},
    )
    config["data"].update(source=source, batch_size=4)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["fit", "--config", str(root / "config.yaml")])
    metrics = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()
    column = metrics[0].split(",").index("train/loss")
    losses = [float(row.split(",")[column]) for row in metrics[1:] if row.split(",")[column]]
    return losses, torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)["state_dict"]


def make(root: Path, shards: Path, recorder: Recorder):
    L.seed_everything(0)
    model = IJEPA(**TINY_MODEL, optim=OptimConfig(warmup_steps=2), drop_path_rate=0.1)
    data = tiny_datamodule(source=ShardsSource(str(shards)), batch_size=4, crop_scale=(0.5, 1.0), horizontal_flip=True)
    trainer = tiny_trainer(
        root,
        max_steps=7,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[
            EMATargetUpdate(momentum=0.9),
            recorder,
            ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=6, save_top_k=-1),
        ],
    )
    return model, data, trainer


def test_a_run_on_shards_equals_the_same_run_on_the_folder_bit_for_bit(folder_and_shards, tmp_path):
    folder, shards = folder_and_shards
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    on_folder = fit(tmp_path / "a", {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(folder)}})
    on_shards = fit(tmp_path / "b", {"class_path": "ijepa.data.ShardsSource", "init_args": {"root": str(shards)}})
    assert len(on_folder[0]) == 5 and on_shards[0] == on_folder[0]
    for name, weights in on_folder[1].items():
        assert torch.equal(on_shards[1][name], weights), name


def test_a_run_on_shards_resumed_mid_epoch_equals_the_uninterrupted_run(folder_and_shards, tmp_path):
    shards = folder_and_shards[1]  # 16 training images: 4 batches an epoch; the stop falls inside epoch 1
    full = Recorder()
    model, data, trainer = make(tmp_path / "full", shards, full)
    trainer.fit(model, datamodule=data)
    final = {name: weights.clone() for name, weights in model.state_dict().items()}
    stopped = Recorder(stop_at=6)
    model, data, trainer = make(tmp_path / "resume", shards, stopped)
    with pytest.raises(Stop):
        trainer.fit(model, datamodule=data)
    resumed = Recorder()
    model, data, trainer = make(tmp_path / "resume", shards, resumed)
    trainer.fit(model, datamodule=data, ckpt_path=tmp_path / "resume" / "ckpt" / "epoch=1-step=6.ckpt")
    assert sorted(resumed.losses) == [7]
    assert resumed.batches[7] == full.batches[7] and resumed.losses[7] == full.losses[7]
    for name, weights in trainer.lightning_module.state_dict().items():
        assert torch.equal(weights, final[name]), name
