"""``ijepa.objectives.PredictionNorm``: the latent loss reads layer-normalised predictions (each
level apart), the step's record keeps the predictor's own, the affine pair learns, the CLI and a
checkpoint carry it, and bad options name themselves."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL

from ijepa.data.batch import GridBatch
from ijepa.module import IJEPA
from ijepa.objectives import MultiLevelTargets, PredictionNorm, objective_from_config, objective_kinds
from ijepa.step import prediction_loss

MODEL = {**TINY_MODEL, "depth": 3}


def _batch(images: int = 4) -> GridBatch:
    torch.manual_seed(1)
    return GridBatch(
        images=torch.randn(images, 3, 32, 32),
        context_indices=torch.tensor([[0, 1, 2, 3, 4, 5]] * images),
        target_indices=torch.tensor([[[10, 11], [14, 15]]] * images),
    )


def _model(*objectives, **options) -> IJEPA:
    torch.manual_seed(0)
    return IJEPA(**{**MODEL, **options}, objectives=list(objectives))


def test_the_latent_loss_reads_each_predicted_token_normalised_over_its_features():
    model, batch = _model(PredictionNorm()), _batch()
    out = model.predict(batch)
    plain = _model().predict(batch)
    assert torch.equal(out.predictions, plain.predictions)  # the record keeps the predictor's outputs
    normed = model.objectives[0].latent_predictions(out.predictions)
    assert normed.shape == out.predictions.shape
    torch.testing.assert_close(normed.mean(-1), torch.zeros(normed.shape[:-1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.var(-1, unbiased=False), torch.ones(normed.shape[:-1]), atol=1e-3, rtol=0)
    expected = prediction_loss(F.layer_norm(out.predictions, (32,), eps=1e-6), out.targets, mask=out.target_mask)
    torch.testing.assert_close(model.jepa_loss(batch), expected)
    assert not torch.equal(model.jepa_loss(batch), _model().jepa_loss(batch))


def test_with_multi_level_targets_each_level_is_normalised_apart():
    model = _model(MultiLevelTargets(levels=3), PredictionNorm())
    predictions = torch.randn(2, 5, 3 * 32) * torch.tensor([1.0, 10.0, 100.0]).repeat_interleave(32)
    normed = model.objectives[1].latent_predictions(predictions)
    for level in range(3):
        chunk = slice(level * 32, (level + 1) * 32)
        torch.testing.assert_close(normed[..., chunk], F.layer_norm(predictions[..., chunk], (32,), eps=1e-6))


def test_the_affine_pair_starts_as_the_identity_and_gets_a_gradient():
    model, batch = _model(PredictionNorm(affine=True)), _batch()
    member = model.objectives[0]
    assert torch.equal(member.weight, torch.ones(32)) and torch.equal(member.bias, torch.zeros(32))
    assert {"objectives.0.weight", "objectives.0.bias"} <= dict(model.named_parameters()).keys()
    model.jepa_loss(batch).backward()
    assert member.weight.grad is not None and member.weight.grad.abs().sum() > 0
    assert member.bias.grad is not None and member.bias.grad.abs().sum() > 0


def test_it_is_a_registered_objective_that_rebuilds_from_its_config():
    assert PredictionNorm in objective_kinds()
    member = PredictionNorm(affine=True, eps=1e-5)
    config = member.config()
    assert config == {"class_path": "ijepa.objectives.PredictionNorm", "init_args": {"affine": True, "eps": 1e-5}}
    again = objective_from_config(config)
    assert isinstance(again, PredictionNorm) and again.affine and again.eps == 1e-5


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan")])
def test_a_bad_eps_names_the_option_and_its_range(eps):
    with pytest.raises(ValueError, match=r"PredictionNorm eps must be > 0"):
        PredictionNorm(eps=eps)


def test_unbuilt_it_says_the_model_builds_it():
    with pytest.raises(RuntimeError, match="built by the model"):
        PredictionNorm().latent_predictions(torch.randn(2, 32))
