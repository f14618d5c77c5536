"""The fine-tuning study (``ijepa.studies.finetune``) and its plain loop
(``ijepa.studies.plain_finetune``): the plain loop runs end to end on a checkpoint's timm export
and refuses bad options in one line; the study runs each row's command once, picks the scratch's
recipe on validation, and its table reads the gains over the better fair scratch and both goals."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from ijepa.studies import finetune, plain_finetune

pytest.importorskip("timm")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--scratch-grid", "0.001:1.5"], "layer decay in (0, 1]"),
        (["--grid", "fast"], "a grid point is LR or LR:LAYER_DECAY, got 'fast'"),
        (["--val-every", "0"], "--val-every must be >= 1, got 0"),
        (["--label-fractions", "0"], "--label-fractions must lie in (0, 1], got 0.0"),
    ],
)
def test_the_plain_loops_bad_options_are_one_line(options, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        plain_finetune.main(["--checkpoint", "x.ckpt", "--out", str(tmp_path), *options])
    assert message in capsys.readouterr().err


def write_run(root: Path, name: str, test: float, val: float, seconds: float = 10.0) -> None:
    folder = root / name / "lightning_logs" / "version_0"
    folder.mkdir(parents=True)
    (folder / "finetune.json").write_text(json.dumps({"test_top1": test, "best_val_top1": val, "fit_seconds": seconds}))


def write_plain(root: Path, start: str, lr: float, fraction: float, seed: int, test: float, val: float) -> None:
    folder = root / "plain"
    folder.mkdir(exist_ok=True)
    record = {
        "test_top1": test,
        "val_top1": val,
        "fit_seconds": 5.0,
        "lr": lr,
        "seed": seed,
        "label_fraction": fraction,
    }
    (folder / plain_finetune.result_name(start, lr, fraction, seed)).write_text(json.dumps(record))


def test_the_table_gains_are_over_the_better_fair_scratch_and_the_goals_are_read_per_seed(tmp_path):
    for seed, (ours, plain, scratch, plain_scratch) in enumerate(((0.40, 0.41, 0.30, 0.33), (0.42, 0.45, 0.36, 0.35))):
        write_run(tmp_path, f"pretrained_f0.1_s{seed}", ours, 0.5)
        write_plain(tmp_path, "pretrained", 0.001, 0.1, seed, plain, 0.5)
        write_run(tmp_path, f"scratch_f0.1_s{seed}_lr0.002", scratch, 0.4)
        write_plain(tmp_path, "timm-init", 0.002, 0.1, seed, plain_scratch, 0.4)
        write_plain(tmp_path, "timm-init", 0.004, 0.1, seed, 0.99, 0.1)  # a worse validation: never chosen
    found = finetune.records(tmp_path)
    assert found[("plain_scratch", 0.1)][0]["lr"] == 0.002
    text = finetune.table(tmp_path)
    assert "| 10 % | pretrained | 2 | 41.0 ± 1.0 | s0 40.0, s1 42.0 | s0 +7.0, s1 +6.0 | - | 10 |" in text
    assert "| 10 % | scratch | 2 |" in text and "s0 0.002, s1 0.002" in text
    assert "`ijepa finetune` minus the plain loop, within 1.5 every seed): s0 -1.0, s1 -3.0: not met." in text
    assert "Goal (pretrained >= the fair scratch + 5 points with 10 % labels on every seed): met." in text


def test_the_scratch_takes_the_recipe_its_plain_twin_chose_on_validation(tmp_path):
    args = finetune.main.__globals__["argparse"].Namespace(
        root=tmp_path, data="shapes", seeds=[0], fractions=[0.1], rows=["scratch"], pretrained=None,
        pretrained_name="pretrain", fit_args="", finetune_args="", plain_args="",
    )  # fmt: skip
    study = finetune.Study(args)
    assert study.scratch_grid(0.1, 0) == finetune.SCRATCH_GRID  # no plain runs yet: the whole grid
    for (lr, _), val in zip(finetune.SCRATCH_GRID, (0.3, 0.5, 0.4)):
        write_plain(tmp_path / "shapes", "timm-init", lr, 0.1, 0, 0.0, val)
    assert study.scratch_grid(0.1, 0) == (finetune.SCRATCH_GRID[1],)


def test_evals_score_the_frozen_pretrained_encoder_its_random_init_and_pixels_under_both_readouts(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    commands = []
    monkeypatch.setattr(finetune, "logged", lambda command, log_file, log: commands.append(command))
    args = finetune.main.__globals__["argparse"].Namespace(
        root=tmp_path, data="shapes", seeds=[2], fractions=[0.1], rows=[], pretrained=tmp_path / "fits",
        pretrained_name="pretrain", fit_args="", finetune_args="", plain_args="", evals=True,
    )  # fmt: skip
    checkpoint = tmp_path / "fits" / "pretrain_s2" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.touch()
    finetune.Study(args).run()
    assert [c[c.index("--checkpoint") + 1] for c in commands] == [str(checkpoint), "random", "pixels"]
    assert all("--data.seed=2" in c and "--cache=false" in c for c in commands)
    assert commands[1][commands[1].index("--architecture") + 1] == finetune.FIT_CONFIG  # the fit's step 0
    assert commands[2][commands[2].index("--data.image_size") + 1] == "48"
    linear = yaml.safe_load((tmp_path / "shapes" / "linear.yaml").read_text())["protocols"]
    assert [p["init_args"].get("name") for p in linear] == [None, "linear_tokens"]  # both readouts
    pixels = yaml.safe_load(Path(commands[2][commands[2].index("--config") + 1]).read_text())["protocols"]
    assert all(p["init_args"]["last_blocks"] == [1] for p in pixels)
    for encoder, (mean, tokens) in {"pretrained": (0.7, 0.8), "random_init": (0.6, 0.8), "pixels": (0.4, 0.82)}.items():
        folder = tmp_path / "shapes" / f"eval_{encoder}_s2"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "linear.json").write_text(json.dumps({"test_top1": mean}))
        (folder / "linear_tokens.json").write_text(json.dumps({"test_top1": tokens}))
    text = finetune.frozen_table(tmp_path / "shapes")
    assert (
        "| pixels | every token | 1 | 82.0 | s2 82.0 |" in text
        and "| random init | mean | 1 | 60.0 | s2 60.0 |" in text
    )
    commands.clear()
    finetune.Study(args).run()
    assert commands == []  # done: nothing runs again
