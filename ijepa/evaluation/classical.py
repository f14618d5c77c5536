"""Classifiers fitted on cached features without SGD: the logistic-regression sweep over C and
k-NN over several k (DINOv2's ``logreg`` and ``knn`` protocols)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ijepa.nn.checks import check_range


def _check_values(values, name: str, low: float, low_open: bool) -> None:
    if len(values) == 0:
        raise ValueError(f"{name} must hold at least one value, got {list(values)}.")
    for i, value in enumerate(values):
        check_range(value, f"{name}[{i}]", low, low_open=low_open)


def logreg_fit(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, C: float, max_iter: int = 1000, tol: float = 1e-6
) -> torch.nn.Linear:
    """Multinomial logistic regression ``[N, D] -> [N, num_classes]`` with scikit-learn's objective,
    ``C * sum_i CE_i + |W|^2 / 2`` (bias not penalised), minimised in its scaled form
    ``mean CE + |W|^2 / (2 C N)`` on standardised features (mean and population std of
    ``features``, as ``StandardScaler``; a constant feature is left unscaled).

    Full-batch L-BFGS with a strong-Wolfe line search from zero weights, in float64, stopping when
    the largest gradient entry of the scaled objective is at most ``tol`` (scipy's ``gtol``, which
    scikit-learn's ``lbfgs`` solver sets to its ``tol``) or after ``max_iter`` iterations. The
    returned layer folds the standardisation in, so it applies to raw features; it has the
    features' dtype and device.
    """
    check_range(num_classes, "num_classes", 1)
    check_range(C, "C", 0, low_open=True)
    check_range(max_iter, "max_iter", 1)
    check_range(tol, "tol", 0)
    # ijepa eval and the probes may call this under inference mode; copies of inference tensors
    # made outside it can be saved for backward.
    with torch.inference_mode(False), torch.enable_grad():
        x = features.to(torch.float64, copy=True)
        y = labels.clone()
        mean, std = x.mean(0), x.std(0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        x = (x - mean) / std
        weight = torch.zeros(num_classes, x.size(1), dtype=x.dtype, device=x.device, requires_grad=True)
        bias = torch.zeros(num_classes, dtype=x.dtype, device=x.device, requires_grad=True)
        penalty = 1.0 / (2.0 * C * x.size(0))
        # history 10 as scipy's L-BFGS-B: the memory is 2 * history copies of the weights, which
        # matters for 1000 classes; tolerance_change at float64's resolution so that the gradient
        # test (or max_iter) is what stops it.
        optimizer = torch.optim.LBFGS(
            [weight, bias],
            lr=1.0,
            max_iter=max_iter,
            tolerance_grad=tol,
            tolerance_change=torch.finfo(torch.float64).eps,
            history_size=10,
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = F.cross_entropy(F.linear(x, weight, bias), y) + penalty * weight.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():  # W (x - m) / s + b = (W / s) x + (b - (W / s) m)
            folded = weight / std
            layer = torch.nn.Linear(x.size(1), num_classes, device=x.device, dtype=features.dtype)
            layer.weight.copy_(folded)
            layer.bias.copy_(bias - folded @ mean)
    return layer


def logreg_sweep(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    num_classes: int,
    Cs: list[float],
    max_iter: int = 1000,
) -> list[dict]:
    """One :func:`logreg_fit` per value of ``Cs``, in order: ``[{"C", "val_top1", "classifier"}]``
    with ``val_top1`` the top-1 accuracy (a fraction) on the validation features. Each fit starts
    from zero weights, not from the previous C's optimum: the objective is strictly convex, so a
    warm start would only save time, and without it each entry equals a fit of that C alone."""
    _check_values(Cs, "Cs", 0, low_open=True)
    results = []
    for C in Cs:
        classifier = logreg_fit(train_x, train_y, num_classes, C, max_iter)
        with torch.no_grad():
            predictions = classifier(val_x.to(classifier.weight.dtype)).argmax(1)
        top1 = (predictions == val_y).double().mean().item()
        results.append({"C": C, "val_top1": top1, "classifier": classifier})
    return results


def default_Cs(count: int = 45, low: float = 1e-6, high: float = 1e5) -> list[float]:
    """``count`` values of C log-spaced from ``low`` to ``high``, both included; the default is
    DINOv2's sweep (``np.logspace(-6, 5, 45)``: four values a decade)."""
    check_range(count, "count", 1)
    check_range(low, "low", 0, low_open=True)
    check_range(high, "high", low)
    steps = torch.logspace(math.log10(low), math.log10(high), count, dtype=torch.float64)
    return steps.tolist()


def knn_sweep(
    bank_x: torch.Tensor,
    bank_y: torch.Tensor,
    query_x: torch.Tensor,
    num_classes: int,
    ks: list[int],
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> dict[int, torch.Tensor]:
    """Class scores ``[Q, num_classes]`` of ``query_x [Q, D]`` for each k of ``ks``, keyed by k,
    from one top-``max(ks)`` cosine search of the whole bank ``bank_x [N, D]`` (labels ``[N]``) per
    chunk of ``chunk_size`` queries; each of a query's ``k`` nearest rows votes
    ``exp(similarity / temperature)`` for its class.

    Each k's scores equal :func:`ijepa.callbacks.knn.knn_scores` with that k and ``chunk_size``
    (the neighbours come sorted by similarity, so the first k of the top-``max(ks)`` are the top k;
    where the k-th and (k+1)-th similarities tie exactly, either may vote, in both). A k larger
    than the bank is clamped to the bank size without an error, as ``knn_scores`` does; the entry
    keeps the requested k as its key.
    """
    _check_values(ks, "ks", 1, low_open=False)
    check_range(temperature, "temperature", 0, low_open=True)
    check_range(chunk_size, "chunk_size", 1)
    # the same operations as knn_scores, in the same order, so the scores match it bit for bit
    bank = F.normalize(bank_x.float(), dim=1)
    queries = F.normalize(query_x.float(), dim=1)
    widest = min(max(ks), bank.size(0))
    scores = {k: [] for k in ks}  # a repeated k is scored once
    for chunk in queries.split(chunk_size):
        similarity, neighbours = (chunk @ bank.T).topk(widest, dim=1)
        weights, classes = (similarity / temperature).exp(), bank_y[neighbours]
        for k in scores:
            kept = min(k, widest)
            votes = torch.zeros(chunk.size(0), num_classes, device=chunk.device)
            votes.scatter_add_(1, classes[:, :kept], weights[:, :kept])
            scores[k].append(votes)
    return {k: torch.cat(parts) for k, parts in scores.items()}
