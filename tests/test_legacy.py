"""Every older checkpoint and hyperparameter format reads as today's (ijepa.legacy): one test per
format, one that every load path reads an old checkpoint alike, and one that no other module
knows an old format."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import ROOT, TINY_CONFIG, TINY_MODEL

from ijepa.cli import build_cli, main
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
from ijepa.optim import OptimConfig
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


def test_knn_batch_size_reads_as_probe_batch_size_in_a_checkpoint_and_a_config_and_is_named_in_a_flag(tmp_path, capsys):
    assert upgrade_data_hparams({"knn_batch_size": 8, "batch_size": 4}) == {"probe_batch_size": 8, "batch_size": 4}
    assert IJEPADataModule(**upgrade_data_hparams({"knn_batch_size": 8})).hparams.probe_batch_size == 8
    (tmp_path / "old.yaml").write_text("data:\n  knn_batch_size: 8\n")
    with pytest.warns(FutureWarning, match=r"data.knn_batch_size -> data.probe_batch_size under their new names"):
        cli = build_cli(["--config", str(TINY_CONFIG), "--config", str(tmp_path / "old.yaml")], run=False)
    assert cli.datamodule.hparams.probe_batch_size == 8
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", str(TINY_CONFIG), "--data.knn_batch_size=8"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "error: data.knn_batch_size is now called data.probe_batch_size (the same option): rename it in your "
        "config or flag"
    )


OLD_OPTIM = dict(lr=5e-4, start_lr=1e-4, final_lr=1e-6, warmup_steps=3, weight_decay=0.05, final_weight_decay=0.1)


def test_flat_optimiser_options_read_as_model_optim_in_a_checkpoint_a_flag_and_a_config(tmp_path, capsys):
    """Before ``model.optim`` the optimiser's options were flat ``model.lr``, ...: an old
    checkpoint loads and resumes with them (a flag of this run still wins), an old flag is mapped
    with a FutureWarning, an old config file's ``model:`` section is read with one."""
    assert upgrade_hparams({"depth": 2, **OLD_OPTIM}) == {"depth": 2, "optim": OLD_OPTIM}
    model = IJEPA(**TINY_MODEL, optim=OLD_OPTIM)
    old = {key: value for key, value in model.hparams.items() if key != "optim"}
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": {**old, **OLD_OPTIM, "betas": [0.9, 0.95]},
            "global_step": 40,
            "pytorch-lightning_version": "2.6.6",
        },
        tmp_path / "old.ckpt",
    )
    loaded = IJEPA.load_from_checkpoint(tmp_path / "old.ckpt")
    assert loaded.optim == OptimConfig(**OLD_OPTIM, betas=(0.9, 0.95)) and loaded.hparams["optim"]["lr"] == 5e-4
    args = ["--config", str(TINY_CONFIG), f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    build_cli(["fit", *args, "--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--model.optim.warmup_steps=0"])
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    saved["hyper_parameters"] = {**saved["hyper_parameters"], **OLD_OPTIM, "betas": [0.9, 0.95]}
    del saved["hyper_parameters"]["optim"]
    torch.save(saved, tmp_path / "resumed.ckpt")
    resume = ["fit", *args, f"--ckpt_path={tmp_path / 'resumed.ckpt'}", "--model.optim.lr=1e-3"]
    with pytest.warns(UserWarning, match="is at step 1"):  # restored, nothing trained
        cli = build_cli([*resume, "--trainer.max_steps=1", "--trainer.limit_val_batches=0"])
    # the flag and tiny.yaml (warmup_steps 5) win, the checkpoint gives the rest (betas)
    assert (cli.model.optim.lr, cli.model.optim.warmup_steps, cli.model.optim.betas) == (1e-3, 5, (0.9, 0.95))
    with pytest.warns(FutureWarning, match=r"^--model.lr is now --model.optim.lr \(the same option\)"):
        cli = build_cli([*args, "--model.lr", "3e-4", "--model.warmup_steps=7"], run=False)
    assert (cli.model.optim.lr, cli.model.optim.warmup_steps) == (3e-4, 7)
    (tmp_path / "old.yaml").write_text("model:\n  lr: 3.0e-4\n  warmup_steps: 7\n")
    moved = r"read model.lr -> model.optim.lr, model.warmup_steps -> model.optim.warmup_steps under their new names"
    with pytest.warns(FutureWarning, match=moved):
        cli = build_cli([*args, "--config", str(tmp_path / "old.yaml")], run=False)
    assert (cli.model.optim.lr, cli.model.optim.warmup_steps, cli.model.optim.final_lr) == (3e-4, 7, 1e-6)


def test_flat_mask_options_read_as_data_masks_in_a_checkpoint_and_a_config_and_are_named_in_a_flag(tmp_path, capsys):
    from ijepa.legacy import mask_option_note
    from ijepa.masks import MultiBlockMasks

    flat = {"target_scale": [0.1, 0.15], "min_keep": 2, "context_scale": [0.85, 1.0], "temporal_scale": [1.0, 1.0]}
    images = upgrade_data_hparams({**flat, "image_size": 32, "num_frames": 0})
    assert images["masks"] == {
        "class_path": "ijepa.masks.MultiBlockMasks",
        "init_args": {"target_scale": [0.1, 0.15], "min_keep": 2, "context_scale": [0.85, 1.0]},
    }
    assert "min_keep" not in images and images["image_size"] == 32
    clips = upgrade_data_hparams({**flat, "num_frames": 4})["masks"]
    assert clips["class_path"] == "ijepa.masks.SpatioTemporalMasks" and "context_scale" not in clips["init_args"]
    # an old checkpoint's data hyperparameters build the data module they described, masks bit for bit
    old = {"image_size": 32, "patch_size": 8, "num_workers": 0, "target_scale": [0.1, 0.15], "min_keep": 2}
    built = IJEPADataModule(**upgrade_data_hparams(old))
    masks = MultiBlockMasks(target_scale=(0.1, 0.15), min_keep=2)
    today = IJEPADataModule(image_size=32, patch_size=8, num_workers=0, masks=masks)
    assert isinstance(built.masks, MultiBlockMasks) and built.hparams.masks == today.hparams.masks
    drawn = [dm.mask_sampler(8, torch.Generator().manual_seed(3)) for dm in (built, today)]
    assert all(torch.equal(a, b) for a, b in zip(*drawn))
    # a config's flat mask options join its kind's (or the multi-block kind), with a note
    (tmp_path / "old.yaml").write_text("data:\n  min_keep: 3\n  target_scale: [0.1, 0.12]\n")
    with pytest.warns(
        FutureWarning, match=r"data.target_scale -> data.masks.init_args.target_scale, data.min_keep -> data.masks"
    ):
        cli = build_cli(["--config", str(TINY_CONFIG), "--config", str(tmp_path / "old.yaml")], run=False)
    assert (cli.datamodule.masks.min_keep, cli.datamodule.masks.target_scale) == (3, (0.1, 0.12))
    # a flag fails naming where it went
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", str(TINY_CONFIG), "--data.min_keep=2"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == f"error: {mask_option_note('min_keep')}"
