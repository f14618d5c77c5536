"""Every lever config of configs/ablations/ trains three steps of the quickstart (the README's check:
``ijepa fit --config configs/quickstart.yaml --config configs/ablations/<name>.yaml --trainer.max_steps 3``)."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT
from helpers import cli

pytestmark = pytest.mark.slow

ABLATIONS = ROOT / "configs" / "ablations"
# plain I-JEPA's overlay is the learning study's (tests/test_configs.py); every other is a lever
LEVERS = sorted(path.stem for path in ABLATIONS.glob("*.yaml") if path.stem != "plain_ijepa")


@pytest.mark.parametrize("name", LEVERS)
def test_each_lever_trains_three_steps_of_the_quickstart(tmp_path, name):
    run = cli(
        "fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--config", str(ABLATIONS / f"{name}.yaml"),
        "--trainer.max_steps=3", f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
        "--data.source.init_args.train_size=256", "--data.source.init_args.val_size=64", "--data.num_workers=0",
        "--trainer.callbacks=[]", "--trainer.logger=false",
    )  # fmt: skip
    assert run.trainer.global_step == 3 and torch.isfinite(run.trainer.callback_metrics["train/loss"])
