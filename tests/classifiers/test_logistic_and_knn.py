"""The classifiers fitted on cached features without SGD, shared by the probes and ``ijepa eval``:
the logistic-regression sweep over C (scikit-learn's objective, proven by its optimality condition
since scikit-learn is not a dependency) and k-NN over several k from one neighbour search."""

import math

import pytest
import torch
import torch.nn.functional as F

from ijepa.classifiers import default_Cs, fit_logistic, knn_scores, knn_sweep, l2_of_C, logreg_fit, logreg_sweep


def _noisy_classes(n=240, dim=6, classes=3, dtype=torch.float64):
    """Overlapping classes (not separable), on features far from zero mean and unit scale."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, dim, generator=generator, dtype=dtype)
    logits = x @ torch.randn(dim, classes, generator=generator, dtype=dtype)
    y = torch.multinomial(logits.softmax(1), 1, generator=generator).squeeze(1)
    scale = torch.logspace(-2, 2, dim, dtype=dtype)
    return x * scale + 10 * torch.arange(dim, dtype=dtype), y


def _objective_gradient(layer, x, y, C):
    """The gradient of mean CE + |W|^2 / (2 C N) on StandardScaler-standardised features, at the
    returned layer's weights unfolded back to the standardised space."""
    mean, std = x.mean(0), x.std(0, correction=0)
    weight = (layer.weight.detach() * std).requires_grad_()
    bias = (layer.bias.detach() + layer.weight.detach() @ mean).requires_grad_()
    loss = F.cross_entropy(F.linear((x - mean) / std, weight, bias), y) + weight.square().sum() / (2 * C * len(x))
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, [weight, bias])])


@pytest.mark.parametrize("C", [1e-2, 1.0, 100.0])
def test_logreg_fit_reaches_the_optimum_of_sklearns_objective(C):
    x, y = _noisy_classes()
    layer = logreg_fit(x, y, num_classes=3, C=C, tol=1e-10)
    zero = torch.nn.Linear(6, 3, dtype=torch.float64)
    torch.nn.init.zeros_(zero.weight), torch.nn.init.zeros_(zero.bias)
    start = _objective_gradient(zero, x, y, C).norm()
    # strictly convex objective: a zero gradient is the unique optimum, the one sklearn finds
    assert _objective_gradient(layer, x, y, C).norm() < 1e-6 * start
    # the default tol is scikit-learn's: every gradient entry of the scaled objective <= 1e-6
    assert _objective_gradient(logreg_fit(x, y, 3, C), x, y, C).abs().max() <= 1e-6


def test_a_tiny_C_predicts_the_uniform_prior_and_a_large_C_separates_separable_data():
    generator = torch.Generator().manual_seed(2)
    centres = 8 * torch.eye(4, 5)
    y = torch.arange(4).repeat(30)  # balanced: the prior is uniform
    x = centres[y] + torch.randn(len(y), 5, generator=generator)
    assert x.sub(centres[:, None]).norm(dim=2).argmin(0).equal(y)  # separable by the nearest centre
    tiny = logreg_fit(x, y, num_classes=4, C=1e-6)
    with torch.no_grad():
        assert (tiny(x).softmax(1) - 0.25).abs().max() < 1e-3
        assert logreg_fit(x, y, num_classes=4, C=1e4)(x).argmax(1).equal(y)


def test_the_returned_layer_applies_the_standardised_fit_to_raw_features():
    x, y = _noisy_classes()
    standardised = (x - x.mean(0)) / x.std(0, correction=0)
    on_raw = logreg_fit(x, y, 3, C=1.0, tol=1e-10)
    on_standardised = logreg_fit(standardised, y, 3, C=1.0, tol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(on_raw(x), on_standardised(standardised), rtol=0, atol=1e-6)
    # fitted in float64, handed back in the features' dtype and usable under inference mode
    with torch.inference_mode():
        layer = logreg_fit(x.float(), y, 3, C=1.0)
        assert layer.weight.dtype == torch.float32 and not layer.weight.is_inference()
        torch.testing.assert_close(layer(x.float()), on_raw(x).float(), rtol=0, atol=1e-4)


def test_logreg_sweep_returns_one_entry_per_C_in_order_each_fitted_from_zero():
    x, y = _noisy_classes()
    Cs = [10.0, 1e-3, 1.0]
    results = logreg_sweep(x[:160], y[:160], x[160:], y[160:], 3, Cs)
    assert [r["C"] for r in results] == Cs
    for r in results:
        alone = logreg_fit(x[:160], y[:160], 3, r["C"])  # no warm start: equal to a fit of C alone
        assert r["classifier"].weight.equal(alone.weight) and r["classifier"].bias.equal(alone.bias)
        with torch.no_grad():
            correct = (alone(x[160:]).argmax(1) == y[160:]).sum().item()
        assert r["val_top1"] == correct / 80
    assert results[1]["val_top1"] != results[0]["val_top1"]  # C matters on this data


def test_default_Cs_is_dinov2s_log_spaced_sweep():
    Cs = default_Cs()
    assert len(Cs) == 45 and Cs[0] == pytest.approx(1e-6) and Cs[-1] == pytest.approx(1e5)
    assert [math.log10(c) for c in Cs] == pytest.approx([-6 + i / 4 for i in range(45)])
    assert default_Cs(1, low=0.5, high=0.5) == [0.5]


def test_a_knn_sweep_scores_each_k_as_a_search_of_that_k_alone():
    generator = torch.Generator().manual_seed(3)
    bank, queries = torch.randn(300, 16, generator=generator), torch.randn(150, 16, generator=generator)
    labels = torch.randint(0, 7, (300,), generator=generator)
    ks = [20, 1, 10, 100, 200, 500]  # 500 > the bank: clamped to 300, as knn_scores does
    scores = knn_sweep(bank, labels, queries, 7, ks, temperature=0.1, chunk_size=64)
    assert list(scores) == ks
    for k in ks:
        assert scores[k].equal(knn_scores(bank, labels, queries, 7, k=k, temperature=0.1, chunk_size=64))
    assert scores[500].equal(knn_scores(bank, labels, queries, 7, k=300, temperature=0.1, chunk_size=64))
    assert knn_sweep(bank, labels, queries, 7, [10, 10])[10].shape == (150, 7)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, y: logreg_sweep(x, y, x, y, 3, []), "Cs must hold at least one value, got []."),
        (lambda x, y: logreg_sweep(x, y, x, y, 3, [1.0, 0.0]), "Cs[1] must be > 0, got 0.0."),
        (lambda x, y: logreg_fit(x, y, 3, C=-1.0), "C must be > 0, got -1.0."),
        (lambda x, y: logreg_fit(x, y, 3, C=float("nan")), "C must be > 0, got nan."),
        (lambda x, y: logreg_fit(x, y, 3, C=1.0, max_iter=0), "max_iter must be >= 1, got 0."),
        (lambda x, y: knn_sweep(x, y, x, 3, []), "ks must hold at least one value, got []."),
        (lambda x, y: knn_sweep(x, y, x, 3, [10, 0]), "ks[1] must be >= 1, got 0."),
        (lambda x, y: knn_sweep(x, y, x, 3, [10], temperature=0.0), "temperature must be > 0, got 0.0."),
        (lambda x, y: default_Cs(0), "count must be >= 1, got 0."),
        (lambda x, y: default_Cs(5, low=1.0, high=0.1), "high must be >= 1.0, got 0.1."),
    ],
)
def test_bad_sweep_settings_name_the_parameter_and_its_range(call, message):
    x, y = _noisy_classes(n=12)
    with pytest.raises(ValueError) as error:
        call(x, y)
    assert str(error.value) == message


def test_knn_scores_by_hand():
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1, 1])
    query = torch.tensor([[2.0, 0.0]])
    scores = knn_scores(bank, labels, query, num_classes=2, k=2, temperature=0.5)
    # nearest two by cosine: [1, 0] (cos 1) for class 0, [1, 1] (cos 1/sqrt 2) for class 1
    expected = torch.tensor([[math.exp(1 / 0.5), math.exp((1 / math.sqrt(2)) / 0.5)]])
    torch.testing.assert_close(scores, expected)
    # k larger than the bank uses the whole bank
    assert knn_scores(bank, labels, query, 2, k=10).shape == (1, 2)


def test_logreg_of_C_is_the_penalised_mean_loss_with_l2_one_over_2CN():
    x, y = _noisy_classes(n=60)
    for C in (0.1, 10.0):
        a, b = logreg_fit(x, y, 3, C), fit_logistic(x, y, 3, l2=1 / (2 * C * 60))
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert l2_of_C(0.5, 4) == 0.25
