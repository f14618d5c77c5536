"""The objectives of ``model.objectives``: V-JEPA 2.1's context loss (distance weights, warm-up,
off means I-JEPA's step bit for bit) and multi-level targets (one level is I-JEPA's targets; k
levels are each block's normalised output, predicted apart); fits, the CLI and checkpoints."""

import functools
import math

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from helpers import Recorder, cli

from ijepa.callbacks import EMATargetUpdate
from ijepa.data.batch import GridBatch
from ijepa.module import IJEPA
from ijepa.objectives import (
    ContextLoss,
    MultiLevelTargets,
    context_distance_weights,
    objective_kinds,
    refuse_packed,
)
from ijepa.optim import OptimConfig
from ijepa.step import normalize_targets, prediction_loss

# tests/tiny.yaml's architecture, three blocks deep for the levels
MODEL = {**TINY_MODEL, "depth": 3}


def _batch(images: int = 4, padded: bool = False) -> GridBatch:
    torch.manual_seed(1)
    batch = dict(
        images=torch.randn(images, 3, 32, 32),
        context_indices=torch.tensor([[0, 1, 2, 3, 4, 5]] * images),
        target_indices=torch.tensor([[[10, 11], [14, 15]]] * images),
    )
    if padded:
        batch["context_mask"] = torch.tensor([[True] * 6] + [[True] * 4 + [False] * 2] * (images - 1))
        batch["target_mask"] = torch.tensor([[[True, True], [True, False]]] * images)
    return GridBatch(**batch)


def _model(*objectives, seed: int = 0, **options) -> IJEPA:
    torch.manual_seed(seed)
    return IJEPA(**{**MODEL, **options}, objectives=list(objectives))


def _loss_and_grads(model: IJEPA, batch: GridBatch):
    model.zero_grad()
    loss = model.jepa_loss(batch)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["per_block", "one_pass"])
@pytest.mark.parametrize("padded", [False, True])
def test_the_context_loss_at_lambda_zero_is_todays_step_bit_for_bit_and_differs_above(mode, padded):
    batch = _batch(padded=padded)
    plain = _loss_and_grads(_model(predictor_mode=mode), batch)
    for off in ([ContextLoss(weight=0.0)], [ContextLoss(weight=1.0, warmup_steps=10)]):  # the second: at step 0
        loss, grads = _loss_and_grads(_model(*off, predictor_mode=mode), batch)
        assert torch.equal(loss, plain[0])
        assert grads.keys() == plain[1].keys() and all(torch.equal(grads[k], plain[1][k]) for k in grads)
    loss, grads = _loss_and_grads(_model(ContextLoss(weight=1.0), predictor_mode=mode), batch)
    assert loss > plain[0]
    assert not torch.equal(grads["predictor.output_proj.weight"], plain[1]["predictor.output_proj.weight"])


def test_the_context_term_is_the_distance_weighted_loss_of_the_mean_context_prediction():
    model, batch = _model(ContextLoss(weight=0.5), predictor_mode="per_block"), _batch(padded=True)
    out = model.predict(batch)
    with torch.no_grad():
        normed = normalize_targets(model.target_encoder(batch.images))
        expected_targets = torch.stack([normed[i, batch.context_indices[i]] for i in range(len(batch))])
    assert torch.equal(out.context_targets, expected_targets)
    # per_block: the mean over the blocks' sequences of the context outputs
    assert out.context_predictions.shape == (4, 6, 32)
    per_token = torch.nn.functional.smooth_l1_loss(out.context_predictions, out.context_targets, reduction="none")
    weights = context_distance_weights(batch.context_indices, batch.target_indices, (4, 4), batch.context_mask)
    jepa = prediction_loss(out.predictions, out.targets, model.hparams.loss, "none")
    mask = batch.target_mask[..., None].float()
    jepa = (jepa * mask).sum() / (mask.sum() * 32)
    term = (per_token.mean(-1) * weights).sum() / batch.context_mask.sum()
    torch.testing.assert_close(model.jepa_loss(batch), jepa + 0.5 * term)


def _brute_force_weights(context, targets, target_mask, context_mask, grid):
    def coords(index):
        out = []
        for side in reversed(grid):
            out.append(index % side)
            index //= side
        return out[::-1]

    rows = []
    for r in range(len(context)):
        row = []
        for k, c in enumerate(context[r]):
            reals = [t for m, block in enumerate(targets[r]) for j, t in enumerate(block) if target_mask[r][m][j]]
            if not context_mask[r][k] or not reals:
                row.append(0.0)
                continue
            d = min(math.dist(coords(c), coords(t)) for t in reals)
            row.append(1 / math.sqrt(max(d, 1.0)))
        rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("grid", [(5, 6), (3, 4, 5)], ids=["image", "clip"])
def test_distance_weights_match_a_brute_force_loop_over_tokens(grid):
    generator = torch.Generator().manual_seed(0)
    cells = math.prod(grid)
    context = torch.stack([torch.randperm(cells, generator=generator)[:7] for _ in range(3)])
    targets = torch.stack([torch.randperm(cells, generator=generator)[:6].view(3, 2) for _ in range(3)])
    target_mask = torch.ones(3, 3, 2, dtype=torch.bool)
    target_mask[1, 0] = target_mask[1, 2, 1] = False  # a padded row: some blocks' slots are padding
    target_mask[2] = False  # a row without a real target: weight 0
    context_mask = torch.ones(3, 7, dtype=torch.bool)
    context_mask[0, 5:] = False
    mine = context_distance_weights(context, targets, grid, context_mask, target_mask)
    expected = _brute_force_weights(
        context.tolist(), targets.tolist(), target_mask.tolist(), context_mask.tolist(), grid
    )
    torch.testing.assert_close(mine, expected)


def test_lambda_warms_up_linearly_from_zero_over_warmup_steps():
    member = ContextLoss(weight=0.8, warmup_steps=100)
    assert [member.weight_at(s) for s in (0, 50, 100, 250)] == [0.0, 0.4, 0.8, 0.8]
    assert not member.predicts_context(0) and member.predicts_context(1)
    assert ContextLoss(weight=0.8).weight_at(0) == 0.8  # no warm-up


@pytest.mark.parametrize("last_blocks", [1, 2])
def test_one_level_is_todays_targets_loss_and_parameters(last_blocks):
    plain = _model(target_last_blocks=last_blocks)
    one = _model(MultiLevelTargets(levels=1), target_last_blocks=last_blocks)
    assert plain.state_dict().keys() == one.state_dict().keys()
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in one.state_dict().items())
    batch = _batch(padded=True)
    a, b = plain.predict(batch), one.predict(batch)
    assert torch.equal(a.targets, b.targets) and torch.equal(a.predictions, b.predictions)
    assert torch.equal(plain.jepa_loss(batch), one.jepa_loss(batch))


def test_k_levels_are_each_blocks_normalised_output_predicted_apart():
    model, batch = _model(MultiLevelTargets(levels=3), target_norm="instance"), _batch(padded=True)
    assert model.target_blocks == [1, 2, 3] and model.predictor.output_proj.out_features == 3 * 32
    out = model.predict(batch)
    blocks = model.target_encoder.block_outputs(batch.images, 3)
    assert out.predictions.shape == out.targets.shape == (4, 2, 2, 3 * 32)
    for level, block in enumerate(blocks):
        expected = normalize_targets(block, "instance")
        expected = torch.stack([expected[i, batch.target_indices[i]] for i in range(len(batch))])
        torch.testing.assert_close(out.targets[..., level * 32 : (level + 1) * 32], expected)
    # the loss is the mean over levels of each level's (masked) loss
    _, terms = model.objectives[0].add_to(torch.zeros(()), out, 0, prediction_loss)
    assert list(terms) == ["level_1_loss", "level_2_loss", "level_3_loss"]
    torch.testing.assert_close(model.jepa_loss(batch), torch.stack(list(terms.values())).mean())
    # each level has its own slice of the output projection: changing one moves one level only
    with torch.no_grad():
        model.predictor.output_proj.bias[32:64] += 1.0
    moved = model.predict(batch).predictions - out.predictions
    assert torch.equal(moved[..., :32], torch.zeros_like(moved[..., :32]))
    torch.testing.assert_close(moved[..., 32:64], torch.ones_like(moved[..., 32:64]))
    assert MultiLevelTargets(levels=3).target_blocks(12) == [4, 8, 12]


def test_bad_options_name_the_parameter_and_range():
    with pytest.raises(ValueError, match=r"ContextLoss weight must be >= 0, got -1"):
        ContextLoss(weight=-1.0)
    with pytest.raises(ValueError, match=r"ContextLoss warmup_steps must be >= 0"):
        ContextLoss(warmup_steps=-1)
    with pytest.raises(ValueError, match=r"MultiLevelTargets levels must be >= 1"):
        MultiLevelTargets(levels=0)
    with pytest.raises(ValueError, match=r"levels must be <= 3 \(the encoder depth\), got 4"):
        _model(MultiLevelTargets(levels=4))
    with pytest.raises(ValueError, match="target_last_blocks=1"):
        _model(MultiLevelTargets(levels=2), target_last_blocks=2).jepa_loss(_batch())
    assert {ContextLoss, MultiLevelTargets} <= set(objective_kinds())
    with pytest.raises(ValueError, match="native-resolution"):
        refuse_packed([ContextLoss(weight=0.1)], 1)
    refuse_packed([ContextLoss(weight=0.0), MultiLevelTargets(levels=1)], 1)  # neither changes the step


@pytest.mark.parametrize("objective", [ContextLoss(weight=1.0, warmup_steps=2), MultiLevelTargets(levels=2)])
def test_a_short_fit_with_each_lever_runs_logs_its_term_and_its_loss_falls(make_trainer, make_datamodule, objective):
    recorder = Recorder()
    trainer = make_trainer(max_steps=12, callbacks=[EMATargetUpdate(), recorder], limit_val_batches=0)
    model = _model(objective, optim=OptimConfig(lr=5e-3, warmup_steps=2))
    trainer.fit(model, datamodule=make_datamodule(train_size=96, batch_size=8))
    losses = list(recorder.losses.values())
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < sum(losses[:3])
    logged = trainer.logged_metrics
    assert ("train/context_loss" in logged) if isinstance(objective, ContextLoss) else ("train/level_2_loss" in logged)


def test_cli_objectives_reach_the_model_and_a_checkpoint_with_them_reloads(tmp_path, monkeypatch):
    objectives = (
        '[{"class_path":"ijepa.objectives.ContextLoss","init_args":{"weight":0.5,"warmup_steps":1}},'
        '{"class_path":"ijepa.objectives.MultiLevelTargets","init_args":{"levels":2}}]'
    )
    run = cli(
        "fit", "--config", str(TINY_CONFIG), f"--model.objectives={objectives}", "--trainer.max_steps=2",
        f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks=[]", "--trainer.logger=false",
        "--trainer.limit_val_batches=0",
    )  # fmt: skip
    assert [type(m) for m in run.model.objectives] == [ContextLoss, MultiLevelTargets]
    assert run.model.hparams["objectives"][1] == {
        "class_path": "ijepa.objectives.MultiLevelTargets",
        "init_args": {"levels": 2},
    }
    path = tmp_path / "run.ckpt"
    run.trainer.save_checkpoint(path)
    torch.load(path, weights_only=True)  # plain configs
    loaded = IJEPA.load_from_checkpoint(path, weights_only=True)
    assert loaded.hparams["objectives"] == run.model.hparams["objectives"]
    assert loaded.predictor.output_proj.out_features == 2 * 32
    # resuming with another level count is refused, naming the levels
    monkeypatch.setattr(L.Trainer, "fit", functools.wraps(L.Trainer.fit)(lambda *args, **kwargs: None))
    other = cli("fit", "--config", str(TINY_CONFIG), f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={path}",
                "--model.objectives=[]")  # fmt: skip
    with pytest.raises(ValueError, match=r"checkpoint predicts 2 target level\(s\).*this model 1"):
        other.model.on_load_checkpoint(torch.load(path, weights_only=True))
