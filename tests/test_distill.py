"""``ijepa distill``: the JEPA step with a frozen teacher as the target encoder and no EMA; the
student is an ordinary checkpoint that resumes exactly and that every reader of checkpoints reads."""

import copy
import shutil
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_CONFIG, TINY_MODEL, save_tiny_checkpoint, tiny_datamodule, tiny_trainer
from helpers import random_loader, save_teacher

from ijepa.callbacks import EMATargetUpdate
from ijepa.checkpoint import load_adapted
from ijepa.cli import build_cli, main
from ijepa.distill import DistillIJEPA, Resized
from ijepa.interop import load_encoder, save_hf
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig
from ijepa.step import normalize_targets

STUDENT = {**TINY_MODEL, "embed_dim": 16, "depth": 1, "num_heads": 2}


@pytest.fixture
def teacher_path(tmp_path):
    return save_teacher(tmp_path / "teacher.ckpt")


def one_batch(image_size=32, patch_size=8):
    torch.manual_seed(0)
    return next(iter(random_loader(num_images=4, image_size=image_size, patch_size=patch_size)))


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("width", [16, 32])
def test_a_distillation_step_is_the_jepa_step_with_the_frozen_teacher_as_target_encoder(teacher_path, width):
    student = DistillIJEPA(teacher=str(teacher_path), **{**STUDENT, "embed_dim": width})
    # the same step by hand: a plain IJEPA holding the student's weights and a frozen copy of the teacher
    plain = IJEPA(**{**STUDENT, "embed_dim": width, "target_dim": 32})
    plain.load_state_dict({k: v for k, v in student.state_dict().items() if not k.startswith("distill.")})
    plain.target_encoder = copy.deepcopy(load_encoder(teacher_path, "target"))
    plain.target_blocks = [2]  # the targets: the teacher's last block (the plain model counts its own depth, 1)
    batch = one_batch()
    for model in (student, plain):
        model.train()
        model.jepa_loss(batch).backward()
    assert torch.equal(student.jepa_loss(batch), plain.jepa_loss(batch))
    theirs = gradients(plain)
    ours = gradients(student)
    assert ours.keys() == theirs.keys() and ours  # the teacher gets none
    for name, grad in ours.items():
        assert torch.equal(grad, theirs[name]), name


def test_the_teacher_stays_frozen_and_the_target_encoder_is_the_student_after_every_step(teacher_path, tmp_path):
    student = DistillIJEPA(teacher=str(teacher_path), **STUDENT, optim=OptimConfig(warmup_steps=1))
    teacher_before = {k: v.clone() for k, v in student.teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in student.encoder.state_dict().items()}
    tiny_trainer(tmp_path, max_steps=3, limit_val_batches=0).fit(student, datamodule=tiny_datamodule())
    for key, value in student.teacher.state_dict().items():
        assert torch.equal(value, teacher_before[key]), key
    assert any(not torch.equal(v, student_before[k]) for k, v in student.encoder.state_dict().items())
    for (name, a), b in zip(student.target_encoder.state_dict().items(), student.encoder.state_dict().values()):
        assert torch.equal(a, b), name


def test_feature_matching_is_smooth_l1_of_every_student_token_through_the_head_against_the_teachers(teacher_path):
    student = DistillIJEPA(teacher=str(teacher_path), objective="features", **STUDENT)
    batch = one_batch()
    teacher = load_encoder(teacher_path, "target")
    expected = F.smooth_l1_loss(
        student.distill["head"](student.encoder(batch.images)), normalize_targets(teacher(batch.images), "layer")
    )
    assert torch.allclose(student.jepa_loss(batch), expected, rtol=0, atol=1e-7)
    student.jepa_loss(batch).backward()
    assert all(p.grad is None for p in student.predictor.parameters())  # not trained: out of the optimizer
    assert not any(p.requires_grad for p in student.predictor.parameters())


def test_a_teacher_whose_grid_the_student_cannot_align_with_is_refused_with_the_size_that_aligns(teacher_path):
    # the teacher: patch 8 at 32 px (4 x 4); a patch-4 student at 32 px has an 8 x 8 grid
    with pytest.raises(ValueError, match=r"4x4 .*8x8.*teacher_image_size=64"):
        DistillIJEPA(teacher=str(teacher_path), **{**STUDENT, "patch_size": 4})


def test_a_teacher_of_another_patch_size_runs_at_teacher_image_size_on_the_resized_images(teacher_path):
    student = DistillIJEPA(teacher=str(teacher_path), teacher_image_size=64, **{**STUDENT, "patch_size": 4})
    assert isinstance(student.teacher, Resized) and student.teacher.network.grid == (8, 8)
    batch = one_batch(patch_size=4)
    resized = F.interpolate(batch.images, size=(64, 64), mode="bilinear", antialias=True, align_corners=False)
    assert torch.equal(student.teacher(batch.images), student.teacher.network(resized))
    assert torch.isfinite(student.jepa_loss(batch))


def test_a_hugging_face_folder_teaches_as_its_checkpoint_does(teacher_path, tmp_path):
    save_hf(load_encoder(teacher_path, "target"), tmp_path / "hf")
    from_folder = DistillIJEPA(teacher=str(tmp_path / "hf"), **STUDENT)
    from_checkpoint = DistillIJEPA(teacher=str(teacher_path), **STUDENT)
    images = one_batch().images
    torch.testing.assert_close(from_folder.teacher(images), from_checkpoint.teacher(images), rtol=1e-5, atol=1e-5)


def test_bad_teachers_are_refused_by_name(teacher_path, tmp_path):
    with pytest.raises(ValueError, match="teacher is required"):
        DistillIJEPA(**STUDENT)
    with pytest.raises(FileNotFoundError, match="teacher="):
        DistillIJEPA(teacher=str(tmp_path / "missing.ckpt"), **STUDENT)
    official = tmp_path / "official.pth.tar"
    torch.save({"encoder": {}, "predictor": {}, "target_encoder": {}}, official)
    with pytest.raises(ValueError, match="official I-JEPA checkpoint: convert it first"):
        DistillIJEPA(teacher=str(official), **STUDENT)
    with pytest.raises(ValueError, match="target_dim=16 is not the teacher's width 32"):
        DistillIJEPA(teacher=str(teacher_path), **STUDENT, target_dim=16)
    with pytest.raises(ValueError, match="teacher_image_size"):
        DistillIJEPA(teacher=str(teacher_path), teacher_image_size=0, **STUDENT)
    with pytest.raises(ValueError, match="objective must be"):
        DistillIJEPA(teacher=str(teacher_path), objective="logits", **STUDENT)


def test_an_ema_callback_is_refused_because_the_target_encoder_is_the_student(teacher_path, tmp_path):
    student = DistillIJEPA(teacher=str(teacher_path), **STUDENT)
    trainer = tiny_trainer(tmp_path, max_steps=1, callbacks=[EMATargetUpdate()])
    with pytest.raises(ValueError, match="EMATargetUpdate moves the target encoder"):
        trainer.fit(student, datamodule=tiny_datamodule())


def test_the_students_checkpoint_reads_as_an_ijepa_model_whose_target_encoder_is_the_student(teacher_path, tmp_path):
    student = DistillIJEPA(teacher=str(teacher_path), **STUDENT)
    trainer = tiny_trainer(tmp_path, max_steps=2, limit_val_batches=0, enable_checkpointing=True)
    trainer.fit(student, datamodule=tiny_datamodule())
    path = tmp_path / "student.ckpt"
    trainer.save_checkpoint(path)
    plain = IJEPA.load_from_checkpoint(path, weights_only=True)
    assert plain.hparams.embed_dim == 16 and plain.hparams.target_dim == 32
    images = one_batch().images
    expected = student.encoder.eval()(images)
    assert torch.equal(plain.eval()(images), expected)
    assert torch.equal(load_encoder(path, "target")(images), expected)
    # at another resolution (ijepa eval --data.image_size, ijepa validate): the student, adapted
    larger = IJEPA.load_from_checkpoint(path, weights_only=True, image_size=64)
    rebuilt = IJEPA(**{**plain.hparams, "image_size": 64})
    load_adapted(rebuilt, torch.load(path, weights_only=True))
    assert torch.equal(rebuilt.eval()(torch.ones(1, 3, 64, 64)), larger.eval()(torch.ones(1, 3, 64, 64)))
    with pytest.raises(ValueError, match="objective='jepa'"):  # resuming with another objective
        other = DistillIJEPA(teacher=str(teacher_path), objective="features", **STUDENT)
        tiny_trainer(tmp_path, max_steps=3).fit(other, datamodule=tiny_datamodule(), ckpt_path=path)


def distilled(teacher_path, tmp_path, steps: int = 1):
    """A student of ``teacher_path`` after ``steps`` steps, saved as ``tmp_path / student.ckpt``."""
    student = DistillIJEPA(teacher=str(teacher_path), **STUDENT)
    trainer = tiny_trainer(tmp_path, max_steps=steps, limit_val_batches=0)
    trainer.fit(student, datamodule=tiny_datamodule())
    trainer.save_checkpoint(tmp_path / "student.ckpt")
    return tmp_path / "student.ckpt"


def resume(teacher, student_path, folder, max_steps: int = 2) -> dict:
    """The checkpoint ``teacher``'s student at ``student_path`` resumed to ``max_steps`` saves in ``folder``."""
    student = DistillIJEPA(teacher=str(teacher), **STUDENT)
    trainer = tiny_trainer(folder, max_steps=max_steps, limit_val_batches=0)
    trainer.fit(student, datamodule=tiny_datamodule(), ckpt_path=student_path)
    trainer.save_checkpoint(folder / "resumed.ckpt")
    return torch.load(folder / "resumed.ckpt", weights_only=True)


def weights_digest(path, encoder: str = "target") -> str:
    from ijepa.distill import weights_sha256  # the teacher's identity in a student's record

    return weights_sha256(load_encoder(path, encoder).state_dict())


def other_teacher(path):
    """A teacher of the same architecture as save_teacher's, with other weights."""
    torch.manual_seed(7)
    return save_tiny_checkpoint(IJEPA(**TINY_MODEL), path)


def test_an_exported_students_model_card_names_the_teacher_its_checkpoint_records(teacher_path, tmp_path):
    from ijepa.interop.convert import convert

    student_path = distilled(teacher_path, tmp_path)
    record = torch.load(student_path, weights_only=True)["distillation"]
    convert(str(student_path), str(tmp_path / "hf"), "hf", dtype="bf16")
    card = (tmp_path / "hf" / "README.md").read_text()
    assert (
        f"| distilled from | `{teacher_path}` (ijepa checkpoint, its target encoder: width 32, depth 2; weights "
        f"`{record['teacher_sha256']}` (`ijepa.distill.weights_sha256`)), objective `jepa` |"
    ) in card
    assert "| width | 16 |" in card


def test_a_cli_built_student_saves_the_teachers_width_as_target_dim_so_a_plain_model_reads_it(teacher_path, tmp_path):
    args = ["--config", str(TINY_CONFIG), f"--model.teacher={teacher_path}", "--model.embed_dim=16", "--model.depth=1"]
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli([*args, "--trainer.logger=false"], run=False, model_class=DistillIJEPA)
    saved = torch.load(save_tiny_checkpoint(cli.model, tmp_path / "student.ckpt"), weights_only=True)
    assert saved["hyper_parameters"]["target_dim"] == 32 and saved["hyper_parameters"]["embed_dim"] == 16
    plain = IJEPA.load_from_checkpoint(tmp_path / "student.ckpt", weights_only=True)
    assert plain.predictor.output_proj.out_features == 32


def test_the_checkpoint_records_the_teachers_path_and_the_sha256_of_its_weights(teacher_path, tmp_path):
    record = torch.load(distilled(teacher_path, tmp_path), weights_only=True)["distillation"]
    assert record["teacher"] == str(teacher_path)
    assert record["teacher_sha256"] == weights_digest(teacher_path, "target")
    assert record["teacher_sha256"] != weights_digest(teacher_path, "online")


def test_resuming_a_student_with_another_teacher_is_refused_naming_both_teachers(teacher_path, tmp_path):
    student_path = distilled(teacher_path, tmp_path)
    ours = torch.load(student_path, weights_only=True)["distillation"]["teacher_sha256"]
    other = other_teacher(tmp_path / "other.ckpt")
    theirs = weights_digest(other)
    with pytest.raises(ValueError) as refused:
        resume(other, student_path, tmp_path / "resumed")
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert f"teacher={str(teacher_path)!r} (target encoder, weights sha256 {ours[:12]})" in message
    assert f"teacher={str(other)!r} (target encoder, weights sha256 {theirs[:12]}) is another model" in message


def test_a_student_resumes_with_a_copy_of_its_teacher_at_another_path_as_with_the_original(teacher_path, tmp_path):
    student_path = distilled(teacher_path, tmp_path, steps=1)
    copy_path = tmp_path / "elsewhere" / "copy.ckpt"
    copy_path.parent.mkdir()
    shutil.copy(teacher_path, copy_path)
    original = resume(teacher_path, student_path, tmp_path / "original")
    copied = resume(copy_path, student_path, tmp_path / "copy")
    assert copied["global_step"] == 2 and copied["distillation"]["teacher"] == str(copy_path)
    assert copied["distillation"]["teacher_sha256"] == original["distillation"]["teacher_sha256"]
    for name, value in original["state_dict"].items():
        assert torch.equal(copied["state_dict"][name], value), name


def test_a_student_saved_without_its_teachers_digest_is_resumed_only_by_the_teacher_weights_it_holds(
    teacher_path, tmp_path
):
    student_path = distilled(teacher_path, tmp_path)
    saved = torch.load(student_path, weights_only=True)
    del saved["distillation"]["teacher_sha256"]  # as written before the digest was recorded
    torch.save(saved, student_path)
    with pytest.raises(ValueError, match=r"weights sha256 not recorded\), this run's teacher="):
        resume(other_teacher(tmp_path / "other.ckpt"), student_path, tmp_path / "other")
    assert resume(teacher_path, student_path, tmp_path / "same")["global_step"] == 2


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_a_plain_model_refuses_to_train_or_validate_a_student_whose_loss_needs_its_teacher(
    teacher_path, tmp_path, stage
):
    student_path = distilled(teacher_path, tmp_path)
    plain = IJEPA(**{**STUDENT, "target_dim": 32})
    trainer = tiny_trainer(tmp_path / "plain", max_steps=2, limit_val_batches=1)
    with pytest.raises(ValueError, match=rf"holds a distilled student \(teacher={str(teacher_path)!r}\), whose loss"):
        getattr(trainer, stage)(plain, datamodule=tiny_datamodule(), ckpt_path=student_path)


def nan_teacher(teacher_path, path):
    saved = torch.load(teacher_path, weights_only=True)
    saved["state_dict"]["target_encoder.transformer.blocks.1.mlp.fc1.weight"][0, 0] = float("nan")
    torch.save(saved, path)
    return path


def test_a_teacher_with_non_finite_weights_is_refused_at_load_naming_the_file_and_the_tensor(teacher_path, tmp_path):
    bad = nan_teacher(teacher_path, tmp_path / "nan.ckpt")
    with pytest.raises(ValueError) as refused:
        DistillIJEPA(teacher=str(bad), **STUDENT)
    assert str(refused.value).startswith(f"teacher={str(bad)!r} holds non-finite weights (1 tensor with NaN or inf: ")
    assert "target_encoder.transformer.blocks.1.mlp.fc1.weight)" in str(refused.value)
    DistillIJEPA(teacher=str(bad), teacher_encoder="online", **STUDENT)  # its online encoder is finite: it teaches


def test_ijepa_distill_refuses_a_non_finite_teacher_in_one_line_before_training(teacher_path, tmp_path, capsys):
    bad = nan_teacher(teacher_path, tmp_path / "nan.ckpt")
    args = ["distill", "--config", str(TINY_CONFIG), f"--model.teacher={bad}", "--model.embed_dim=16"]
    with pytest.raises(SystemExit) as exit:
        main([*args, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and "Traceback" not in "\n".join(err)
    assert (
        err[-1].startswith(f"error: model: teacher={str(bad)!r} holds non-finite weights") and "fc1.weight" in err[-1]
    )


@pytest.mark.parametrize("objective", ["jepa", "features"])
def test_the_per_position_loss_map_adds_up_to_the_students_loss(teacher_path, objective):
    from ijepa.callbacks.jepa_images import position_loss_map

    student = DistillIJEPA(teacher=str(teacher_path), objective=objective, **STUDENT).eval()
    batch = one_batch()
    loss_sum, count = position_loss_map(student, batch)
    assert loss_sum.shape == (16,)
    if objective == "features":  # every token of every image is predicted once
        assert torch.equal(count, torch.full((16,), float(len(batch.images))))
    torch.testing.assert_close(loss_sum.sum() / count.sum(), student.jepa_loss(batch), rtol=1e-6, atol=0)


def test_distill_refuses_a_teacher_policy_its_teacher_would_ignore(teacher_path):
    from ijepa.teachers import FrozenTeacher, StepwiseTeacher

    for policy in (FrozenTeacher(), StepwiseTeacher(every_n_steps=2), {"class_path": "ijepa.teachers.FrozenTeacher"}):
        with pytest.raises(
            ValueError, match=r"ijepa distill's teacher is model.teacher .*model.teacher_policy is ijepa fit's"
        ):
            DistillIJEPA(teacher=str(teacher_path), teacher_policy=policy, **STUDENT)
    student = DistillIJEPA(teacher=str(teacher_path), **STUDENT)  # the default, as a resume reads it back
    assert student.teacher_network is None
    again = DistillIJEPA(teacher=str(teacher_path), teacher_policy=student.hparams.teacher_policy, **STUDENT)
    assert again.teacher_network is None
