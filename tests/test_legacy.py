"""Every older checkpoint and hyperparameter format reads as today's (ijepa.legacy): one test per
format, one that every load path reads an old checkpoint alike, and one that no other module
knows an old format."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import ROOT, TINY_CONFIG, TINY_MODEL

from ijepa.cli import main
from ijepa.data import IJEPADataModule
from ijepa.evaluation.encoders import open_encoder
from ijepa.interop import load_encoder
from ijepa.legacy import (
    REGULARIZER_OPTIONS,
    RENAMED_POSITIONS,
    upgrade_data_hparams,
    upgrade_hparams,
    upgrade_state_dict,
)
from ijepa.module import IJEPA
from ijepa.regularizers import SIGReg, VarianceCovariance

FLAT = dict(
    sigreg_weight=0.3, sigreg_input="both", sigreg_tokens=64, sigreg_slices=32,
    sigreg_projector=[24, 12], sigreg_projector_share=0.5, varcov_weight=0.2, varcov_input="pooled",
)  # fmt: skip
MEMBERS = [SIGReg(0.3, "both", 64, [24, 12], 0.5, slices=32), VarianceCovariance(0.2, "pooled", 64)]


def test_flat_regulariser_options_become_the_same_members_and_weight_zero_stays_off():
    upgraded = upgrade_hparams({"depth": 2, **FLAT})
    assert not set(REGULARIZER_OPTIONS) & set(upgraded) and upgraded["depth"] == 2
    rebuilt = IJEPA(**TINY_MODEL, regularizers=upgraded["regularizers"])
    assert rebuilt.hparams["regularizers"] == IJEPA(**TINY_MODEL, regularizers=MEMBERS).hparams["regularizers"]
    assert upgrade_hparams({"sigreg_weight": 0.0, "varcov_weight": 0.0})["regularizers"] == []
    today = {"depth": 2, "regularizers": []}
    assert upgrade_hparams(today) is today  # nothing old: the same dict, untouched


def test_sigreg_projector_keys_move_to_the_first_built_member_with_a_projector():
    weights = {"sigreg_projector.0.weight": torch.ones(2), "encoder.x": torch.zeros(1)}
    configs = [
        {"class_path": "ijepa.regularizers.SIGReg", "init_args": {"weight": 0.0, "projector": [8]}},  # off: not built
        {"class_path": "ijepa.regularizers.VarianceCovariance", "init_args": {"weight": 0.1}},
        {"class_path": "ijepa.regularizers.SIGReg", "init_args": {"weight": 0.1, "projector": [8]}},
    ]
    state = dict(weights)
    upgrade_state_dict(state, configs)
    assert set(state) == {"regularizers.1.projector.0.weight", "encoder.x"}
    assert state["regularizers.1.projector.0.weight"] is weights["sigreg_projector.0.weight"]
    nowhere = dict(weights)
    upgrade_state_dict(nowhere, configs[1:2])  # no projector: the keys stay, and loading names them
    assert nowhere == weights


@pytest.mark.parametrize("option", ["pos_embed", "predictor_pos_embed"])
def test_learned_3d_becomes_learned_flat_3d_with_a_future_warning(option):
    assert RENAMED_POSITIONS == {"learned_3d": "learned_flat_3d"}
    with pytest.warns(FutureWarning, match="'learned_3d' is now called 'learned_flat_3d'"):
        upgraded = upgrade_hparams({option: "learned_3d", "depth": 2})
    assert upgraded == {option: "learned_flat_3d", "depth": 2}


def _old_checkpoint(path, model: IJEPA) -> None:
    """``model``'s checkpoint as the code before ``model.regularizers`` wrote it."""
    hparams = {key: value for key, value in model.hparams.items() if key != "regularizers"}
    state = {key.replace("regularizers.0.projector.", "sigreg_projector."): v for key, v in model.state_dict().items()}
    torch.save(
        {"state_dict": state, "hyper_parameters": {**hparams, **FLAT}, "pytorch-lightning_version": "2.6.6"}, path
    )


def test_every_load_path_reads_an_old_checkpoint_as_the_model_that_wrote_it(tmp_path):
    model = IJEPA(**TINY_MODEL, regularizers=MEMBERS)
    _old_checkpoint(tmp_path / "old.ckpt", model)
    loaded = IJEPA.load_from_checkpoint(tmp_path / "old.ckpt")
    assert loaded.hparams["regularizers"] == model.hparams["regularizers"]
    assert all(torch.equal(loaded.state_dict()[key], value) for key, value in model.state_dict().items())
    images = torch.randn(2, 3, 32, 32)
    expected = model.target_encoder(images)
    torch.testing.assert_close(load_encoder(tmp_path / "old.ckpt")(images), expected, rtol=0, atol=0)
    frozen, _ = open_encoder(str(tmp_path / "old.ckpt"))  # ijepa eval at the checkpoint's size
    torch.testing.assert_close(frozen.network(images), expected, rtol=0, atol=0)
    larger, _ = open_encoder(str(tmp_path / "old.ckpt"), image_size=48)  # rebuilt, weights adapted
    assert larger.network(torch.randn(1, 3, 48, 48)).shape == (1, 36, 32)


def test_no_module_but_ijepa_legacy_names_an_old_format():
    # names only an old format has (the benchmark prints its own sigreg_weight; studies name variants)
    old = re.compile(r"learned_3d|sigreg_projector|sigreg_slices|varcov_input|knn_batch_size")
    found = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "ijepa").rglob("*.py")
        if path.name != "legacy.py" and old.search(path.read_text())
    ]
    assert found == []


def test_knn_batch_size_reads_as_probe_batch_size_in_a_checkpoint_and_is_named_in_a_config(tmp_path, capsys):
    assert upgrade_data_hparams({"knn_batch_size": 8, "batch_size": 4}) == {"probe_batch_size": 8, "batch_size": 4}
    assert IJEPADataModule(**upgrade_data_hparams({"knn_batch_size": 8})).hparams.probe_batch_size == 8
    (tmp_path / "old.yaml").write_text("data:\n  knn_batch_size: 8\n")
    for old in (["--data.knn_batch_size=8"], ["--config", str(tmp_path / "old.yaml")]):
        with pytest.raises(SystemExit) as exit:
            main(["fit", "--config", str(TINY_CONFIG), *old])
        assert exit.value.code == 2
        assert capsys.readouterr().err.splitlines()[0] == (
            "error: data.knn_batch_size is now called data.probe_batch_size (the same option): rename it in your "
            "config or flag"
        )
