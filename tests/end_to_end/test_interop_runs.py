"""`ijepa fit` continues pretraining from an official I-JEPA checkpoint; the interop functions
import neither Lightning nor transformers (a fresh interpreter)."""

import subprocess
import sys
from unittest import mock

import pytest
import torch
from conftest import ROOT, TINY_CONFIG
from helpers import INTEROP_MODEL, trained_like

from ijepa.cli import IJEPACLI, main
from ijepa.data import IJEPADataModule
from ijepa.interop import to_official
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them


def test_ijepa_fit_continues_pretraining_from_an_official_checkpoint(tmp_path):
    official = to_official(trained_like())
    torch.save(official, tmp_path / "official.pth.tar")
    path = tmp_path / "official.ckpt"
    heads = [
        "--num_heads",
        str(INTEROP_MODEL["num_heads"]),
        "--predictor_num_heads",
        str(INTEROP_MODEL["predictor_num_heads"]),
    ]
    main(["convert", str(tmp_path / "official.pth.tar"), str(path), "ckpt", *heads])
    callback = (
        '{"class_path": "ijepa.callbacks.PositionEmbeddingInterpolation", '
        f'"init_args": {{"init_checkpoint": "{path}"}}}}'
    )
    args = ["fit", "--config", str(TINY_CONFIG), "--data.source.train_size=96", "--data.source.val_size=40"]
    args += [f"--trainer.callbacks+={callback}", "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path}"]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)
    fitted = cli.trainer.lightning_module.state_dict()
    # one optimizer step (and one EMA step) away from the official target encoder's weights
    start = official["target_encoder"]["module.blocks.0.attn.qkv.weight"]
    assert (fitted["target_encoder.transformer.blocks.0.attn.qkv.weight"] - start).abs().max() < 1e-2
    assert cli.trainer.global_step == 1


def test_load_encoder_and_the_exporters_import_neither_lightning_nor_transformers():
    # a fresh interpreter, to see what the import alone brings in
    heavy = ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers", "timm")
    code = (
        "import sys\n"
        "from ijepa.interop import load_encoder, save_hf, save_timm, encoder_to_hf, encoder_to_timm, to_official\n"
        f"print([name for name in {heavy!r} if name in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
