"""SIGReg and VICReg's variance-covariance terms: statistics, gradients, and global-batch values under DDP."""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ijepa.module import IJEPA
from ijepa.regularizers import Projector, SIGReg, VarianceCovariance, epps_pulley_terms, random_directions

# a one-block model whose step runs in milliseconds, for the regularisers inside IJEPA
TINY_MODEL = dict(
    image_size=32,
    patch_size=8,
    embed_dim=32,
    depth=1,
    num_heads=2,
    predictor_embed_dim=16,
    predictor_depth=1,
    predictor_num_heads=2,
)


def test_sigreg_is_near_its_gaussian_expectation_for_gaussian_samples_at_any_batch_size():
    # E[N |phi_N(t) - phi(t)|^2] = 1 - exp(-t^2), integrated against exp(-t^2/2) over [-3, 3]
    t = torch.linspace(-3, 3, 20001)
    expected = float(torch.trapezoid((1 - torch.exp(-(t**2))) * torch.exp(-(t**2) / 2), t))
    sigreg = SIGReg(num_slices=512)
    for n in (256, 4096):
        values = [float(sigreg(torch.randn(n, 64), seed=s)) for s in range(4)]
        assert sum(values) / len(values) == pytest.approx(expected, rel=0.15)


def test_sigreg_is_large_for_collapsed_low_rank_and_shrunk_samples():
    sigreg = SIGReg()
    gaussian = float(sigreg(torch.randn(1024, 64)))
    collapsed = float(sigreg(torch.ones(1024, 64) * 0.3))
    low_rank = float(sigreg(torch.randn(1024, 2) @ torch.randn(2, 64) / math.sqrt(2)))
    shrunk = float(sigreg(0.1 * torch.randn(1024, 64)))
    for value in (collapsed, low_rank, shrunk):
        assert value > 20 * gaussian


def test_sigreg_grows_with_the_sample_count_when_not_gaussian():
    sigreg = SIGReg()
    low_rank = torch.randn(4096, 1) @ torch.randn(1, 32)
    assert float(sigreg(low_rank)) > 3 * float(sigreg(low_rank[:1024]))


def test_gradient_steps_push_a_collapsed_batch_apart():
    torch.manual_seed(0)
    x = (torch.randn(512, 1) @ torch.randn(1, 32) * 0.1 + 0.01 * torch.randn(512, 32)).requires_grad_(True)
    sigreg = SIGReg(num_slices=128)
    optimizer = torch.optim.Adam([x], lr=0.05)
    start_value = float(sigreg(x.detach(), seed=0))
    start = torch.linalg.svdvals(x.detach())
    assert start[-1] / start[0] < 0.05  # nearly rank 1
    for step in range(200):
        optimizer.zero_grad()
        sigreg(x, seed=step).backward()
        optimizer.step()
    assert float(sigreg(x, seed=999)) < start_value / 20
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


@pytest.mark.parametrize("kwargs", [{"num_slices": 0}, {"num_points": 1}, {"t_max": 0.0}])
def test_bad_settings_name_the_parameter(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SIGReg(**kwargs)


def test_bad_input_shape_is_an_error():
    with pytest.raises(ValueError, match="embeddings"):
        SIGReg()(torch.randn(4, 5, 6))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_worker(rank: int, world: int, port: int, x: torch.Tensor, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = x.chunk(world)[rank].clone().requires_grad_(True)
    value = SIGReg(num_slices=64)(share, seed=7)
    # DDP averages parameter gradients over ranks: do the same for the (per-sample) input gradient
    (value / world).backward()
    out[rank] = (value.detach(), share.grad.clone())
    dist.destroy_process_group()


def test_two_ranks_compute_the_global_batch_statistic_and_its_gradient():
    x = torch.randn(96, 16) @ torch.randn(16, 16) * 0.5
    whole = x.clone().requires_grad_(True)
    value = SIGReg(num_slices=64)(whole, seed=7)
    value.backward()
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_rank_worker, args=(2, _free_port(), x, out), nprocs=2, join=True)
    for rank in range(2):
        rank_value, rank_grad = out[rank]
        assert torch.allclose(rank_value, value.detach(), rtol=1e-5)  # every rank: the global statistic
        # a sample's gradient on its rank equals its gradient in the one-process run
        assert torch.allclose(rank_grad, whole.grad.chunk(2)[rank], rtol=1e-4, atol=1e-7)


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


def test_sigreg_behind_the_projector_trains_the_projector_and_the_encoder():
    torch.manual_seed(0)
    tiny = dict(TINY_MODEL, sigreg_weight=0.5)
    model = IJEPA(**tiny, sigreg_projector=[64, 16])
    assert isinstance(model.sigreg_projector, Projector) and model.sigreg_projector[-1].out_features == 16
    assert IJEPA(**tiny).sigreg_projector is None
    assert IJEPA(**{**tiny, "sigreg_weight": 0.0}, sigreg_projector=[64, 16]).sigreg_projector is None
    images = torch.randn(4, 3, 32, 32)
    context = torch.tensor([[0, 1, 2, 3, 4, 5]] * 4)
    targets = torch.tensor([[[10, 11], [14, 15]]] * 4)
    loss = model.jepa_loss({"images": images, "context_indices": context, "target_indices": targets})
    loss.backward()
    assert model.sigreg_projector[0].weight.grad.abs().sum() > 0
    assert model.encoder.transformer.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert "sigreg_projector" in IJEPA.ARCHITECTURE  # its weights are in the checkpoint: resume must match them


def test_projector_share_splits_the_statistic_between_projector_output_and_tokens():
    tiny = dict(TINY_MODEL, sigreg_weight=0.5, sigreg_projector=[64, 32])
    x = torch.randn(100, 32) * torch.linspace(0.1, 3.0, 32)  # far from isotropic
    torch.manual_seed(0)
    models = {share: IJEPA(**tiny, sigreg_projector_share=share).eval() for share in (0.0, 0.25, 1.0)}
    for model in models.values():  # one projector for all three
        model.sigreg_projector.load_state_dict(models[0.0].sigreg_projector.state_dict())
    raw = float(models[0.0].sigreg(x, seed=0))
    behind = float(models[0.0].sigreg(models[0.0].sigreg_projector(x), seed=0))
    assert float(models[0.0].sigreg_statistic([x])) == pytest.approx(raw)
    assert float(models[1.0].sigreg_statistic([x])) == pytest.approx(behind)
    assert float(models[0.25].sigreg_statistic([x])) == pytest.approx(0.25 * behind + 0.75 * raw)
    with pytest.raises(ValueError, match="sigreg_projector_share must be in"):
        IJEPA(**tiny, sigreg_projector_share=1.5)


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
    assert torch.allclose(VarianceCovariance(25.0, 1.0)(y), 25 * expected_hinge + expected_cov, rtol=1e-4)


def test_varcov_is_large_for_collapsed_and_correlated_samples_and_its_gradient_spreads_them():
    varcov = VarianceCovariance()
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
        VarianceCovariance()(torch.randn(4, 5, 6))


def _varcov_rank_worker(rank: int, world: int, port: int, x: torch.Tensor, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = x.chunk(world)[rank].clone().requires_grad_(True)
    value = VarianceCovariance()(share)
    (value / world).backward()  # as DDP averages gradients over ranks
    out[rank] = (value.detach(), share.grad.clone())
    dist.destroy_process_group()


def test_varcov_on_two_ranks_is_the_global_batch_value_and_gradient():
    x = torch.randn(96, 16) @ torch.randn(16, 16) * 0.5 + 0.3
    whole = x.clone().requires_grad_(True)
    value = VarianceCovariance()(whole)
    value.backward()
    out = mp.Manager().dict()
    mp.spawn(_varcov_rank_worker, args=(2, _free_port(), x, out), nprocs=2, join=True)
    for rank in range(2):
        rank_value, rank_grad = out[rank]
        assert torch.allclose(rank_value, value.detach(), rtol=1e-5)
        assert torch.allclose(rank_grad, whole.grad.chunk(2)[rank], rtol=1e-4, atol=1e-6)


def test_varcov_weight_adds_its_weighted_term_on_the_sampled_context_tokens():
    """``model.varcov_weight: v`` -> the loss is the plain loss plus ``v * varcov`` of the same
    sampled context tokens SIGReg would see; 0 builds no term; a negative weight is an error."""
    tiny = dict(TINY_MODEL, sigreg_tokens=16)
    torch.manual_seed(0)
    plain = IJEPA(**tiny)
    with_term = IJEPA(**tiny, varcov_weight=0.5)
    with_term.load_state_dict(plain.state_dict())
    assert plain.varcov is None and isinstance(with_term.varcov, VarianceCovariance)
    batch = {
        "images": torch.randn(4, 3, 32, 32),
        "context_indices": torch.tensor([[0, 1, 2, 3, 4, 5]] * 4),
        "target_indices": torch.tensor([[[10, 11], [14, 15]]] * 4),
    }
    base = plain.jepa_loss(batch)
    context = with_term.predict_targets(batch)["context"]
    tokens = with_term.sigreg_inputs(context, None, "tokens")
    assert tokens.shape == (16, 32)
    expected = base + 0.5 * VarianceCovariance()(tokens)
    torch.testing.assert_close(with_term.jepa_loss(batch), expected)
    with pytest.raises(ValueError, match="varcov_weight must be >= 0"):
        IJEPA(**tiny, varcov_weight=-0.1)


@pytest.mark.parametrize("varcov_input", ["pooled", "both"])
def test_varcov_input_pooled_measures_each_images_mean_context_token_and_both_averages(varcov_input):
    """``model.varcov_input: pooled`` -> the term is measured on each image's mean context token
    ``[B, D]`` (C-JEPA's choice); ``both`` -> the mean of the tokens' and the pooled term; any other
    value is an error naming the parameter."""
    tiny = dict(TINY_MODEL, sigreg_tokens=16)
    torch.manual_seed(0)
    plain = IJEPA(**tiny)
    with_term = IJEPA(**tiny, varcov_weight=0.5, varcov_input=varcov_input)
    with_term.load_state_dict(plain.state_dict())
    batch = {
        "images": torch.randn(6, 3, 32, 32),
        "context_indices": torch.tensor([[0, 1, 2, 3, 4, 5]] * 6),
        "target_indices": torch.tensor([[[10, 11], [14, 15]]] * 6),
    }
    base = plain.jepa_loss(batch)
    context = with_term.predict_targets(batch)["context"]  # [B, Kc, D]
    pooled = VarianceCovariance()(context.mean(1))
    tokens = VarianceCovariance()(with_term.sigreg_inputs(context, None, "tokens"))
    term = pooled if varcov_input == "pooled" else (pooled + tokens) / 2
    torch.testing.assert_close(with_term.jepa_loss(batch), base + 0.5 * term)
    with pytest.raises(ValueError, match="varcov_input must be one of"):
        IJEPA(**tiny, varcov_weight=0.5, varcov_input="projector")
