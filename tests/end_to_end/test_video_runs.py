"""Clips through `ijepa fit`: the video configs run, the video quickstart learns, and a video folder
fits with its frame times."""

import csv
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
import yaml
from conftest import ROOT
from helpers import make_video_folder

from ijepa.cli import build_cli

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them


@pytest.mark.parametrize("name, grid", [("video_quickstart", (2, 6, 6)), ("video_motion", (2, 4, 4))])
def test_video_configs_fit_through_the_cli(tmp_path, name, grid):
    shipped = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    for callback in shipped["trainer"]["callbacks"]:  # the attentive probe's 400 steps a call are its own test's
        if callback["class_path"].endswith("AttentiveProbe"):
            callback.setdefault("init_args", {})["steps"] = 10
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(shipped))
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(
            [
                "fit",
                "--config",
                str(config),
                "--trainer.max_steps=2",
                "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}",
                "--trainer.enable_progress_bar=false",
                "--data.source.train_size=64",
                "--data.source.val_size=32",
                "--data.batch_size=16",
                "--data.num_workers=0",
                "--data.probe_batch_size=32",
            ]
        )
    assert cli.trainer.global_step == 2
    assert cli.model.encoder.grid == grid and torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_video_quickstart_learns_the_shapes_in_its_first_half(tmp_path):
    """The video quickstart's training as shipped (300 steps, the schedules unchanged), stopped
    after its mid-run validation at step 150: both pooled probes on the target encoder's features
    beat their random-init values (step 0) on the moving shape's class. The attentive probe is
    left out; it does not change the training. docs/video.md has the full runs over three seeds."""

    class StopAtHalf(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = trainer.global_step >= 150

    shipped = yaml.safe_load((ROOT / "configs" / "video_quickstart.yaml").read_text())
    callbacks = shipped["trainer"]["callbacks"]
    shipped["trainer"]["callbacks"] = [c for c in callbacks if not c["class_path"].endswith("AttentiveProbe")]
    assert len(shipped["trainer"]["callbacks"]) == len(callbacks) - 1
    assert shipped["trainer"]["max_steps"] == 300 and shipped["trainer"]["check_val_every_n_epoch"] == 3
    config = tmp_path / "video_quickstart.yaml"
    config.write_text(yaml.safe_dump(shipped))
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(
            [
                "--config",
                str(config),
                "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
                f"--trainer.logger.save_dir={tmp_path}",
                f"--trainer.default_root_dir={tmp_path}",
                "--trainer.enable_progress_bar=false",
            ],
            run=False,
        )
    cli.trainer.callbacks.append(StopAtHalf())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (metrics_file,) = Path(tmp_path).rglob("metrics.csv")
    rows = list(csv.DictReader(metrics_file.open()))

    def probe(name):
        return {int(row["step"]): float(row[name]) for row in rows if row.get(name)}

    knn, linear = probe("val/knn_top1"), probe("val/linear_top1")
    assert sorted(linear) == sorted(knn) == [0, 149], linear
    # This test's run with --seed_everything 0, 1, 2 gained k-NN +3.8, +2.5, +4.0 points and
    # linear +10.5, +9.4, +8.5 by step 150 (at step 100: k-NN +3.1, +3.1, linear +6.8, +4.1, too
    # close to the noise). 1,000 held-out clips: one standard error near 0.15 is about 0.011.
    assert knn[149] > knn[0] + 0.01, knn
    assert linear[149] > linear[0] + 0.05, linear


def test_a_video_folder_fits_through_the_cli_with_timestamps(tmp_path):
    """``ijepa fit`` on a folder of videos (10 and 20 fps, sampled at 8 fps) with M-RoPE: the
    masked and the probe batches carry ``frame_times`` and the run logs both probes."""
    pytest.importorskip("av", reason="the videofolder dataset needs the 'video' extra (installed by '.[dev]')")
    root = make_video_folder(tmp_path / "videos", per_class=8)
    config = ROOT / "configs" / "video_motion.yaml"  # M-RoPE with timestamps
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(
            [
                "fit",
                "--config",
                str(config),
                "--trainer.max_steps=2",
                "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}",
                "--trainer.enable_progress_bar=false",
                "--trainer.check_val_every_n_epoch=1",
                "--data.source=ijepa.data.VideoFolderSource",
                f"--data.source.root={root}",
                "--data.image_size=16",
                "--model.patch_size=4",
                "--data.batch_size=8",
                "--data.num_workers=0",
                "--data.source.fps=8",
                "--data.crop_scale=[0.5,1.0]",
            ],
            run=True,
        )
    metrics = cli.trainer.callback_metrics
    assert cli.model.hparams.num_frames == 4 and cli.datamodule.num_classes == 2
    assert 0.0 <= float(metrics["val/knn_top1"]) <= 1.0 and 0.0 <= float(metrics["val/linear_top1"]) <= 1.0
