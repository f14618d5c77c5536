"""`ijepa finetune` launches as `ijepa fit` does: the same preflight, the whole command line kept
for further local ranks, config-relative paths, resumes that keep their data, and one-line
refusals of the checkpoints it does not take."""

import shutil
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from conftest import ROOT, TINY_MODEL, save_tiny_checkpoint
from lightning.pytorch.strategies.launchers.subprocess_script import _basic_subprocess_cmd

from ijepa.cli import fit_arguments_error
from ijepa.cli import main as ijepa_main
from ijepa.data.sources import ShapesSource
from ijepa.finetune import FineTuner, cli
from ijepa.finetune.data import FinetuneData
from ijepa.module import IJEPA

CONFIGS = ROOT / "configs"
FINETUNE_CONFIGS = sorted((CONFIGS / "finetune").glob("*.yaml"))


class Parsed(Exception):
    """Carries the resolved config out of a FinetuneCLI before any class is built."""


class ParseOnly(cli.FinetuneCLI):
    def before_instantiate_classes(self) -> None:
        subcommand = self.config["subcommand"]
        with mock.patch.object(cli, "check_run"):  # data folders of other machines (/data/imagenet)
            super().before_instantiate_classes()
        raise Parsed(self.config[subcommand])


def parse_finetune(args: list[str]):
    try:
        ParseOnly(FineTuner, FinetuneData, args=args, parser_class=cli.IJEPAArgumentParser)
    except Parsed as parsed:
        return parsed.args[0]
    raise AssertionError("FinetuneCLI ran past its classes")


def error_of(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        ijepa_main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_finetune_refuses_nodes_without_a_launcher_and_more_processes_than_cores(capsys, monkeypatch):
    monkeypatch.setattr("ijepa.preflight.cpu_cores", lambda: 2)
    config = ["finetune", "--config", "configs/finetune/quickstart.yaml", "--trainer.accelerator", "cpu"]
    assert "trainer.num_nodes=2" in error_of(capsys, [*config, "--trainer.num_nodes", "2"])
    assert "trainer.devices=3" in error_of(capsys, [*config, "--trainer.devices", "3"])


def test_eval_refuses_more_processes_than_cores_naming_its_own_flags(capsys, monkeypatch):
    monkeypatch.setattr("ijepa.preflight.cpu_cores", lambda: 2)
    common = ["eval", "--config", "configs/eval/quickstart.yaml", "--checkpoint", "random", "--accelerator", "cpu"]
    err = error_of(capsys, [*common, "--architecture", "configs/quickstart.yaml", "--devices", "3"])
    assert err.startswith("error: devices=3 with accelerator=cpu") and "trainer." not in err
    assert "num_nodes=2" in error_of(capsys, [*common, "--architecture", "configs/quickstart.yaml", "--num_nodes", "2"])


def test_finetune_keeps_the_whole_command_line_for_the_ranks_lightning_starts(monkeypatch):
    # Lightning starts each further local rank from sys.argv: it must still be the whole command
    seen = {}

    def build_cli(args):
        seen["argv"], seen["args"] = list(sys.argv), args
        seen["child"] = _basic_subprocess_cmd()

    monkeypatch.setattr(cli, "build_cli", build_cli)
    command = ["ijepa", "finetune", "--config", "configs/finetune/quickstart.yaml", "--trainer.devices", "2"]
    monkeypatch.setattr(sys, "argv", command)
    ijepa_main(command[1:])
    assert seen["argv"] == command and seen["args"] == ["fit", *command[2:]]
    assert seen["child"][-len(command) + 1 :] == command[1:]


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in sorted(CONFIGS.rglob("*.yaml"))
        if (yaml.safe_load(p.read_text()) or {}).get("trainer", {}).get("devices", 1) not in (1, None)
    ],
    ids=lambda p: str(p.relative_to(CONFIGS)),
)
def test_every_multi_device_config_parses_in_a_rank_started_as_lightning_starts_it(path, monkeypatch):
    finetune = path.parent.name == "finetune"
    command = ["ijepa", *(["finetune"] if finetune else ["fit"]), "--config", str(path)]
    monkeypatch.setattr(sys, "argv", command)
    child = _basic_subprocess_cmd()  # what a further local rank runs
    words = child[child.index(command[1]) :]
    assert words == command[1:]
    if finetune:
        config = parse_finetune(["fit", *words[1:]])
        assert config.trainer.devices == 8 and config.trainer.strategy == "ddp"
    else:
        assert fit_arguments_error(words[1:]) is None


@pytest.mark.parametrize("path", FINETUNE_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_finetune_config_parses_from_another_folder(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = parse_finetune(["fit", "--config", str(path)])
    architecture = config.model.architecture
    if isinstance(architecture, str):  # read from the config's folder, not the working directory
        assert Path(architecture).is_absolute() and Path(architecture).is_file()


def shipped_fit_and_eval_commands() -> list:
    """Every shipped fit and eval config as the arguments it runs with, one case each: the ablation
    and resolution overlays on the quickstart (as their headers say), an eval overlay on the eval
    quickstart."""
    quickstart = str(CONFIGS / "quickstart.yaml")
    fits = sorted([*CONFIGS.glob("*.yaml"), *(CONFIGS / "presets").glob("*.yaml")])
    cases = [pytest.param("fit", ["--config", str(path)], id=f"fit-{path.stem}") for path in fits]
    for folder in ("ablations", "resolution"):
        for path in sorted((CONFIGS / folder).glob("*.yaml")):
            cases.append(pytest.param("fit", ["--config", quickstart, "--config", str(path)], id=f"fit-{path.stem}"))
    for path in sorted((CONFIGS / "eval").rglob("*.yaml")):
        base = [] if path.parent.name == "eval" else ["--config", str(CONFIGS / "eval" / "quickstart.yaml")]
        cases.append(
            pytest.param("eval", [*base, "--config", str(path), "--checkpoint", "random"], id=f"eval-{path.stem}")
        )
    return cases


@pytest.mark.parametrize(("command", "args"), shipped_fit_and_eval_commands())
def test_every_shipped_fit_and_eval_config_parses_from_another_folder(tmp_path, monkeypatch, command, args):
    from ijepa.evaluation.runner import build_parser

    monkeypatch.chdir(tmp_path)
    if command == "fit":
        assert fit_arguments_error(args) is None
    else:
        build_parser().parse_args(args)


def test_a_missing_architecture_names_the_option_the_file_and_where_it_looked(tmp_path, capsys, monkeypatch):
    config = tmp_path / "ft.yaml"
    text = (CONFIGS / "finetune" / "quickstart.yaml").read_text().replace("../quickstart.yaml", "nowhere.yaml")
    config.write_text(text)
    monkeypatch.chdir(tmp_path)
    err = error_of(capsys, ["finetune", "--config", str(config)])
    assert f"model.architecture='nowhere.yaml' not found (named in {config})" in err
    assert str(tmp_path / "nowhere.yaml") in err


def test_an_old_config_naming_its_architecture_from_the_repository_root_still_works_there(tmp_path, monkeypatch):
    old = tmp_path / "old.yaml"
    old.write_text(
        (CONFIGS / "finetune" / "quickstart.yaml").read_text().replace("../quickstart.yaml", "configs/quickstart.yaml")
    )
    monkeypatch.chdir(ROOT)
    assert parse_finetune(["fit", "--config", str(old)]).model.architecture == str(ROOT / "configs" / "quickstart.yaml")


def test_a_resume_with_other_data_is_refused_naming_both_values(tmp_path):
    source = ShapesSource(train_size=64, val_size=32)
    saved = FinetuneData(source=source, label_fraction=0.5, image_size=32, num_workers=0).state_dict()
    for change, words in (
        ({"label_fraction": 0.1}, "data.label_fraction=0.1 where the checkpoint has 0.5"),
        ({"label_fraction": 0.5, "seed": 3}, "data.seed=3 where the checkpoint has 0"),
        ({"label_fraction": 0.5, "source": ShapesSource(train_size=128, val_size=32)}, "data.source="),
    ):
        other = FinetuneData(**{"source": source, "image_size": 32, "num_workers": 0, **change})
        with pytest.raises(ValueError, match="resuming with other data than the checkpoint's") as error:
            other.load_state_dict(saved)
        assert words in str(error.value)
    FinetuneData(source=source, label_fraction=0.5, image_size=32, num_workers=0).load_state_dict(saved)  # the same


def test_finetune_validate_of_a_pretraining_checkpoint_says_what_it_is(tmp_path, capsys):
    checkpoint = save_tiny_checkpoint(IJEPA(**TINY_MODEL), tmp_path / "fit.ckpt")
    err = error_of(
        capsys, ["finetune", "validate", "--config", "configs/finetune/quickstart.yaml", f"--ckpt_path={checkpoint}"]
    )
    assert "is a pretraining checkpoint (ijepa fit)" in err and f"--model.checkpoint {checkpoint}" in err


def test_convert_of_a_fine_tuned_checkpoint_points_at_finetune_export(tmp_path, capsys):
    encoder = {key: TINY_MODEL[key] for key in ("image_size", "patch_size", "embed_dim", "depth", "num_heads")}
    model = FineTuner(architecture={**encoder, "pos_embed": "learned"}, num_classes=3)
    path = tmp_path / "tuned.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    for to in ("hf", "ckpt"):
        err = error_of(capsys, ["convert", str(path), str(tmp_path / f"out_{to}"), to])
        assert "is a fine-tuned classifier (ijepa finetune)" in err and "ijepa finetune export" in err
        assert not (tmp_path / f"out_{to}").exists()


def test_random_without_an_architecture_names_finetunes_flag(capsys):
    err = error_of(capsys, ["finetune", "--config", "configs/finetune/quickstart.yaml", "--model.architecture", "null"])
    assert "(--model.architecture)" in err


def test_a_copied_config_folder_fine_tunes_from_its_own_architecture(tmp_path, monkeypatch):
    # a config tree moved elsewhere keeps working: its relative paths move with it
    shutil.copytree(CONFIGS, tmp_path / "configs")
    monkeypatch.chdir(tmp_path / "configs" / "finetune")
    config = parse_finetune(["fit", "--config", "quickstart.yaml"])
    assert config.model.architecture == str((tmp_path / "configs" / "quickstart.yaml").resolve())


def test_eval_refuses_a_missing_data_folder_before_anything_is_built(capsys, tmp_path):
    common = ["eval", "--config", "configs/eval/stl10.yaml", "--checkpoint", "random"]
    err = error_of(capsys, [*common, "--architecture", "configs/quickstart.yaml", f"--data.source.root={tmp_path}"])
    assert err.startswith("error: STL-10 not found") and f"{tmp_path}/stl10_binary" in err  # the source given


def test_an_unknown_scratch_init_names_the_option_and_its_choices(capsys):
    err = error_of(capsys, ["finetune", "--config", "configs/finetune/quickstart.yaml", "--model.init", "xavier"])
    assert "model.init must be one of timm, ijepa, got 'xavier'" in err and len(err.strip().splitlines()) == 1
