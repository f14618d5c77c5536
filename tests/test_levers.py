"""The learning levers of configs/ablations/: asymmetric recolouring, view invariance, a pixel target
(and pixel-only), frozen and stepwise teachers. Each is an object chosen by class_path."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, TINY_CLIP_MODEL, TINY_MODEL, tiny_datamodule, tiny_trainer
from helpers import Recorder, Stop
from lightning.pytorch.callbacks import ModelCheckpoint

from ijepa.callbacks import EMATargetUpdate
from ijepa.cli import IJEPACLI
from ijepa.data import IJEPADataModule
from ijepa.data.batch import GridBatch
from ijepa.module import IJEPA
from ijepa.objectives import (
    PixelTarget,
    Recolour,
    ViewInvariance,
    invariance_loss,
    norm_pix,
    objective_kinds,
    patchify,
    recolour,
)
from ijepa.optim import OptimConfig
from ijepa.step import StepOutput
from ijepa.teachers import EMATeacher, FrozenTeacher, StepwiseTeacher, teacher_kinds

ABLATIONS = ROOT / "configs" / "ablations"


def record_input(network, seen: dict, name: str) -> None:
    """Keep the first input ``network`` is called with in ``seen[name]`` (the hook changes nothing)."""

    def hook(module, args):
        seen.setdefault(name, args[0].clone())

    network.register_forward_pre_hook(hook)


def batch_of(model: IJEPA, images: int = 4, repeats: int = 1, seed: int = 0) -> GridBatch:
    """A masked batch of random images for ``model``'s grid, ``repeats`` mask rows per image."""
    gen = torch.Generator().manual_seed(seed)
    side = model.encoder.grid[0]
    n = side * side
    x = torch.randn(images, 3, model.hparams.image_size, model.hparams.image_size, generator=gen)
    rows = images * repeats
    order = torch.stack([torch.randperm(n, generator=gen) for _ in range(rows)])
    return GridBatch(x, order[:, :6], order[:, 6:10].view(rows, 2, 2))


# --- recolouring ----------------------------------------------------------------------------------
def test_the_target_encoder_sees_the_original_images_and_each_context_row_its_own_recolouring():
    model = IJEPA(**TINY_MODEL, objectives=[Recolour()]).train()
    batch = batch_of(model, repeats=2)
    seen = {}
    record_input(model.target_encoder, seen, "target")
    record_input(model.encoder, seen, "context")
    model.predict(batch)
    assert torch.equal(seen["target"], batch.images)  # never recoloured
    context = seen["context"]  # [R * B, C, H, W]: rows r * B + i are image i
    assert context.shape == (8, 3, 32, 32)
    for row in range(8):
        assert not torch.allclose(context[row], batch.images[row % 4])
    assert not torch.allclose(context[:4], context[4:])  # the two views of an image differ


def test_recolouring_is_off_in_validation_so_the_val_loss_scores_the_images_themselves():
    model = IJEPA(**TINY_MODEL, objectives=[Recolour()]).eval()
    batch, seen = batch_of(model), {}
    record_input(model.encoder, seen, "context")
    model.predict(batch)
    assert torch.equal(seen["context"], batch.images)


def test_recolour_permutes_channels_scales_them_and_grays_them_as_asked():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 4, 4, generator=gen)
    only_permute = recolour(x, permute=1.0, gain=(1.0, 1.0), grayscale=0, brightness=0, contrast=0, generator=gen)
    for a, b in zip(only_permute, x):  # the same three channels, in some order
        assert any(torch.equal(a, b[list(order)]) for order in itertools.permutations(range(3)))
    assert not torch.equal(only_permute, x)
    gray = recolour(x, permute=0, gain=(1.0, 1.0), grayscale=1.0, brightness=0, contrast=0, generator=gen)
    torch.testing.assert_close(gray, x.mean(1, keepdim=True).expand_as(x))
    gained = recolour(x, permute=0, gain=(0.5, 2.0), grayscale=0, brightness=0, contrast=0, generator=gen)
    ratio = gained / x  # one gain per image and channel, within the range
    assert torch.allclose(ratio, ratio[..., :1, :1].expand_as(ratio), rtol=1e-4)
    assert 0.5 <= ratio.min() and ratio.max() <= 2.0
    one_channel = torch.randn(2, 1, 4, 4)  # nothing to permute or gray: only gain, brightness, contrast
    assert recolour(one_channel).shape == one_channel.shape


@pytest.mark.parametrize(
    "options, message",
    [
        ({"permute": 1.5}, "Recolour permute"),
        ({"gain": [1.2, 0.8]}, "Recolour gain"),
        ({"grayscale": -0.1}, "Recolour grayscale"),
        ({"contrast": 2.0}, "Recolour contrast"),
    ],
)
def test_recolour_refuses_options_out_of_range_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        Recolour(**options)


# --- view invariance ------------------------------------------------------------------------------
def invariance_output(context: torch.Tensor, images: int) -> StepOutput:
    empty = torch.zeros(0)
    return StepOutput(empty, empty, context, torch.zeros(images, 16, 8))


def test_view_invariance_is_zero_for_identical_views_and_positive_for_different_ones():
    member = ViewInvariance(weight=1.0)
    view = torch.randn(4, 6, 8)
    loss = torch.tensor(0.0)
    same, logs = member.add_to(loss, invariance_output(torch.cat([view, view]), 4), 0, None)
    assert same.item() == 0 and logs["view_invariance"].item() == 0
    other, _ = member.add_to(loss, invariance_output(torch.cat([view, view + 1]), 4), 0, None)
    assert other.item() == pytest.approx(1.0)  # the pooled means differ by 1 in every feature


def test_view_invariance_mse_and_cosine_match_their_definitions_over_every_pair_of_views():
    views = torch.randn(3, 5, 8)
    pairs = [(0, 1), (0, 2), (1, 2)]
    mse = sum(((views[a] - views[b]) ** 2).mean() for a, b in pairs) / 3
    cos = sum((1 - F.cosine_similarity(views[a], views[b], dim=-1)).mean() for a, b in pairs) / 3
    torch.testing.assert_close(invariance_loss(views, "mse"), mse)
    torch.testing.assert_close(invariance_loss(views, "cosine"), cos)


def test_view_invariance_gradient_reaches_the_context_encoder_only():
    model = IJEPA(**TINY_MODEL, objectives=[Recolour(), ViewInvariance(weight=1.0, projector=[16])]).train()
    out = model.predict(batch_of(model, repeats=2))
    loss, logs = model.objectives[1].add_to(torch.zeros(()), out, 0, None)
    loss.backward()
    assert logs["view_invariance"] > 0
    assert all(p.grad is not None for p in model.encoder.parameters() if p.requires_grad)
    assert all(p.grad is None for p in model.predictor.parameters())
    assert all(p.grad is None for p in model.target_encoder.parameters())
    assert all(p.grad is not None for p in model.objectives[1].projector.parameters())


def test_view_invariance_refuses_a_training_batch_of_one_view_per_image_naming_masks_per_image():
    model = IJEPA(**TINY_MODEL, objectives=[ViewInvariance()]).train()
    with pytest.raises(ValueError, match="masks_per_image"):
        model.jepa_loss(batch_of(model, repeats=1))


# --- pixel target ---------------------------------------------------------------------------------
def test_patchify_follows_the_patch_embeddings_token_order():
    images = torch.randn(2, 3, 32, 32)
    patches = patchify(images, 8)  # [2, 16, 192]
    for token in range(16):
        row, col = divmod(token, 4)
        expected = images[:, :, row * 8 : row * 8 + 8, col * 8 : col * 8 + 8].reshape(2, -1)
        assert torch.equal(patches[:, token], expected)


def test_the_pixel_loss_equals_a_hand_computed_norm_pix_loss():
    model = IJEPA(**TINY_MODEL, objectives=[PixelTarget(weight=1.0, latent_weight=0.0)]).train()
    batch = batch_of(model, images=2, repeats=2)
    out = model.predict(batch)
    member = model.objectives[0]
    loss, logs = member.add_to(torch.zeros(()), out, 0, None)
    predicted = member.head(out.predictor_hidden)  # [R * B, M, Kt, 192]
    total, count = 0.0, 0
    for row in range(4):
        image = batch.images[row % 2]
        for block in range(2):
            for k in range(2):
                token = int(batch.target_indices[row, block, k])
                r, c = divmod(token, 4)
                pixels = image[:, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8].reshape(-1)
                target = (pixels - pixels.mean()) / (pixels.var(unbiased=True) + 1e-6).sqrt()
                total += ((predicted[row, block, k] - target) ** 2).sum()
                count += target.numel()
    torch.testing.assert_close(loss, total / count)
    torch.testing.assert_close(logs["pixel_loss"], total / count)
    torch.testing.assert_close(norm_pix(torch.tensor([[1.0, 3.0]])), torch.tensor([[-1.0, 1.0]]) / (2 + 1e-6) ** 0.5)


def test_pixel_only_leaves_the_predictors_latent_head_untouched_while_training_the_rest():
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL, objectives=[PixelTarget(weight=1.0, latent_weight=0.0)], optim=OptimConfig(lr=1e-2))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = model.build_optimizer()
    for seed in range(3):
        optimizer.zero_grad(set_to_none=True)
        model.jepa_loss(batch_of(model, seed=seed)).backward()
        assert model.predictor.output_proj.weight.grad is None
        optimizer.step()
    after = model.state_dict()
    for name in ("predictor.output_proj.weight", "predictor.output_proj.bias"):
        assert torch.equal(after[name], before[name]), name
    for name in ("objectives.0.head.weight", "encoder.patch_embed.proj.weight", "predictor.input_proj.weight"):
        assert not torch.equal(after[name], before[name]), name


def test_the_pixel_target_joins_the_latent_loss_with_its_weights():
    torch.manual_seed(0)
    plain = IJEPA(**TINY_MODEL)
    torch.manual_seed(0)
    both = IJEPA(**TINY_MODEL, objectives=[PixelTarget(weight=0.5, latent_weight=2.0)])
    batch = batch_of(plain)
    torch.manual_seed(1)
    latent = plain.jepa_loss(batch)
    torch.manual_seed(1)
    out = both.predict(batch)
    pixel, _ = both.objectives[0].add_to(torch.zeros(()), out, 0, None)
    torch.manual_seed(1)
    torch.testing.assert_close(both.jepa_loss(batch), 2.0 * latent + pixel)


def test_a_pixel_target_refuses_clips_and_an_empty_loss():
    with pytest.raises(ValueError, match="image models"):
        IJEPA(**TINY_CLIP_MODEL, pos_embed="sincos_3d", predictor_pos_embed="sincos_3d", objectives=[PixelTarget()])
    with pytest.raises(ValueError, match="both 0"):
        PixelTarget(weight=0, latent_weight=0)


# --- teachers -------------------------------------------------------------------------------------
class TargetRecorder(Recorder):
    """The target, online and teacher networks' first weight after every optimizer step."""

    def __init__(self, stop_at=None):
        super().__init__(stop_at)
        self.target, self.online, self.teacher = {}, {}, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        self.target[step] = pl_module.target_encoder.patch_embed.proj.weight.detach().clone()
        self.online[step] = pl_module.encoder.patch_embed.proj.weight.detach().clone()
        if pl_module.teacher_network is not None:
            self.teacher[step] = pl_module.teacher_network.patch_embed.proj.weight.detach().clone()


def teacher_run(root, policy, recorder, max_steps=7, checkpoints=False):
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL, teacher_policy=policy, optim=OptimConfig(warmup_steps=2))
    callbacks = [EMATargetUpdate(momentum=0.9), recorder]
    if checkpoints:
        callbacks.append(ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=1, save_top_k=-1))
    trainer = tiny_trainer(
        root, max_steps=max_steps, limit_val_batches=0, enable_checkpointing=checkpoints, callbacks=callbacks
    )
    return model, tiny_datamodule(train_size=64, val_size=16, batch_size=16), trainer


def test_a_frozen_teacher_never_changes_while_the_target_encoder_follows_the_student(tmp_path):
    recorder = TargetRecorder()
    model, data, trainer = teacher_run(tmp_path, FrozenTeacher(), recorder, max_steps=4)
    initial = {k: v.clone() for k, v in model.teacher_network.state_dict().items()}
    assert model.target_network is model.teacher_network and not model.target_by_ema
    trainer.fit(model, datamodule=data)
    for name, value in model.teacher_network.state_dict().items():
        assert torch.equal(value, initial[name]), name
    for step in range(1, 5):  # what probes, monitors and exports read is the encoder that learns
        assert torch.equal(recorder.target[step], recorder.online[step]), step
    assert not torch.equal(recorder.online[4], initial["patch_embed.proj.weight"])  # the online encoder trained


def test_the_stepwise_teacher_copies_the_online_encoder_exactly_every_n_steps(tmp_path):
    recorder = TargetRecorder()
    model, data, trainer = teacher_run(tmp_path, StepwiseTeacher(every_n_steps=3), recorder)
    initial = model.teacher_network.patch_embed.proj.weight.detach().clone()
    trainer.fit(model, datamodule=data)
    for step in range(1, 8):
        assert torch.equal(recorder.target[step], recorder.online[step]), step
        last_copy = recorder.online[step - step % 3] if step >= 3 else initial
        assert torch.equal(recorder.teacher[step], last_copy), step
        if step % 3:
            assert not torch.equal(recorder.teacher[step], recorder.online[step]), step


def test_a_stepwise_teacher_resumed_mid_run_continues_exactly(tmp_path):
    full = TargetRecorder()
    model, data, trainer = teacher_run(tmp_path / "full", StepwiseTeacher(every_n_steps=3), full)
    trainer.fit(model, datamodule=data)

    stopped = TargetRecorder(stop_at=4)  # a copy at step 3, the next one after the resume
    model, data, trainer = teacher_run(tmp_path / "resume", StepwiseTeacher(every_n_steps=3), stopped, checkpoints=True)
    with pytest.raises(Stop):
        trainer.fit(model, datamodule=data)
    resumed = TargetRecorder()
    model, data, trainer = teacher_run(tmp_path / "resume", StepwiseTeacher(every_n_steps=3), resumed, checkpoints=True)
    trainer.fit(model, datamodule=data, ckpt_path=next((tmp_path / "resume" / "ckpt").glob("*step=4.ckpt")))
    assert sorted(resumed.teacher) == [5, 6, 7]
    for step in (5, 6, 7):
        assert resumed.losses[step] == full.losses[step], step
        assert torch.equal(resumed.teacher[step], full.teacher[step]), step
        assert torch.equal(resumed.target[step], full.target[step]), step


@pytest.mark.parametrize(
    "saved, asked, message",
    [
        (EMATeacher(), FrozenTeacher(), "model.teacher_policy=EMATeacher and this run asks for FrozenTeacher"),
        (StepwiseTeacher(every_n_steps=2), EMATeacher(), "StepwiseTeacher and this run asks for EMATeacher"),
    ],
)
def test_resuming_with_a_teacher_of_the_other_kind_is_refused_in_one_line(tmp_path, saved, asked, message):
    model, data, trainer = teacher_run(tmp_path, saved, TargetRecorder(), max_steps=2, checkpoints=True)
    trainer.fit(model, datamodule=data)
    model, data, trainer = teacher_run(tmp_path, asked, TargetRecorder(), max_steps=4, checkpoints=True)
    with pytest.raises(ValueError, match=message):
        trainer.fit(model, datamodule=data, ckpt_path=next((tmp_path / "ckpt").glob("*step=2.ckpt")))


def test_a_frozen_teacher_run_resumes_as_a_stepwise_one_keeping_its_teacher_network(tmp_path):
    model, data, trainer = teacher_run(tmp_path, FrozenTeacher(), TargetRecorder(), max_steps=2, checkpoints=True)
    trainer.fit(model, datamodule=data)
    frozen = model.teacher_network.patch_embed.proj.weight.detach().clone()
    recorder = TargetRecorder()
    model, data, trainer = teacher_run(
        tmp_path, StepwiseTeacher(every_n_steps=4), recorder, max_steps=4, checkpoints=True
    )
    trainer.fit(model, datamodule=data, ckpt_path=next((tmp_path / "ckpt").glob("*step=2.ckpt")))
    assert torch.equal(recorder.teacher[3], frozen) and torch.equal(recorder.teacher[4], recorder.online[4])


def test_the_teacher_policy_is_recorded_and_rebuilt_from_the_checkpoint_hyperparameters():
    model = IJEPA(**TINY_MODEL, teacher_policy=StepwiseTeacher(every_n_steps=5))
    record = model.hparams.teacher_policy
    assert record == {"class_path": "ijepa.teachers.StepwiseTeacher", "init_args": {"every_n_steps": 5}}
    rebuilt = IJEPA(**TINY_MODEL, teacher_policy=record)
    assert isinstance(rebuilt.teacher_policy, StepwiseTeacher) and rebuilt.teacher_policy.every_n_steps == 5
    assert isinstance(IJEPA(**TINY_MODEL).teacher_policy, EMATeacher) and IJEPA(**TINY_MODEL).target_by_ema
    assert {FrozenTeacher, StepwiseTeacher, EMATeacher} <= set(teacher_kinds())
    with pytest.raises(ValueError, match="StepwiseTeacher every_n_steps"):
        StepwiseTeacher(every_n_steps=0)


# --- the configs ----------------------------------------------------------------------------------
LEVER_CONFIGS = {
    "recolour": lambda m, d: [type(o) for o in m.objectives] == [Recolour],
    "view_invariance": lambda m, d: (
        [type(o) for o in m.objectives] == [Recolour, ViewInvariance] and d.masks.masks_per_image == 2
    ),
    "pixel_target": lambda m, d: [type(o) for o in m.objectives] == [PixelTarget] and m.objectives[0].latent == 1,
    "pixel_only": lambda m, d: [type(o) for o in m.objectives] == [PixelTarget] and m.objectives[0].latent == 0,
    "frozen_teacher": lambda m, d: isinstance(m.teacher_policy, FrozenTeacher),
    "stepwise_teacher": lambda m, d: isinstance(m.teacher_policy, StepwiseTeacher),
}


@pytest.mark.parametrize("name", sorted(LEVER_CONFIGS))
def test_each_lever_config_layers_over_the_quickstart_and_switches_its_lever_on(tmp_path, name):
    args = ["--config", str(ROOT / "configs" / "quickstart.yaml"), "--config", str(ABLATIONS / f"{name}.yaml")]
    run = IJEPACLI(IJEPA, IJEPADataModule, run=False, args=[*args, f"--trainer.default_root_dir={tmp_path}"])
    assert LEVER_CONFIGS[name](run.model, run.datamodule)
    assert run.trainer.max_steps == 600  # the quickstart's run, with one lever


def test_every_objective_kind_has_a_lever_config_or_is_v_jepa_2_1s():
    configured = {path.read_text() for path in ABLATIONS.glob("*.yaml")}
    for kind in objective_kinds():
        if kind.__module__.endswith("vjepa21"):
            continue  # the dense study's levers (ijepa.studies.dense)
        assert any(kind.__name__ in text for text in configured), kind.__name__


def test_a_stepwise_teacher_refreshed_no_sooner_than_the_run_ends_is_warned(tmp_path):
    # every_n_steps 7 in a 7-step run: the one copy comes after the last step that uses the teacher
    for every, warned in ((7, True), (9, True), (3, False)):
        model, data, trainer = teacher_run(
            tmp_path / str(every), StepwiseTeacher(every_n_steps=every), TargetRecorder()
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(model, datamodule=data)
        found = [str(w.message) for w in caught if "StepwiseTeacher every_n_steps" in str(w.message)]
        assert bool(found) == warned, (every, found)
        if warned:
            assert f"every_n_steps={every} is not below the run's 7 optimizer steps" in found[0]
