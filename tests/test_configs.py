"""Every shipped config parses and builds its model and data module (no training, no data), and keeps
best.ckpt by the k-NN probe beside last.ckpt."""

import pytest
from conftest import ROOT
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.cli import IJEPACLI
from ijepa.data.datamodule import IJEPADataModule
from ijepa.module import IJEPA
from ijepa.nn.position import POSITION_ENCODINGS, position_names
from ijepa.regularizers import VarianceCovariance

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_builds(config, tmp_path):
    cli = IJEPACLI(
        IJEPA,
        IJEPADataModule,
        run=False,
        args=["--config", str(config), "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"],
    )
    model, data = cli.model, cli.datamodule
    # the patch grid is defined once: the data's image size and the model's patch size agree
    assert model.hparams.image_size == data.hparams.image_size
    assert data.hparams.patch_size == model.hparams.patch_size
    callbacks = {type(cb).__name__ for cb in cli.trainer.callbacks}
    # best.ckpt by the k-NN probe beside last.ckpt; the ranking one first, which Lightning's
    # --ckpt_path best reads
    checkpoints = [cb for cb in cli.trainer.callbacks if isinstance(cb, ModelCheckpoint)]
    best = [cb for cb in checkpoints if cb.monitor is not None]
    assert [(cb.monitor, cb.mode, cb.filename, cb.save_top_k) for cb in best] == [("val/knn_top1", "max", "best", 1)]
    assert any(cb.save_last for cb in checkpoints) and cli.trainer.checkpoint_callback is best[0]
    if data.hparams.num_frames:  # clips: the token grid (T', H', W') is defined once too
        assert model.hparams.num_frames == data.hparams.num_frames
        assert (data.mask_sampler.grid_time, data.grid_size, data.grid_size) == model.encoder.grid
        assert {"EMATargetUpdate", "KNNProbe", "LinearProbe", "ModelCheckpoint", "CollapseMonitor"} <= callbacks
        return
    assert (data.grid_size, data.grid_size) == model.encoder.grid
    assert {
        "EMATargetUpdate",
        "KNNProbe",
        "ModelCheckpoint",
        "PositionSimilarityImages",
        "PositionEmbeddingInterpolation",
        "CollapseMonitor",
        "JEPAImages",
    } <= callbacks


def test_there_are_the_documented_configs():
    assert {"quickstart", "stl10_vit_tiny", "stl10_vit_small"} <= {c.stem for c in CONFIGS}


@pytest.mark.parametrize("name", position_names(dims=2))
def test_every_image_position_encoding_trains_from_the_quickstart_by_name(name, tmp_path):
    # the position study runs `--model.pos_embed <name>` on the quickstart for every member
    quickstart = ROOT / "configs" / "quickstart.yaml"
    args = ["--config", str(quickstart), f"--model.pos_embed={name}", f"--trainer.default_root_dir={tmp_path}"]
    cli = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)
    assert type(cli.model.encoder.position) is POSITION_ENCODINGS[name]
    assert cli.model.hparams.predictor_pos_embed == "sincos"


def test_position_options_reach_the_encoding_from_yaml(tmp_path):
    quickstart = ROOT / "configs" / "quickstart.yaml"
    args = [
        "--config",
        str(quickstart),
        "--model.pos_embed=rope_axial",
        "--model.pos_options={base: 1000.0}",
        "--model.predictor_pos_options={axis_order: row_col}",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    cli = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)
    assert cli.model.encoder.position.base == 1000.0
    assert cli.model.predictor.position.axis_order == "row_col"


def test_an_option_the_encoding_does_not_have_is_refused_by_name(tmp_path):
    quickstart = ROOT / "configs" / "quickstart.yaml"
    args = ["--config", str(quickstart), "--model.pos_options={base: 10.0}", f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(ValueError, match=r"unknown options \['base'\] for position encoding 'sincos'.*axis_order"):
        IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)


@pytest.mark.parametrize(
    "quickstart, levers",
    [("quickstart.yaml", {"regularizers", "target_norm"}), ("video_quickstart.yaml", {"regularizers"})],
)
def test_plain_ijepa_overlay_switches_every_learning_lever_off(tmp_path, quickstart, levers):
    """The image quickstart is plain I-JEPA plus the variance-covariance terms on the tokens and
    instance-normed targets, the learning study's `+varcov_inorm` row; the video quickstart plain
    I-JEPA plus the terms alone, its `+varcov` row (docs/training.md, docs/video.md)."""
    root = ROOT / "configs"
    args = ["--config", str(root / quickstart), f"--trainer.default_root_dir={tmp_path}"]
    recipe = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)
    plain = IJEPACLI(
        IJEPA, IJEPADataModule, run=False, args=args + ["--config", str(root / "ablations" / "plain_ijepa.yaml")]
    )
    (term,) = recipe.model.regularizers
    assert isinstance(term, VarianceCovariance) and term.weight > 0 and term.input == "tokens"
    assert plain.model.hparams.regularizers == [] and len(plain.model.regularizers) == 0
    assert plain.model.hparams.target_last_blocks == 1 and plain.model.hparams.rescale_residuals
    assert plain.datamodule.hparams.masks["init_args"]["context_policy"] == "thin"
    # nothing else differs: the ablation's rows are each this plain recipe plus one lever
    differ = {k for k in recipe.model.hparams if recipe.model.hparams[k] != plain.model.hparams[k]}
    assert differ == levers
    assert plain.model.hparams.target_norm == "layer"


@pytest.mark.parametrize(
    "quickstart, variant", [("quickstart.yaml", "+varcov_inorm"), ("video_quickstart.yaml", "+varcov")]
)
def test_each_quickstart_is_its_learning_study_row(tmp_path, quickstart, variant):
    """The row the docs report for a quickstart resolves to the shipped config itself: the
    study's overrides on top of the config change none of its model or data settings."""
    from ijepa.studies.learning import VARIANTS

    args = ["--config", str(ROOT / "configs" / quickstart), f"--trainer.default_root_dir={tmp_path}"]
    shipped = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)
    row = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args + VARIANTS[variant])
    assert dict(row.model.hparams) == dict(shipped.model.hparams)
    assert dict(row.datamodule.hparams) == dict(shipped.datamodule.hparams)
