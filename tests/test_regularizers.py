"""The regularisers: SIGReg's and VICReg's statistics, gradients and global-batch values under DDP;
as ``model.regularizers`` members, how they join the loss, and old checkpoints' flat options."""

import functools
import math

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL

from ijepa.cli import build_cli
from ijepa.data.batch import GridBatch
from ijepa.module import IJEPA
from ijepa.regularizers import (
    ContextTokens,
    Projector,
    Regularizer,
    SIGReg,
    VarianceCovariance,
    epps_pulley_terms,
    random_directions,
    regularizer_kinds,
    sample_tokens,
)

# a one-block model whose step runs in milliseconds, for the regularisers inside IJEPA
ONE_BLOCK = {**TINY_MODEL, "depth": 1}


def test_sigreg_is_near_its_gaussian_expectation_for_gaussian_samples_at_any_batch_size():
    # E[N |phi_N(t) - phi(t)|^2] = 1 - exp(-t^2), integrated against exp(-t^2/2) over [-3, 3]
    t = torch.linspace(-3, 3, 20001)
    expected = float(torch.trapezoid((1 - torch.exp(-(t**2))) * torch.exp(-(t**2) / 2), t))
    sigreg = SIGReg(slices=512).statistic
    for n in (256, 4096):
        values = [float(sigreg(torch.randn(n, 64), step=s)) for s in range(4)]
        assert sum(values) / len(values) == pytest.approx(expected, rel=0.15)


def test_sigreg_is_large_for_collapsed_low_rank_and_shrunk_samples():
    sigreg = SIGReg().statistic
    gaussian = float(sigreg(torch.randn(1024, 64)))
    collapsed = float(sigreg(torch.ones(1024, 64) * 0.3))
    low_rank = float(sigreg(torch.randn(1024, 2) @ torch.randn(2, 64) / math.sqrt(2)))
    shrunk = float(sigreg(0.1 * torch.randn(1024, 64)))
    for value in (collapsed, low_rank, shrunk):
        assert value > 20 * gaussian


def test_sigreg_grows_with_the_sample_count_when_not_gaussian():
    sigreg = SIGReg().statistic
    low_rank = torch.randn(4096, 1) @ torch.randn(1, 32)
    assert float(sigreg(low_rank)) > 3 * float(sigreg(low_rank[:1024]))


def test_gradient_steps_push_a_collapsed_batch_apart():
    torch.manual_seed(0)
    x = (torch.randn(512, 1) @ torch.randn(1, 32) * 0.1 + 0.01 * torch.randn(512, 32)).requires_grad_(True)
    sigreg = SIGReg(slices=128).statistic
    optimizer = torch.optim.Adam([x], lr=0.05)
    start_value = float(sigreg(x.detach(), step=0))
    start = torch.linalg.svdvals(x.detach())
    assert start[-1] / start[0] < 0.05  # nearly rank 1
    for step in range(200):
        optimizer.zero_grad()
        sigreg(x, step=step).backward()
        optimizer.step()
    assert float(sigreg(x, step=999)) < start_value / 20
    singular = torch.linalg.svdvals(x.detach())
    assert singular[-1] / singular[0] > 0.2  # every direction filled


def test_directions_are_unit_vectors_fixed_by_the_seed():
    a = random_directions(16, 8, seed=3)
    assert a.shape == (16, 8)
    assert torch.allclose(a.norm(dim=0), torch.ones(8))
    assert torch.equal(a, random_directions(16, 8, seed=3))
    assert not torch.equal(a, random_directions(16, 8, seed=4))


def test_characteristic_function_sums_match_the_definition():
    x = 3 * torch.randn(1000, 3)
    t = torch.arange(17) * 0.2
    cos_sum, sin_sum = epps_pulley_terms(x, 0.2, 17)
    ecf = torch.exp(1j * x.double()[..., None] * t.double()).sum(0)
    assert torch.allclose(cos_sum.double(), ecf.real, atol=1e-3) and torch.allclose(
        sin_sum.double(), ecf.imag, atol=1e-3
    )


def test_characteristic_function_sums_have_the_analytic_gradient():
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    t = torch.arange(5, dtype=torch.float64) * 0.7
    weights_cos, weights_sin = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    cos_sum, sin_sum = epps_pulley_terms(x, 0.7, 5)
    (grad,) = torch.autograd.grad((cos_sum * weights_cos + sin_sum * weights_sin).sum(), x)
    angles = x.detach()[..., None] * t
    expected = (-angles.sin() * t * weights_cos + angles.cos() * t * weights_sin).sum(-1)
    assert torch.allclose(grad.double(), expected, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{"slices": 0}, {"num_points": 1}, {"t_max": 0.0}])
def test_bad_settings_name_the_parameter(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SIGReg(**kwargs)


def test_bad_input_shape_is_an_error():
    with pytest.raises(ValueError, match="embeddings"):
        SIGReg().statistic(torch.randn(4, 5, 6))


def test_projector_maps_tokens_to_its_last_width_through_batchnorm_and_gelu():
    projector = Projector(32, [64, 48, 16])
    assert [type(m).__name__ for m in projector] == [
        "Linear",
        "BatchNorm1d",
        "GELU",
        "Linear",
        "BatchNorm1d",
        "GELU",
        "Linear",
    ]
    assert projector(torch.randn(10, 32)).shape == (10, 16)
    assert Projector(32, [8])(torch.randn(3, 32)).shape == (3, 8)  # one width: a single Linear


@pytest.mark.parametrize("widths", [[], [0], [64, -1]])
def test_projector_rejects_empty_or_non_positive_widths(widths):
    with pytest.raises(ValueError, match="projector widths"):
        Projector(32, widths)


def test_varcov_is_zero_for_whitened_samples_and_matches_the_covariance_matrix():
    x = torch.randn(4096, 32, dtype=torch.float64)
    x = (x - x.mean(0)) @ torch.linalg.inv(torch.linalg.cholesky(torch.cov(x.T)).T)  # covariance exactly I
    hinge, covariance = VarianceCovariance(eps=1e-12).terms(x)
    assert float(hinge) < 1e-5 and float(covariance) < 1e-8
    y = torch.randn(512, 8) @ torch.randn(8, 8)
    reference = torch.cov(y.T)
    std = torch.sqrt(reference.diagonal() + 1e-4)
    expected_hinge = torch.relu(1 - std).mean()
    expected_cov = (reference - torch.diag(reference.diagonal())).pow(2).sum() / 8
    hinge, covariance = VarianceCovariance().terms(y)
    assert torch.allclose(hinge, expected_hinge, atol=1e-5) and torch.allclose(covariance, expected_cov, rtol=1e-4)
    varcov = VarianceCovariance(variance_weight=25.0, covariance_weight=1.0)
    assert torch.allclose(varcov.statistic(y), 25 * expected_hinge + expected_cov, rtol=1e-4)


def test_varcov_is_large_for_collapsed_and_correlated_samples_and_its_gradient_spreads_them():
    varcov = VarianceCovariance().statistic
    gaussian = float(varcov(torch.randn(1024, 16)))
    collapsed = float(varcov(torch.ones(1024, 16) * 0.3 + 1e-3 * torch.randn(1024, 16)))
    low_rank = float(varcov(torch.randn(1024, 1) @ torch.ones(1, 16)))  # every dimension the same
    assert gaussian < 1.0 and collapsed > 20 and low_rank > 10
    # the hinge's gradient per sample scales as 1 / N: plain SGD needs a large step
    x = (0.05 * torch.randn(256, 16)).requires_grad_(True)
    optimizer = torch.optim.SGD([x], lr=10.0)
    for _ in range(20):
        optimizer.zero_grad()
        varcov(x).backward()
        optimizer.step()
    assert 0.9 < float(x.detach().std(0).mean()) < 1.5  # pushed up to the target std of 1, not beyond
    assert float(varcov(x)) < 0.1 * collapsed


@pytest.mark.parametrize(
    "kwargs, name",
    [({"variance_weight": -1.0}, "variance_weight"), ({"target_std": 0.0}, "target_std"), ({"eps": 0.0}, "eps")],
)
def test_varcov_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        VarianceCovariance(**kwargs)
    with pytest.raises(ValueError, match="embeddings"):
        VarianceCovariance().statistic(torch.randn(4, 5, 6))


# --- regularisers in the model: model.regularizers ---------------------------------------------
def _batch(images: int = 4) -> GridBatch:
    return GridBatch(
        images=torch.randn(images, 3, 32, 32),
        context_indices=torch.tensor([[0, 1, 2, 3, 4, 5]] * images),
        target_indices=torch.tensor([[[10, 11], [14, 15]]] * images),
    )


def _context(model: IJEPA, batch: GridBatch) -> torch.Tensor:
    """The context encoder's output ``[B, Kc, D]`` the step's regularisers read (no stochastic depth)."""
    return model.encoder(batch.images, batch.context_indices)


def _pair(*members, **model):
    """A plain model and the same weights with ``members`` as its regularisers."""
    torch.manual_seed(0)
    plain = IJEPA(**ONE_BLOCK, **model)
    with_terms = IJEPA(**ONE_BLOCK, **model, regularizers=list(members))
    with_terms.load_state_dict(plain.state_dict(), strict=False)  # projectors are the with_terms' own
    return plain, with_terms


def test_varcov_adds_its_weighted_term_on_the_sampled_context_tokens():
    """``VarianceCovariance(weight=v, input=tokens)``: the loss is the plain loss plus ``v *
    varcov`` of ``tokens`` context tokens drawn by the step and the rank alone."""
    plain, model = _pair(VarianceCovariance(weight=0.5, tokens=16))
    batch = _batch()
    context = ContextTokens(_context(model, batch))
    tokens = sample_tokens(context, 16, step=0, rank=0)
    assert tokens.shape == (16, 32)
    assert torch.equal(tokens, sample_tokens(context, 16, step=0, rank=0))
    assert not torch.equal(tokens, sample_tokens(context, 16, step=1, rank=0))
    expected = plain.jepa_loss(batch) + 0.5 * VarianceCovariance().statistic(tokens)
    torch.testing.assert_close(model.jepa_loss(batch), expected)


@pytest.mark.parametrize("kind", ["pooled", "both"])
def test_input_pooled_measures_each_images_mean_context_token_and_both_averages(kind):
    """``input: pooled``: each image's mean context token ``[B, D]`` (C-JEPA's choice); ``both``:
    the mean of the tokens' and the pooled statistic."""
    plain, model = _pair(VarianceCovariance(weight=0.5, input=kind, tokens=16))
    batch = _batch(6)
    context = _context(model, batch)
    pooled = VarianceCovariance().statistic(context.mean(1))
    tokens = VarianceCovariance().statistic(sample_tokens(ContextTokens(context), 16, 0, 0))
    term = pooled if kind == "pooled" else (pooled + tokens) / 2
    torch.testing.assert_close(model.jepa_loss(batch), plain.jepa_loss(batch) + 0.5 * term)


def test_sigreg_mixes_with_the_jepa_loss_and_members_apply_in_list_order():
    """SIGReg's default ``combine: mix`` gives ``(1 - w) * jepa + w * sigreg``; VarianceCovariance's
    ``add`` then adds its term: each member acts on the loss the one before left."""
    sigreg, varcov = SIGReg(weight=0.2, tokens=16, slices=32), VarianceCovariance(weight=0.5, tokens=16)
    plain, model = _pair(sigreg, varcov)
    batch = _batch()
    tokens = sample_tokens(ContextTokens(_context(model, batch)), 16, 0, 0)
    jepa = plain.jepa_loss(batch)
    expected = (1 - 0.2) * jepa + 0.2 * sigreg.statistic(tokens, 0) + 0.5 * varcov.statistic(tokens)
    torch.testing.assert_close(model.jepa_loss(batch), expected)
    added = IJEPA(**ONE_BLOCK, regularizers=[SIGReg(weight=0.2, tokens=16, slices=32, combine="add")])
    added.load_state_dict(plain.state_dict())
    torch.testing.assert_close(added.jepa_loss(batch), jepa + 0.2 * sigreg.statistic(tokens, 0))
    with model.regularisers_off():
        torch.testing.assert_close(model.jepa_loss(batch), jepa)


def test_a_projector_trains_with_the_encoder_and_its_share_splits_the_statistic():
    torch.manual_seed(0)
    model = IJEPA(**ONE_BLOCK, regularizers=[SIGReg(weight=0.5, projector=[64, 16])])
    (member,) = model.regularizers
    assert isinstance(member.projector, Projector) and member.projector[-1].out_features == 16
    model.jepa_loss(_batch()).backward()
    assert member.projector[0].weight.grad.abs().sum() > 0
    assert model.encoder.transformer.blocks[0].attn.qkv.weight.grad.abs().sum() > 0

    x = torch.randn(100, 32) * torch.linspace(0.1, 3.0, 32)  # far from isotropic
    context = ContextTokens(torch.zeros(1, 1, 32), pooled=x)
    shares = {
        share: SIGReg(input="pooled", projector=[64, 32], projector_share=share).build(32) for share in (0, 0.25, 1)
    }
    for member in shares.values():  # one projector for all three
        member.projector.load_state_dict(shares[0].projector.state_dict())
        member.eval()
    raw = float(shares[0].statistic(x, 0))
    behind = float(shares[0].statistic(shares[0].projector(x), 0))
    assert float(shares[0](context, 0)) == pytest.approx(raw)
    assert float(shares[1](context, 0)) == pytest.approx(behind)
    assert float(shares[0.25](context, 0)) == pytest.approx(0.25 * behind + 0.75 * raw)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weight": -0.1}, "SIGReg weight must be in"),
        ({"weight": 1.5}, "SIGReg weight must be in"),  # mix: a share of the loss
        ({"input": "projector"}, "SIGReg input must be one of"),
        ({"tokens": 1}, "SIGReg tokens must be >= 2"),
        ({"projector": [64, 0]}, "SIGReg projector widths must be >= 1"),
        ({"projector_share": 1.5}, "SIGReg projector_share must be in"),
        ({"combine": "multiply"}, "SIGReg combine must be one of"),
        ({"slices": 0}, "SIGReg slices must be >= 1"),
    ],
)
def test_a_bad_regulariser_option_names_its_class_and_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SIGReg(**kwargs)
    VarianceCovariance(weight=1.5)  # add: any weight >= 0


def test_a_zero_weight_switches_a_member_off_and_every_member_is_in_the_hyperparameters():
    model = IJEPA(**ONE_BLOCK, regularizers=[SIGReg(weight=0.0, projector=[8]), VarianceCovariance(weight=0.1)])
    assert [type(m) for m in model.regularizers] == [VarianceCovariance]
    assert not any(key.startswith("regularizers.") and "projector" in key for key in model.state_dict())
    # plain values (weights_only loads), which rebuild the same members
    configs = model.hparams["regularizers"]
    assert [c["class_path"] for c in configs] == ["ijepa.regularizers.SIGReg", "ijepa.regularizers.VarianceCovariance"]
    assert IJEPA(**ONE_BLOCK, regularizers=configs).hparams["regularizers"] == configs


def test_a_new_regulariser_is_one_subclass_with_a_statistic():
    """No edit of the module: a subclass of Regularizer joins the loss and the logs."""

    class MeanNorm(Regularizer):
        log_name = "mean_norm"

        def statistic(self, embeddings, step):
            return embeddings.mean(0).norm()

    plain, model = _pair(MeanNorm(weight=0.3, input="pooled"))
    batch = _batch()
    expected = plain.jepa_loss(batch) + 0.3 * _context(model, batch).mean(1).mean(0).norm()
    torch.testing.assert_close(model.jepa_loss(batch), expected)
    assert model.regularizer_log_names == ["mean_norm"]
    assert MeanNorm not in regularizer_kinds()  # a class defined in a function is nobody's choice
    assert {SIGReg, VarianceCovariance} <= set(regularizer_kinds())


def _legacy_checkpoint(path, model: IJEPA, **legacy) -> None:
    """``model``'s checkpoint as the code before ``model.regularizers`` wrote it: flat options in
    the hyperparameters, the SIGReg projector under ``sigreg_projector.*``."""
    hparams = {key: value for key, value in model.hparams.items() if key != "regularizers"}
    state = {key.replace("regularizers.0.projector.", "sigreg_projector."): v for key, v in model.state_dict().items()}
    torch.save(
        {"state_dict": state, "hyper_parameters": {**hparams, **legacy}, "pytorch-lightning_version": "2.6.6"}, path
    )


def test_checkpoints_from_before_model_regularizers_load_with_the_same_regularisers(tmp_path, monkeypatch):
    torch.manual_seed(0)
    legacy = dict(
        sigreg_weight=0.3, sigreg_input="both", sigreg_tokens=64, sigreg_slices=32,
        sigreg_projector=[24, 12], sigreg_projector_share=0.5, varcov_weight=0.2, varcov_input="pooled",
    )  # fmt: skip
    members = [
        SIGReg(0.3, "both", 64, [24, 12], 0.5, slices=32),
        VarianceCovariance(0.2, "pooled", 64),
    ]
    model = IJEPA(**dict(TINY_MODEL, depth=2), regularizers=members)  # tests/tiny.yaml's architecture
    _legacy_checkpoint(tmp_path / "old.ckpt", model, **legacy)
    loaded = IJEPA.load_from_checkpoint(tmp_path / "old.ckpt")
    assert loaded.hparams["regularizers"] == model.hparams["regularizers"]
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    batch = _batch()
    torch.testing.assert_close(loaded.jepa_loss(batch), model.jepa_loss(batch))
    # and ijepa fit --ckpt_path reads the same members from them (the fit itself is not run)
    monkeypatch.setattr(L.Trainer, "fit", functools.wraps(L.Trainer.fit)(lambda *args, **kwargs: None))
    ckpt = tmp_path / "old.ckpt"
    cli = build_cli(
        ["fit", "--config", str(TINY_CONFIG), f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}"]
    )
    assert cli.model.hparams["regularizers"] == model.hparams["regularizers"]
