"""Every option error names the option and its valid range or choices in its first line: through
the ``ijepa`` command (callbacks and data sources, checked in a union of types by jsonargparse)
and at construction, for every numeric option of the model, the data, the sources and the
callbacks."""

import functools
import inspect
import logging
import math
import types
import typing
import warnings

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from lightning.pytorch.callbacks import Callback

import ijepa.callbacks
import ijepa.masks
import ijepa.objectives
import ijepa.optim
import ijepa.regularizers
import ijepa.teachers
from ijepa.cli import build_cli, main
from ijepa.data import IJEPADataModule
from ijepa.data.sources import DataSource, ShapesSource
from ijepa.module import IJEPA

CONFIG = str(TINY_CONFIG)


@pytest.fixture
def seed_records():
    """What Lightning's seed logger emits (its "Seed set to N" line)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lightning.fabric.utilities.seed")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def error_lines(capsys, *args) -> list[str]:
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", CONFIG, *args])
    assert exit.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("how", ["flags", "config"])
def test_a_callback_option_error_is_the_first_line_and_names_the_option(capsys, tmp_path, seed_records, how):
    # was: a traceback, then jsonargparse's union error with every callback of the config, the
    # reason 10 lines up from the end
    if how == "flags":
        args = ["--trainer.callbacks+=ijepa.callbacks.KNNProbe", "--trainer.callbacks.k=0"]
    else:
        config = tmp_path / "probe.yaml"
        config.write_text(
            "trainer:\n  callbacks:\n    - class_path: ijepa.callbacks.KNNProbe\n      init_args: {k: 0}\n"
        )
        args = ["--config", str(config)]
    lines = error_lines(capsys, *args)
    assert lines[0] == "error: trainer.callbacks: KNNProbe: k must be >= 1, got 0."
    assert any("Does not validate against any of the Union subtypes" in line for line in lines[1:])  # kept, after
    assert seed_records == []  # Lightning's "Seed set to 0" does not come first


def test_a_data_source_option_error_names_the_source_and_the_option(capsys):
    lines = error_lines(capsys, "--data.source.train_size=0")
    assert lines[0] == "error: data.source: ShapesSource: train_size must be >= 1, got 0."


def concrete_sources() -> list[type]:
    found, pending = [], [DataSource]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not inspect.isabstract(cls):
            found.append(cls)
    return found


@pytest.mark.parametrize("typo", ["--data.source=ShapeSource", "--data.source.class_path=ijepa.data.ShapeSource"])
def test_a_data_source_typo_lists_the_valid_sources(capsys, typo):
    first = error_lines(capsys, typo)[0]
    assert first.startswith("error: data.source: ") and "ShapeSource" in first
    listed = first.split("Choose one of")[1]
    sources = concrete_sources()
    assert ShapesSource in sources and all(f".{cls.__name__}" in listed for cls in sources)
    assert "DataSource," not in listed  # the abstract base is no choice


@pytest.mark.parametrize(
    ("flag", "first"),
    [
        # was: accepted, then a failure inside torch at the first training step
        ("--model.drop_path_rate=1.5", "error: model: drop_path_rate must be in [0, 1), got 1.5."),
        ("--data.batch_size=0", "error: data: batch_size must be >= 1, got 0."),
        (
            "--trainer.max_epochs=-5",
            "error: trainer: `max_epochs` must be a non-negative integer or -1. You passed in -5.",
        ),
    ],
)
def test_a_model_data_or_trainer_option_error_is_one_line_naming_it(capsys, flag, first):
    assert error_lines(capsys, flag) == [first]


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluating_without_a_checkpoint_warns_that_the_model_is_a_random_init(monkeypatch, tmp_path, subcommand):
    # the warning comes before the run; the CLI reads the subcommand's options from the signature
    monkeypatch.setattr(L.Trainer, subcommand, functools.wraps(getattr(L.Trainer, subcommand))(lambda *a, **k: None))
    monkeypatch.setattr("sys.argv", ["ijepa"])
    args = [subcommand, "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    with pytest.warns(UserWarning, match=rf"`ijepa {subcommand}` without --ckpt_path evaluates the model's random"):
        build_cli(args)

    checkpoint = tmp_path / "model.ckpt"
    model = IJEPA(**TINY_MODEL)
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "pytorch-lightning_version": L.__version__,
        },
        checkpoint,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_cli([*args, f"--ckpt_path={checkpoint}"])
    assert not [w for w in caught if "--ckpt_path" in str(w.message)]


# --- every numeric option, at construction ---------------------------------------------------
# Each class's numeric options with a value out of range (a dict: more arguments it needs).
TINY_DATA = dict(source=ShapesSource(train_size=8, val_size=4), image_size=32, patch_size=8, num_workers=0)
NATIVE = dict(native_sides=(2, 4))
BASE = {IJEPA: TINY_MODEL, IJEPADataModule: TINY_DATA}
OUT_OF_RANGE = {
    IJEPA: dict(
        image_size=0,
        patch_size=0,
        in_channels=0,
        embed_dim=0,
        depth=0,
        num_heads=0,
        mlp_ratio=0.0,
        drop_path_rate=1.5,
        predictor_embed_dim=0,
        predictor_depth=0,
        predictor_num_heads=0,
        target_last_blocks=3,  # the depth is 2
        target_dim=0,
        predictor_mlp_ratio=0.0,
        num_frames=-1,
        tubelet_size=0,
        time_unit=0.0,
        activation_checkpointing=-1,
        max_tokens=3,  # a 2 x 2 grid is the smallest
    ),
    IJEPADataModule: dict(
        image_size=0,
        patch_size=0,
        batch_size=0,
        num_workers=-1,
        crop_scale=(0.5, 0.2),
        probe_batch_size=0,
        num_frames=-1,
        tubelet_size=0,
        train_patch_sizes=[8, 0],
        native_sides=(1, 4),
        token_budget={**NATIVE, "token_budget": 4},
        token_drop={**NATIVE, "token_drop": 1.0},
    ),
    ijepa.masks.MultiBlockMasks: dict(
        num_target_blocks=0,
        target_scale=(0.0, 0.2),
        target_aspect_ratio=(0.0, 1.0),
        context_scale=(0.5, 1.5),
        min_keep=0,
        masks_per_image=0,
    ),
    ijepa.masks.SpatioTemporalMasks: dict(
        num_target_blocks=0,
        target_scale=(0.0, 0.2),
        target_aspect_ratio=(0.0, 1.0),
        temporal_scale=(0.0, 1.0),
        min_keep=0,
        masks_per_image=0,
    ),
    ijepa.masks.RandomMasks: dict(mask_ratio=1.0, min_keep=0, masks_per_image=0),
    ijepa.data.ShapesSource: dict(train_size=0, val_size=0, num_objects=(0, 2), radius=(0.2, 0.6)),
    ijepa.data.MovingShapesSource: dict(
        train_size=0, val_size=0, directions=3, speed=(0.0, 1.0), num_objects=0, fps=0.0, radius=(0.0, 0.2)
    ),
    ijepa.data.ImageFolderSource: dict(holdout_fraction=1.0, ignore_index=256),
    ijepa.data.ShardsSource: dict(holdout_fraction=0.0),
    ijepa.data.VideoFolderSource: dict(fps=-1.0, frame_stride=0, holdout_fraction=0.0),
    ijepa.data.STL10Source: {},
    ijepa.callbacks.KNNProbe: dict(k=0, temperature=0.0, every_n_epochs=0),
    ijepa.callbacks.LinearProbe: dict(every_n_epochs=0, weight_decay=-1.0, max_iter=0, last_blocks=0),
    ijepa.callbacks.AttentiveProbe: dict(
        every_n_epochs=0, num_heads=0, steps=0, batch_size=0, lr=0.0, weight_decay=-1.0
    ),
    ijepa.callbacks.CollapseMonitor: dict(
        std_threshold=-1.0, rankme_threshold=-1.0, rankme_fraction=1.5, max_samples=1
    ),
    ijepa.callbacks.EMATargetUpdate: dict(momentum=1.5, final_momentum=-0.1),
    ijepa.callbacks.JEPAImages: dict(num_images=0),
    ijepa.callbacks.LossSpikeSkip: dict(warmup_steps=-1, window=1, num_std=0.0, max_in_a_row=0),
    ijepa.callbacks.RankWatchdog: dict(poll_s=0.0),
    ijepa.callbacks.ThroughputLogger: dict(log_every_n_steps=0, window=0, peak_tflops=0.0),
    ijepa.callbacks.Probe: dict(every_n_epochs=0),
    ijepa.regularizers.SIGReg: dict(
        weight=1.5, tokens=1, projector=[64, 0], projector_share=-0.1, slices=0, num_points=1, t_max=0.0
    ),
    ijepa.regularizers.VarianceCovariance: dict(
        weight=-1.0,
        tokens=1,
        projector=[64, 0],
        projector_share=1.5,
        variance_weight=-1.0,
        covariance_weight=-1.0,
        target_std=0.0,
        eps=0.0,
    ),
    ijepa.objectives.ContextLoss: dict(weight=-0.1, warmup_steps=-1),
    ijepa.objectives.PredictionNorm: dict(eps=0.0),
    ijepa.objectives.MultiLevelTargets: dict(levels=0),
    ijepa.objectives.Recolour: dict(permute=1.5, gain=(1.2, 0.8), grayscale=-0.1, brightness=-0.1, contrast=2.0),
    ijepa.objectives.ViewInvariance: dict(weight=-0.1, projector=[64, 0]),
    ijepa.objectives.PixelTarget: dict(weight=-1.0, latent_weight=-1.0, hidden_dim=-1),
    ijepa.teachers.StepwiseTeacher: dict(every_n_steps=0),
    ijepa.optim.OptimConfig: dict(
        lr=-1e-3,
        start_lr=-1.0,
        final_lr=-1.0,
        warmup_steps=-1,
        weight_decay=-0.1,
        final_weight_decay=-0.1,
        betas=(0.9, 1.0),
    ),
}
NOT_RANGED = {"seed"}  # any int seeds the generators
CASES = [(cls, option, value) for cls, options in OUT_OF_RANGE.items() for option, value in options.items()]


def numeric_options(cls: type) -> set[str]:
    hints = typing.get_type_hints(cls.__init__)
    numeric = set()
    for name in inspect.signature(cls.__init__).parameters:
        pending = [hints.get(name)]
        while pending:
            hint = pending.pop()
            numeric |= {name} if hint in (int, float) else set()
            pending.extend(typing.get_args(hint))
    return numeric - NOT_RANGED


def build(cls, option, value):
    kwargs = value if isinstance(value, dict) else {option: value}
    return cls(**{**BASE.get(cls, {}), **kwargs})


@pytest.mark.parametrize(("cls", "option", "value"), CASES, ids=[f"{c.__name__}.{o}" for c, o, _ in CASES])
def test_every_numeric_option_out_of_range_is_refused_naming_it(cls, option, value):
    with pytest.raises(ValueError) as error:
        build(cls, option, value)
    first = str(error.value).splitlines()[0]
    assert option in first and "must" in first, first


@pytest.mark.parametrize("cls", list(OUT_OF_RANGE), ids=lambda cls: cls.__name__)
def test_the_table_above_covers_every_numeric_option(cls):
    assert numeric_options(cls) == set(OUT_OF_RANGE[cls]), "add the new option and its range check"


def test_every_callback_and_source_with_numeric_options_is_in_the_table():
    exported = [getattr(ijepa.callbacks, name) for name in ijepa.callbacks.__all__]
    callbacks = [c for c in exported if isinstance(c, type) and issubclass(c, Callback)]
    members = list(ijepa.regularizers.regularizer_kinds()) + list(ijepa.objectives.objective_kinds())
    members += list(ijepa.masks.mask_kinds()) + list(ijepa.teachers.teacher_kinds())
    assert {c for c in callbacks + concrete_sources() + members if numeric_options(c)} <= set(OUT_OF_RANGE)


def nan_value(hint):
    """NaN for a float option, (NaN, NaN) for a (min, max) pair of floats, None for other options."""
    options = (hint, *typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if float in options:
        return math.nan
    if any(typing.get_origin(o) is tuple and float in typing.get_args(o) for o in options):
        return (math.nan, math.nan)
    return None


NAN_CASES = [
    (cls, name, nan_value(hint))
    for cls in OUT_OF_RANGE
    for name, hint in typing.get_type_hints(cls.__init__).items()
    if name in numeric_options(cls) and nan_value(hint) is not None
]


@pytest.mark.parametrize(("cls", "option", "value"), NAN_CASES, ids=[f"{c.__name__}.{o}" for c, o, _ in NAN_CASES])
def test_nan_is_refused_by_every_float_option(cls, option, value):
    # a check written `value < 0` is False for NaN, so NaN went through to the first step
    with pytest.raises(ValueError, match=option):
        build(cls, option, value)


@pytest.mark.parametrize("refused", [["--optimizer=Adam"], ["--lr_scheduler.class_path=StepLR"], "config"])
def test_optimizer_and_scheduler_options_are_refused_naming_what_to_set(tmp_path, refused):
    if refused == "config":
        config = tmp_path / "optimizer.yaml"
        config.write_text("optimizer:\n  class_path: torch.optim.SGD\n")
        refused = ["--config", str(config)]
    with pytest.raises(ValueError, match=r"(optimizer|lr_scheduler) cannot be set.*model\.optim"):
        build_cli(["fit", "--config", str(CONFIG), *refused], run=False)
