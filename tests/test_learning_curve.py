"""The learning-curve study: budgets as multiples of the recipe's steps, a wall budget that
stops or skips fits, rows kept and resumed, the table against raw pixels, clear refusals."""

import json
import sys

import pytest
import torch
from conftest import ROOT

from ijepa.studies import learning_curve
from ijepa.studies.learning_curve import fit_overrides, max_time


def test_a_budget_multiplies_the_steps_and_spaces_the_validations_as_far_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    shapes = fit_overrides("shapes", None, 10, 600)
    assert shapes == ["--trainer.max_steps=6000", "--trainer.check_val_every_n_epoch=20"]  # the quickstart's 2
    fashion = fit_overrides("fashion", tmp_path, 4, 600)
    assert f"--data.source.root={tmp_path}" in fashion and "--trainer.max_steps=2400" in fashion
    assert [a for a in fashion if "check_val" in a] == ["--trainer.check_val_every_n_epoch=40"]  # its own 10


def test_max_time_is_lightnings_days_hours_minutes_seconds():
    assert max_time(150.7) == "00:00:02:30"
    assert max_time(0.2) == "00:00:00:01"
    assert max_time(90061) == "01:01:01:01"


@pytest.fixture
def fake_runs(monkeypatch):
    """``ijepa fit`` and ``ijepa eval`` replaced: a fit writes a last.ckpt at half its planned
    steps when given a max_time (as if the budget stopped it), else at all of them."""

    class Fits(list):  # the commands run, and beside them the logs they wrote
        logs: list[str]

    fits = Fits()
    fits.logs = []

    def run_logged(command, log_file):
        fits.append(command)
        planned = int(next(a for a in command if a.startswith("--trainer.max_steps=")).split("=")[1])
        reached = planned // 2 if any(a.startswith("--trainer.max_time=") for a in command) else planned
        root = next(a for a in command if a.startswith("--trainer.default_root_dir=")).split("=", 1)[1]
        logs = learning_curve.Path(root) / "lightning_logs"
        folder = logs / f"version_{len(list(logs.glob('version_*')))}" / "checkpoints"  # a new version per fit
        folder.mkdir(parents=True)
        fits.logs.append(log_file.name)
        torch.save({"global_step": reached}, folder / "last.ckpt")
        return 1.0

    monkeypatch.setattr(learning_curve, "run_logged", run_logged)
    monkeypatch.setattr(
        learning_curve,
        "evaluate",
        lambda run_dir, checkpoint, *a, **k: (
            {"eval_linear_top1": 0.5, "eval_linear_tokens_top1": 0.7}
            if run_dir.name.startswith("x")
            else {"eval_linear_top1": 0.6, "eval_linear_tokens_top1": 0.65},
            0.1,
        ),
    )
    return fits


def run(tmp_path, *extra):
    args = learning_curve.argparse.Namespace(
        root=tmp_path, data="shapes", folder=None, fashion_package=None, multiples=[1, 10], base_steps=4, seed=0,
        budget_s=None, eval_reserve_s=0.0, eval_epochs=None, fit_args="", eval_args="", finetune=False,
        finetune_fraction=0.1,
    )  # fmt: skip
    for key, value in zip(extra[::2], extra[1::2]):
        setattr(args, key, value)
    return learning_curve.run(args)


def test_a_spent_budget_skips_the_fits_a_rerun_runs_them_and_a_third_run_skips_what_is_done(
    tmp_path, fake_runs, monkeypatch
):
    monkeypatch.chdir(ROOT)
    skipped = run(tmp_path, "budget_s", 1e-3)
    assert [r["run"] for r in skipped] == ["random init", "raw pixels", "1x", "10x"]
    assert [r.get("stopped_by") for r in skipped[2:]] == ["budget (not started)"] * 2 and not fake_runs
    timed = run(tmp_path, "budget_s", 3600.0)  # a budget: each fit gets a max_time (the fake stops at half)
    assert [(r["run"], r["steps_reached"], r["stopped_by"]) for r in timed[2:]] == [
        ("1x", 2, "budget"),
        ("10x", 20, "budget"),
    ]
    assert all(any(a.startswith("--trainer.max_time=") for a in command) for command in fake_runs)
    assert fake_runs[0][:4] == [sys.executable, "-m", "ijepa", "fit"]
    again = run(tmp_path)
    assert again == timed and len(fake_runs) == 2  # kept rows are read back, not rerun
    table = learning_curve.table(tmp_path / "shapes")
    # eval 0.5 against pixels' 0.6 under the mean readout, 0.7 against 0.65 under every token
    assert "| 10x | 0 | 40 | 20 |" in table and "| 50.0 | 70.0 | -10.0 / +5.0 |" in table


def test_a_study_killed_mid_fit_continues_that_fit_from_its_last_checkpoint(tmp_path, fake_runs, monkeypatch):
    monkeypatch.chdir(ROOT)
    killed = tmp_path / "shapes" / "x10_s0" / "lightning_logs" / "version_0" / "checkpoints"
    killed.mkdir(parents=True)
    torch.save({"global_step": 17}, killed / "last.ckpt")  # the fit died at step 17 of 40, no row kept
    finished = tmp_path / "shapes" / "x1_s0" / "lightning_logs" / "version_0" / "checkpoints"
    finished.mkdir(parents=True)
    torch.save({"global_step": 4}, finished / "last.ckpt")  # the fit ended, its evaluation did not
    rows = {r["run"]: r for r in run(tmp_path)}
    assert len(fake_runs) == 1 and f"--ckpt_path={killed / 'last.ckpt'}" in fake_runs[0]
    assert fake_runs.logs == ["fit.resumed_17.log"]  # the first fit's log is kept
    assert rows["10x"]["resumed_from_step"] == 17 and rows["10x"]["steps_reached"] == 40
    assert rows["1x"]["steps_reached"] == 4 and rows["1x"]["wall_s"] == 0.0 and "resumed_from_step" in rows["1x"]
    assert "| 10x | 0 | 40 | 40 | 1.0 (from step 17) |" in learning_curve.table(tmp_path / "shapes")


def test_finetune_tunes_each_budget_and_one_fair_scratch_and_the_table_says_the_gain(tmp_path, fake_runs, monkeypatch):
    monkeypatch.chdir(ROOT)
    studies = []

    def fake_study(argv):  # the finetune study's results as it writes them: ijepa finetune's and the plain loop's
        studies.append(argv)
        root, rows = learning_curve.Path(argv[argv.index("--root") + 1]) / "shapes", argv[argv.index("--rows") + 1 :]
        name = argv[argv.index("--pretrained-name") + 1]
        for row in rows:
            if row == "plain_scratch":
                for lr, val in ((1e-3, 0.3), (2e-3, 0.4), (4e-3, 0.2)):
                    (root / "plain").mkdir(parents=True, exist_ok=True)
                    result = {"test_top1": val - 0.05, "val_top1": val, "fit_seconds": 1.0, "lr": lr,
                              "label_fraction": 0.1, "seed": 0}  # fmt: skip
                    (root / "plain" / f"timm-init_lr{lr:g}_f0.1_s0.json").write_text(json.dumps(result))
                continue
            top1 = {"scratch": 0.30, "pretrained": 0.40 if name == "x1" else 0.45}[row]
            folder = root / f"{row}_f0.1_s0" / "lightning_logs" / "version_0"
            folder.mkdir(parents=True)
            result = {"test_top1": top1, "best_val_top1": top1, "fit_seconds": 1.0}
            (folder / "finetune.json").write_text(json.dumps(result))

    monkeypatch.setattr(learning_curve.finetune_study, "main", fake_study)
    run(tmp_path, "finetune", True)
    data = tmp_path / "shapes"
    assert [
        (a[a.index("--root") + 1], a[a.index("--pretrained-name") + 1], a[a.index("--rows") + 1 :]) for a in studies
    ] == [
        (str(data / "finetune_scratch"), "x1", ["scratch", "plain_scratch"]),
        (str(data / "finetune_x1"), "x1", ["pretrained"]),
        (str(data / "finetune_x10"), "x10", ["pretrained"]),
    ]
    assert all(a[a.index("--pretrained") + 1] == str(data) and "0.1" in a for a in studies)
    table = learning_curve.table(data)
    # the fair scratch: the better of ijepa finetune's scratch (30.0) and the plain loop's point best on validation (35.0)
    assert "| 40.0 | +5.0 |" in table and "| 45.0 | +10.0 |" in table
    baselines = [line for line in table.splitlines() if line.startswith(("| random init", "| raw pixels"))]
    assert len(baselines) == 2 and all(line.endswith("| - | - |") for line in baselines)  # no fine-tune of theirs


def test_the_study_refuses_bad_budgets_multiples_and_folders(tmp_path, capsys):
    for argv, words in (
        (["--multiples", "0"], "--multiples must be >= 1, got [0]"),
        (["--budget-s", "-1"], "--budget-s must be > 0, got -1.0"),
        (["--finetune-fraction", "0"], "--finetune-fraction must be in (0, 1], got 0.0"),
        (["--folder", str(tmp_path)], "--folder is for --data fashion"),
        (["--data", "fashion", "--folder", str(tmp_path)], "--folder must hold train/ and val/"),
    ):
        with pytest.raises(SystemExit):
            learning_curve.main(["run", "--root", str(tmp_path), *argv])
        assert words in capsys.readouterr().err, argv
