"""Multinomial logistic regression fitted in memory by full-batch L-BFGS: DINOv2's ``logreg``
sweep in ``ijepa eval`` and the in-fit :class:`~ijepa.callbacks.LinearProbe`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ijepa.nn.checks import check_range, check_values


def fit_logistic(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    l2: float,
    max_iter: int = 1000,
    tol: float = 1e-6,
) -> torch.nn.Linear:
    """A linear classifier ``[N, D] -> [N, num_classes]`` minimising ``mean CE + l2 * |W|^2`` (bias
    not penalised) on standardised features (mean and population std of ``features``, as
    scikit-learn's ``StandardScaler``; a constant feature is left unscaled).

    Full-batch L-BFGS with a strong-Wolfe line search from zero weights, in float64, stopping when
    the largest gradient entry is at most ``tol`` (scipy's ``gtol``, which scikit-learn's ``lbfgs``
    solver sets to its ``tol``) or after ``max_iter`` iterations. The objective is strictly convex,
    so the result depends on neither a learning rate nor an epoch count. The returned layer folds
    the standardisation in, so it applies to raw features; it has the features' dtype and device.
    """
    check_range(num_classes, "num_classes", 1)
    check_range(l2, "l2", 0)
    check_range(max_iter, "max_iter", 1)
    check_range(tol, "tol", 0)
    # the probes and ijepa eval may call this under inference mode; copies of inference tensors
    # made outside it can be saved for backward.
    with torch.inference_mode(False), torch.enable_grad():
        x = features.to(torch.float64, copy=True)
        y = labels.clone()
        mean, std = x.mean(0), x.std(0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        x = (x - mean) / std
        weight = torch.zeros(num_classes, x.size(1), dtype=x.dtype, device=x.device, requires_grad=True)
        bias = torch.zeros(num_classes, dtype=x.dtype, device=x.device, requires_grad=True)
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
            loss = F.cross_entropy(F.linear(x, weight, bias), y) + l2 * weight.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():  # W (x - m) / s + b = (W / s) x + (b - (W / s) m)
            folded = weight / std
            layer = torch.nn.Linear(x.size(1), num_classes, device=x.device, dtype=features.dtype)
            layer.weight.copy_(folded)
            layer.bias.copy_(bias - folded @ mean)
    return layer


def l2_of_C(C: float, count: int) -> float:
    """scikit-learn's ``C * sum_i CE_i + |W|^2 / 2`` over ``count`` rows, divided by ``C * count``:
    the penalty ``1 / (2 C N)`` on the mean loss that :func:`fit_logistic` takes."""
    check_range(C, "C", 0, low_open=True)
    return 1.0 / (2.0 * C * count)


def logreg_fit(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, C: float, max_iter: int = 1000, tol: float = 1e-6
) -> torch.nn.Linear:
    """Logistic regression with scikit-learn's objective ``C * sum_i CE_i + |W|^2 / 2``, minimised
    in its scaled form by :func:`fit_logistic` (penalty :func:`l2_of_C`)."""
    return fit_logistic(features, labels, num_classes, l2_of_C(C, features.size(0)), max_iter, tol)


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
    check_values(Cs, "Cs", 0, low_open=True)
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
