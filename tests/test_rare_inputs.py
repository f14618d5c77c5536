"""Inputs a demanding user tried that met a traceback, a message naming the wrong thing, or a
file others could not read: each now gets one line naming the option or file (exit 2), before
any work where the input allows."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from helpers import fake_commands, one_line

from ijepa.cli import main
from ijepa.evaluation.runner import main as evaluate
from ijepa.interop import save_lightning_checkpoint
from ijepa.interop.convert import main as convert
from ijepa.module import IJEPA

CONFIG = str(TINY_CONFIG)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("ckpt") / "tiny.ckpt")


@pytest.mark.parametrize("subcommand", ["validate", "fit"])
def test_a_file_holding_only_a_state_dict_is_named_in_one_line(capsys, tmp_path, checkpoint, subcommand):
    only = tmp_path / "only.ckpt"
    torch.save({"state_dict": torch.load(checkpoint, weights_only=True)["state_dict"]}, only)
    err = one_line(capsys, main, [subcommand, "--config", CONFIG, f"--ckpt_path={only}"])
    assert err.startswith(f"error: ckpt_path={str(only)!r} holds state_dict but no 'pytorch-lightning_version'"), err
    assert "IJEPA.load_state_dict" in err


def test_a_log_folder_that_cannot_be_written_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    (tmp_path / "lightning_logs").write_text("in the way")  # unwritable for any user, root too
    monkeypatch.setattr(IJEPA, "training_step", lambda *a: pytest.fail("a step ran"))
    err = one_line(capsys, main, ["fit", "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}"])
    assert err.startswith(f"error: trainer.logger: TensorBoardLogger cannot write to {tmp_path / 'lightning_logs'}")


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    ("text", "says"), [(BOMB, "expand to 490,329,064 values"), ("a: &a [1, *a]\n", "expand forever")]
)
def test_a_yaml_alias_bomb_is_refused_in_seconds_naming_the_file(capsys, tmp_path, text, says):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(text)
    start = time.perf_counter()
    err = one_line_parse(capsys, main, ["fit", "--config", CONFIG, "--config", str(bomb)])
    assert time.perf_counter() - start < 30  # it took 41 s to die of MemoryError
    assert err.startswith(f"error: --config {bomb}: its YAML aliases {says}"), err


def one_line_parse(capsys, command, args) -> str:
    """A parse error: the ``error:`` line, then the parser's ``tip:`` line."""
    with pytest.raises(SystemExit) as exit:
        command(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(err) == 2 and err[1].startswith("tip:"), err
    return err[0]


def test_the_expanded_size_of_a_config_is_counted_without_expanding_it():
    from ijepa.option_errors import expanded_values

    assert expanded_values("") == 0
    assert expanded_values("a: 1\nb: [1, 2]\n") == 1 + 2 + 1 + 3  # the mapping, 2 keys, 1, a list of 2
    assert expanded_values("a: &x [1, 2]\nb: [*x, *x]\n") == 1 + 2 + 3 + 1 + 2 * 3
    assert expanded_values(BOMB) > 10**8


def test_an_empty_config_file_says_it_holds_no_options(capsys, tmp_path):
    for text in ("", "# only a comment\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        err = one_line_parse(capsys, main, ["fit", "--config", CONFIG, "--config", str(empty)])
        assert (
            err
            == f"error: --config {empty}: the file holds no options (it is empty, or only comments); give it some keys."
        )


def test_a_section_given_a_list_is_named_with_what_it_takes(capsys, tmp_path):
    config = tmp_path / "list.yaml"
    config.write_text("model: [1, 2]\n")
    err = one_line_parse(capsys, main, ["fit", "--config", CONFIG, "--config", str(config)])
    assert err.startswith(f"error: model: --config {config} gives it list [1, 2]; it takes a mapping of options"), err


def test_a_wrong_type_for_a_source_option_names_the_option_not_the_source(capsys):
    with pytest.raises(SystemExit) as exit:  # the headline, then jsonargparse's report
        main(["fit", "--config", CONFIG, "--data.source.train_size", "abc"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.startswith("error: data.source.train_size: Expected a <class 'int'>"), err


def test_a_flexivit_patch_size_below_a_two_by_two_grid_names_train_patch_sizes(capsys):
    err = one_line(capsys, main, ["fit", "--config", CONFIG, "--data.train_patch_sizes", "[8, 32]"])
    assert err == (
        "error: data: train_patch_sizes: patch size 32 cuts image_size=32 into a 1 x 1 grid; each patch size needs at "
        "least 2 x 2 patches (at most 16 here)."
    )


def test_predict_into_a_file_path_is_refused_before_predicting(capsys, tmp_path, checkpoint, monkeypatch):
    (tmp_path / "taken").write_text("a file")
    monkeypatch.setattr(IJEPA, "predict_step", lambda *a, **k: pytest.fail("predicted before the check"))
    args = ["predict", "--config", CONFIG, f"--ckpt_path={checkpoint}", f"--trainer.default_root_dir={tmp_path}"]
    err = one_line(capsys, main, [*args, f"--feature_writer.output_dir={tmp_path / 'taken'}"])
    assert err.startswith(f"error: feature_writer.output_dir={str(tmp_path / 'taken')!r}: cannot write the features")


def test_two_model_checkpoints_with_the_same_settings_are_one_line_naming_trainer_callbacks(capsys, tmp_path):
    args = ["fit", "--config", CONFIG, f"--trainer.default_root_dir={tmp_path}"]
    err = one_line(capsys, main, [*args, "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true"])
    assert err.startswith("error: trainer.callbacks: two ModelCheckpoint callbacks with the same settings"), err


EVAL = [
    "--accelerator",
    "cpu",
    "--data.num_workers",
    "0",
    "--protocols",
    '[{"class_path": "ijepa.evaluation.KNNProtocol"}]',
]
EVAL += ["--data.source", json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 64}})]


def test_eval_at_too_many_tokens_advises_the_image_size_eval_takes(capsys, tmp_path, checkpoint):
    args = ["--checkpoint", str(checkpoint), "--output_dir", str(tmp_path), "--data.image_size", "4096", *EVAL]
    err = one_line(capsys, evaluate, args)
    assert "262,144 tokens" in err and "model.max_tokens" not in err
    assert err.endswith("Evaluate at a smaller data.image_size (the checkpoint's is 32) or a larger data.patch_size.")


def test_a_timm_export_given_to_eval_says_what_eval_reads(capsys, tmp_path, checkpoint):
    convert([str(checkpoint), str(tmp_path / "timm"), "timm"])
    capsys.readouterr()
    err = one_line(capsys, evaluate, ["--checkpoint", str(tmp_path / "timm"), "--output_dir", str(tmp_path), *EVAL])
    assert err.startswith(f"error: checkpoint={str(tmp_path / 'timm')!r} is a timm export"), err
    assert "ijepa eval reads an ijepa checkpoint" in err


@pytest.mark.parametrize("mask", [0o022, 0o077])
@pytest.mark.parametrize("form", ["hf", "timm"])
def test_exported_weights_get_the_mode_of_any_file_under_the_umask(tmp_path, checkpoint, form, mask):
    old = os.umask(mask)
    try:
        convert([str(checkpoint), str(tmp_path / form), form])
    finally:
        os.umask(old)
    for file in ("model.safetensors", "config.json"):
        assert (tmp_path / form / file).stat().st_mode & 0o777 == 0o666 & ~mask, file  # was 0600 whatever the umask


@pytest.mark.parametrize("outcome", ["passes", "fails"])
def test_ci_removes_its_venv_and_temporary_files_when_it_ends(tmp_path, outcome):
    """`.ci/run` in a copy of the repository, its commands replaced by scripts that write into the
    venv and the temporary folder as the real ones do: nothing of the run is left in either."""
    repo, temp = tmp_path / "repo", tmp_path / "temp"
    (repo / ".ci").mkdir(parents=True)
    temp.mkdir()
    (repo / ".ci" / "run").write_text((ROOT / ".ci" / "run").read_text())
    activate = (
        'mkdir -p "$3/bin"; echo "export PATH=$3/bin:\\$PATH" > "$3/bin/activate"; head -c 1000 /dev/zero > "$3/big"'
    )
    path = fake_commands(
        tmp_path / "bin",
        python3=activate + "\n",
        pip="exit 0\n",
        ruff="exit 0\n",
        pytest='touch "${TMPDIR:-/tmp}/pytest-left-this"\n' + ("exit 1\n" if outcome == "fails" else "exit 0\n"),
    )
    env = {**os.environ, "PATH": path, "TMPDIR": str(temp)}
    done = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True)
    assert done.returncode == (1 if outcome == "fails" else 0), done.stderr
    assert list(temp.iterdir()) == [] and not (repo / ".venv").exists()
