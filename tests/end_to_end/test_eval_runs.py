"""`ijepa eval` on two processes selects the heads and scores of one process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL
from helpers import heads_by_name

from ijepa.evaluation import (
    read_results,
)
from ijepa.evaluation.runner import main
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("eval") / "tiny.ckpt")


def test_two_processes_select_the_same_heads_with_the_same_scores_as_one(checkpoint, tmp_path):
    # each process encodes half of every batch and every process trains the heads on the gathered batch
    config = tmp_path / "eval.yaml"
    config.write_text(
        "data:\n  source:\n    class_path: ijepa.data.ShapesSource\n    init_args: {train_size: 320, val_size: 96}\n"
        "  batch_size: 32\n  num_workers: 0\n  val_fraction: 0.2\nprotocols:\n"
        "  - class_path: ijepa.evaluation.KNNProtocol\n"
        "  - class_path: ijepa.evaluation.LinearProtocol\n"
        "    init_args: {epochs: 2, lrs: [0.01, 0.1], weight_decays: [0.0], batch_norm: [false, true]}\n"
        "  - class_path: ijepa.evaluation.AttentiveProtocol\n"
        "    init_args: {epochs: 1, num_heads: 2, lrs: [1.0e-3], weight_decays: [0.01, 0.1]}\n"
    )
    common = ["eval", "--config", str(config), "--checkpoint", str(checkpoint), "--accelerator", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    args = [sys.executable, "-m", "ijepa", *common, "--devices", "2", "--strategy", "ddp", "--output_dir", "two"]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one = main(common[1:] + ["--output_dir", str(tmp_path / "one")])
    for alone in one:
        both = read_results(tmp_path / "two" / f"{alone['name']}.json")
        assert both["processes"] == 2 and alone["processes"] == 1
        assert both["selected"] == alone["selected"]
        assert heads_by_name(both) == pytest.approx(heads_by_name(alone), abs=1e-9)
        assert both["test_top1"] == pytest.approx(alone["test_top1"], abs=1e-9)
