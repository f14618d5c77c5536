"""``ijepa distill`` runs: a student stopped and resumed continues exactly; from the command line a
student is trained, resumed, and a bad teacher named."""

import lightning as L
import pytest
import torch
import yaml
from conftest import ROOT, TINY_MODEL, save_tiny_checkpoint, tiny_datamodule, tiny_trainer
from helpers import Recorder, Stop, save_teacher
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.cli import main
from ijepa.distill import DistillIJEPA
from ijepa.interop import load_encoder, load_hf
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig

pytestmark = pytest.mark.slow


@pytest.fixture
def teacher_path(tmp_path):
    return save_teacher(tmp_path / "teacher.ckpt")


STUDENT = {**TINY_MODEL, "embed_dim": 16, "depth": 1, "num_heads": 2}


STOP_AT, MAX_STEPS = 3, 6


def distil(tmp_path, teacher_path, recorder):
    L.seed_everything(0)
    student = DistillIJEPA(teacher=str(teacher_path), **STUDENT, optim=OptimConfig(warmup_steps=2), drop_path_rate=0.1)
    trainer = tiny_trainer(
        tmp_path,
        max_steps=MAX_STEPS,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[recorder, ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)],
    )
    return student, tiny_datamodule(train_size=64, val_size=16, batch_size=16), trainer


def test_a_distilled_student_resumes_exactly(tmp_path, teacher_path):
    full = Recorder()
    student, data, trainer = distil(tmp_path / "full", teacher_path, full)
    trainer.fit(student, datamodule=data)
    stopped = Recorder(stop_at=STOP_AT)
    student, data, trainer = distil(tmp_path / "resume", teacher_path, stopped)
    with pytest.raises(Stop):
        trainer.fit(student, datamodule=data)
    resumed = Recorder()
    student, data, trainer = distil(tmp_path / "resume", teacher_path, resumed)
    checkpoint = tmp_path / "resume" / "ckpt" / f"epoch=0-step={STOP_AT}.ckpt"
    trainer.fit(student, datamodule=data, ckpt_path=checkpoint)
    assert sorted(resumed.losses) == list(range(STOP_AT + 1, MAX_STEPS + 1))
    for step in resumed.losses:
        assert resumed.losses[step] == full.losses[step], f"different loss at step {step}"
    final = torch.load(tmp_path / "full" / "ckpt" / f"epoch=1-step={MAX_STEPS}.ckpt", weights_only=True)
    for name, value in student.state_dict().items():
        assert torch.equal(value, final["state_dict"][name]), name


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


HALF = ROOT / "configs" / "distill" / "quickstart_half.yaml"


def half_args(root, teacher) -> list[str]:
    """configs/distill/quickstart_half.yaml made tiny (sizes and steps only): the test teacher's grid
    (32 px / patch 8), a student of half its width (16), 2 steps of 8 images on the CPU."""
    return [
        "--config", str(HALF), f"--model.teacher={teacher}", f"--trainer.default_root_dir={root}",
        "--trainer.accelerator=cpu", "--trainer.max_steps=2", "--trainer.enable_progress_bar=false",
        "--data.image_size=32", "--data.batch_size=8", "--data.num_workers=0",
        "--data.source.train_size=16", "--data.source.val_size=8",
        *(f"--model.{key}={STUDENT[key]}" for key in ("embed_dim", "depth", "num_heads")),
        *(f"--model.{key}={value}" for key, value in STUDENT.items() if key.startswith("predictor_")),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def half_student(tmp_path_factory):
    """``(teacher, run folder, last.ckpt)`` of ``ijepa distill`` with the shipped half-width config."""
    root = tmp_path_factory.mktemp("half")
    teacher = save_teacher(root / "teacher.ckpt")
    main(["distill", *half_args(root / "runs", teacher)])
    return teacher, root / "runs", root / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def test_a_student_of_the_shipped_config_converts_validates_loads_and_resumes(half_student, tmp_path):
    teacher, runs, last = half_student
    saved = torch.load(last, weights_only=True)
    assert saved["hyper_parameters"]["target_dim"] == 32 and saved["hyper_parameters"]["embed_dim"] == 16
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    student = load_encoder(last, "target")(images)
    plain = IJEPA.load_from_checkpoint(last, weights_only=True).eval()
    assert torch.equal(plain(images), student)
    main(["convert", str(last), str(tmp_path / "hf"), "hf"])
    torch.testing.assert_close(load_hf(tmp_path / "hf")(images), student, rtol=1e-5, atol=1e-5)
    assert f"| distilled from | `{teacher}` (ijepa checkpoint" in (tmp_path / "hf" / "README.md").read_text()
    main(["convert", str(last), str(tmp_path / "weights.ckpt"), "ckpt"])
    assert torch.equal(IJEPA.load_from_checkpoint(tmp_path / "weights.ckpt", weights_only=True).eval()(images), student)
    main(["distill", "validate", *half_args(tmp_path / "validate", teacher), f"--ckpt_path={last}"])
    main(["distill", *half_args(runs, teacher), f"--ckpt_path={last}", "--trainer.max_steps=3"])
    resumed = sorted(runs.glob("lightning_logs/version_*/checkpoints/last.ckpt"))[-1]
    assert resumed != last and torch.load(resumed, weights_only=True)["global_step"] == 3


def test_ijepa_distill_refuses_in_one_line_to_resume_a_student_with_another_teacher(half_student, tmp_path, capsys):
    teacher, runs, last = half_student
    torch.manual_seed(7)  # another width too: this run's target_dim is its teacher's, not the checkpoint's
    other = save_tiny_checkpoint(IJEPA(**{**TINY_MODEL, "embed_dim": 48}), tmp_path / "other.ckpt")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["distill", *half_args(tmp_path / "runs", other), f"--ckpt_path={last}", "--trainer.max_steps=3"])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    digest = torch.load(last, weights_only=True)["distillation"]["teacher_sha256"]
    assert exit.value.code == 2 and "Traceback" not in err, err
    assert line.startswith(f"error: ckpt_path={str(last)!r} was distilled from teacher={str(teacher)!r} (target ")
    assert f"sha256 {digest[:12]}), this run's teacher={str(other)!r} (target encoder, weights sha256 " in line
