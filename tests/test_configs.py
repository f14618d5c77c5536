"""Every shipped config parses and builds its model and data module (no training, no data)."""

import pytest
from conftest import ROOT

from ijepa.cli import IJEPACLI
from ijepa.data.datamodule import IJEPADataModule
from ijepa.module import IJEPA

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
    if data.hparams.num_frames:  # clips: the token grid (T', H', W') is defined once too
        assert model.hparams.num_frames == data.hparams.num_frames
        assert (data.mask_sampler.grid_time, data.grid_size, data.grid_size) == model.encoder.grid
        assert {"EMATargetUpdate", "KNNProbe", "LinearProbe", "ModelCheckpoint", "CollapseMonitor"} <= callbacks
        return
    assert data.grid_size == model.encoder.grid_size
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


ABLATIONS = sorted((ROOT / "configs" / "ablations").glob("pos_*.yaml"))


def test_there_is_an_ablation_for_every_position_type():
    from ijepa.nn import POSITION_EMBEDDINGS

    assert {c.stem.removeprefix("pos_") for c in ABLATIONS} == set(POSITION_EMBEDDINGS)


@pytest.mark.parametrize("overlay", ABLATIONS, ids=[c.stem for c in ABLATIONS])
def test_ablation_overlays_build_on_the_quickstart(overlay, tmp_path):
    quickstart = ROOT / "configs" / "quickstart.yaml"
    cli = IJEPACLI(
        IJEPA,
        IJEPADataModule,
        run=False,
        args=["--config", str(quickstart), "--config", str(overlay), f"--trainer.default_root_dir={tmp_path}"],
    )
    name = overlay.stem.removeprefix("pos_")
    assert cli.model.hparams.pos_embed == name
    from ijepa.nn import POSITION_EMBEDDINGS

    assert type(cli.model.encoder.position) is POSITION_EMBEDDINGS[name]
    assert cli.datamodule.hparams.dataset == "shapes"


def test_plain_ijepa_overlay_switches_every_learning_lever_off(tmp_path):
    root = ROOT / "configs"
    args = ["--config", str(root / "quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}"]
    recipe = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=args)
    plain = IJEPACLI(
        IJEPA, IJEPADataModule, run=False, args=args + ["--config", str(root / "ablations" / "plain_ijepa.yaml")]
    )
    assert recipe.model.hparams.sigreg_weight > 0 and recipe.model.sigreg is not None
    assert plain.model.hparams.sigreg_weight == 0 and plain.model.sigreg is None
    assert plain.model.hparams.target_last_blocks == 1 and plain.model.hparams.rescale_residuals
    assert plain.datamodule.hparams.context_policy == "thin"
    # nothing else differs: the ablation's rows are each this plain recipe plus one lever
    differ = {k for k in recipe.model.hparams if recipe.model.hparams[k] != plain.model.hparams[k]}
    assert differ == {"sigreg_weight"}
