"""Options that make no sense are refused or warned before the run: a schedule whose peak is not
its peak, a warm-up longer than the run (the schedule's, or LossSpikeSkip's, which then never
acts), max_steps 0, a resume already past max_steps, a key set twice in a YAML config, a grid too
large to encode."""

import functools
import warnings

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL

from ijepa.cli import build_cli, main
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig

CONFIG = str(TINY_CONFIG)


def error_lines(capsys, *args, command="fit") -> list[str]:
    with pytest.raises(SystemExit) as exit:
        main([command, "--config", CONFIG, *args])
    assert exit.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("flag", "first"),
    [
        (
            "--model.optim.start_lr=0.01",
            "error: model.optim.start_lr must be <= model.optim.lr (the peak of warm-up 0.01 -> lr, then "
            "cosine to final_lr), got start_lr=0.01 above lr=0.002.",
        ),
        (
            "--model.optim.final_lr=0.01",
            "error: model.optim.final_lr must be <= model.optim.lr (the peak of warm-up 0.0002 -> lr, "
            "then cosine to final_lr), got final_lr=0.01 above lr=0.002.",
        ),
        (
            "--trainer.max_steps=0",
            "error: trainer.max_steps: 0 trains no step (fit would end at once, saving nothing); set it >= 1, or -1 "
            "to stop by trainer.max_epochs. To score a checkpoint, use ijepa validate or ijepa eval.",
        ),
    ],
    ids=["start_lr", "final_lr", "max_steps-0"],
)
def test_a_schedule_without_its_peak_and_max_steps_0_are_one_line_naming_them(capsys, flag, first):
    assert error_lines(capsys, flag)[0] == first


def test_a_peak_equal_to_its_ends_is_accepted():
    OptimConfig(1e-3, 1e-3, 1e-3, 10, 0.04, 0.04)
    with pytest.raises(ValueError, match=r"^model.optim.final_lr must be <= model.optim.lr"):
        OptimConfig(1e-3, 1e-3, 1.0000001e-3, 10, 0.04, 0.04)


def test_a_warmup_longer_than_the_run_is_warned_with_what_the_lr_does_instead():
    schedules = OptimConfig(1e-3, 2e-4, 1e-6, 100, 0.04, 0.04)
    assert schedules.warmup_warning(100) is None
    assert schedules.warmup_warning(50) == (
        "model.optim.warmup_steps=100 is longer than the run (50 optimizer steps): the warm-up is squeezed into the "
        "whole run, so the learning rate only climbs (0.0002 -> 0.001) and never decays to final_lr=1e-06. Set "
        "model.optim.warmup_steps below the run's length."
    )
    # what it says is what the schedule does: rising at every step, never decaying
    lrs = [schedules.lr_at(step, 50) for step in range(50)]
    assert all(a < b for a, b in zip(lrs, lrs[1:])) and lrs[0] == 2e-4


def test_fit_warns_of_a_warmup_longer_than_the_run(tmp_path):
    args = ["fit", "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    args += ["--trainer.max_steps=3", "--trainer.limit_val_batches=0", "--model.optim.warmup_steps=5"]
    with pytest.warns(UserWarning, match=r"^model.optim.warmup_steps=5 is longer than the run \(3 optimizer steps\)"):
        main(args)


def test_fit_warns_of_a_loss_spike_guard_whose_warmup_outlasts_the_run(tmp_path):
    args = ["fit", "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    args += ["--trainer.max_steps=3", "--trainer.limit_val_batches=0"]
    guard = '{"class_path": "ijepa.callbacks.LossSpikeSkip", "init_args": {"warmup_steps": 5}}'
    with pytest.warns(
        UserWarning,
        match=r"^LossSpikeSkip.warmup_steps=5 is not below the run's trainer.max_steps=3: .* it will never act",
    ):
        main([*args, f"--trainer.callbacks+={guard}"])


def test_resuming_a_checkpoint_at_or_past_max_steps_says_nothing_will_train(tmp_path, monkeypatch):
    monkeypatch.setattr(L.Trainer, "fit", functools.wraps(L.Trainer.fit)(lambda *a, **k: None))
    monkeypatch.setattr("sys.argv", ["ijepa"])
    model = IJEPA(**TINY_MODEL)
    checkpoint = tmp_path / "step40.ckpt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "global_step": 40,
            "pytorch-lightning_version": L.__version__,
        },
        checkpoint,
    )
    args = ["fit", "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"]
    args.append(f"--ckpt_path={checkpoint}")
    with pytest.warns(UserWarning, match=r"is at step 40 and trainer.max_steps=30: the run is already at or past"):
        build_cli(args + ["--trainer.max_steps=30"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_cli(args + ["--trainer.max_steps=41"])
    assert not [w for w in caught if "past its end" in str(w.message)]


def test_a_key_set_twice_in_a_config_is_refused_naming_the_key_and_both_lines(capsys, tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text("model:\n  optim:\n    lr: 1.0e-3\n    warmup_steps: 2\n    lr: 5.0e-4\n")
    lines = error_lines(capsys, "--config", str(config))
    assert lines[0] == (
        f"error: --config {config}: the key 'lr' is set twice in one mapping (lines 3 and 5); YAML would keep the "
        "second silently. Keep one of them."
    )
    # ijepa eval's configs too
    with pytest.raises(SystemExit) as exit:
        main(["eval", "--config", str(config)])
    assert exit.value.code == 2 and "the key 'lr' is set twice" in capsys.readouterr().err
    # a merge key repeats nothing
    merged = tmp_path / "merged.yaml"
    merged.write_text("model: &m\n  depth: 2\ndata:\n  <<: {batch_size: 8}\n  batch_size: 16\n")
    from ijepa.option_errors import duplicate_keys

    assert duplicate_keys(merged.read_text()) == []


@pytest.mark.parametrize(
    ("flags", "first"),
    [
        (
            ["--data.image_size=4096"],
            "error: model: image_size=4096 / patch_size=8 makes 262,144 tokens per image, above max_tokens=65,536: "
            "each block's token features take 33.6 MB per image and its attention scores, without a fused kernel, "
            "549.8 GB. Use a larger patch_size or a smaller image_size, or raise model.max_tokens (null: no bound).",
        ),
        (
            ["--data.image_size=8"],
            "error: model: image_size=8 (data.image_size) is less than two patches of patch_size=8 (model.patch_size): "
            "I-JEPA needs a grid of at least 2 x 2 tokens; set image_size >= 16 or a smaller patch_size.",
        ),
        (
            ["--model.predictor_num_heads=5"],
            "error: model: predictor_num_heads=5 must divide predictor_embed_dim=16 (each head reads width / heads "
            "channels).",
        ),
    ],
    ids=["4096-pixels", "one-patch", "predictor-heads"],
)
def test_a_grid_too_large_or_too_small_and_heads_that_do_not_divide_are_one_line_naming_them(capsys, flags, first):
    assert error_lines(capsys, *flags)[0] == first


def test_the_token_bound_counts_clips_and_can_be_lifted():
    from ijepa.nn.checks import check_token_grid

    assert check_token_grid(64, 8, 0, 2, 32, 2, 64) == 64  # 8 x 8: at the bound
    assert check_token_grid(64, 8, 16, 2, 32, 2, None) == 8 * 8 * 8  # 8 tubelets deep
    with pytest.raises(ValueError, match=r"makes 512 tokens per clip, above max_tokens=511"):
        check_token_grid(64, 8, 16, 2, 32, 2, 511)
    assert check_token_grid(4096, 8, 0, 2, 32, 2, None) == 512 * 512
