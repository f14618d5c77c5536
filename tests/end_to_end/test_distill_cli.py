"""``ijepa distill`` from the command line: a student trained, resumed, and a bad teacher named."""

import pytest
import torch
import yaml
from conftest import ROOT
from helpers import save_teacher

from ijepa.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture
def teacher_path(tmp_path):
    return save_teacher(tmp_path / "teacher.ckpt")


def distill_config(tmp_path) -> str:
    """tests/tiny.yaml without its EMA callback: what ijepa distill runs on."""
    config = yaml.safe_load((ROOT / "tests" / "tiny.yaml").read_text())
    config["trainer"]["callbacks"] = [
        c for c in config["trainer"]["callbacks"] if "EMATargetUpdate" not in c["class_path"]
    ]
    config["trainer"]["max_steps"] = 2
    config["trainer"]["default_root_dir"] = str(tmp_path / "runs")
    config["model"] |= {"embed_dim": 16, "depth": 1}
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_ijepa_distill_trains_a_student_and_resumes_it_from_the_command_line(teacher_path, tmp_path):
    config = distill_config(tmp_path)
    main(["distill", "--config", config, f"--model.teacher={teacher_path}", "--data.source.train_size=64"])
    last = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == 2 and saved["distillation"]["teacher_width"] == 32
    assert saved["hyper_parameters"]["embed_dim"] == 16 and "teacher" not in saved["hyper_parameters"]
    args = ["distill", "--config", config, f"--model.teacher={teacher_path}", "--data.source.train_size=64"]
    main([*args, f"--ckpt_path={last}", "--trainer.max_steps=3"])
    resumed = torch.load(
        tmp_path / "runs" / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt", weights_only=True
    )
    assert resumed["global_step"] == 3
    for key, value in saved["state_dict"].items():
        if key.startswith("distill.teacher."):  # the teacher is the same after a resume
            assert torch.equal(resumed["state_dict"][key], value), key


def test_ijepa_distill_names_a_bad_teacher_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["distill", "--config", distill_config(tmp_path), f"--model.teacher={tmp_path / 'nothing.ckpt'}"])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: model: teacher=") and "does not exist" in err[-1]
