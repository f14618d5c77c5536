"""Collapse regularisers as plain modules (no Lightning inside).

:class:`SIGReg` is LeJEPA's Sketched Isotropic Gaussian Regulariser (Balestriero & LeCun 2025):
it pushes the distribution of embeddings towards an isotropic standard Gaussian by testing many
random 1-D projections of them against the standard normal with the Epps-Pulley statistic. A
collapsed or low-rank set of embeddings puts most projections near a point mass, far from
N(0, 1), so the statistic is large; the gradient spreads the embeddings over every direction.

:class:`VarianceCovariance` is VICReg's variance and covariance terms (Bardes, Ponce & LeCun
2022), which C-JEPA (Mo & Tong 2024) adds to I-JEPA: a hinge that keeps every dimension's
standard deviation at 1 or more, and the squared off-diagonal covariances. Unlike SIGReg it
constrains only the first two moments.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce


def random_directions(dim: int, num_slices: int, seed: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """``num_slices`` random unit directions in ``R^dim`` as the columns of ``[dim, num_slices]``.

    Drawn on the CPU from ``seed`` alone, so every DDP rank and every device gets the same ones."""
    generator = torch.Generator().manual_seed(int(seed))
    directions = torch.randn(dim, num_slices, generator=generator)
    directions = directions / directions.norm(dim=0, keepdim=True)
    return directions.to(device=device, dtype=dtype)


class _CharacteristicSums(torch.autograd.Function):
    """``sum_n cos(k h x_n)`` and ``sum_n sin(k h x_n)`` for ``k = 0 .. K - 1``, by rotation.

    Autograd of ``cos(t x)`` on the ``[N, S, K]`` grid of angles costs four transcendental
    functions per element and several temporaries of that size. Equally spaced points allow the
    angle-addition recurrence ``e^{i (k + 1) h x} = e^{i k h x} e^{i h x}``: one cosine and one sine
    of ``h x``, then a few multiply-adds on ``[N, S]`` per point, forward and (recomputed) backward,
    using ``d/dx cos(t x) = -t sin(t x)`` and ``d/dx sin(t x) = t cos(t x)``. In float32 the
    rotation drifts by about ``K`` ulps, far below the statistic's sampling noise."""

    @staticmethod
    def forward(ctx, projections: torch.Tensor, step: float, num_points: int):
        unit_cos, unit_sin = (step * projections).cos(), (step * projections).sin()
        cos, sin = torch.ones_like(projections), torch.zeros_like(projections)
        cos_sums, sin_sums = [], []
        for _ in range(num_points):
            cos_sums.append(cos.sum(0))
            sin_sums.append(sin.sum(0))
            cos, sin = cos * unit_cos - sin * unit_sin, sin * unit_cos + cos * unit_sin
        ctx.save_for_backward(unit_cos, unit_sin)
        ctx.step = step
        return torch.stack(cos_sums, -1), torch.stack(sin_sums, -1)

    @staticmethod
    def backward(ctx, grad_cos: torch.Tensor, grad_sin: torch.Tensor):
        unit_cos, unit_sin = ctx.saved_tensors
        cos, sin = torch.ones_like(unit_cos), torch.zeros_like(unit_cos)
        grad = torch.zeros_like(unit_cos)
        for k in range(grad_cos.size(-1)):
            t = k * ctx.step
            grad += cos * (t * grad_sin[:, k]) - sin * (t * grad_cos[:, k])
            cos, sin = cos * unit_cos - sin * unit_sin, sin * unit_cos + cos * unit_sin
        return grad, None, None


def epps_pulley_terms(projections: torch.Tensor, step: float, num_points: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over samples of ``cos(t x)`` and ``sin(t x)`` for ``projections [N, S]`` at the
    equally spaced points ``t = 0, step, ..., (num_points - 1) * step``: each ``[S, num_points]``.
    Divided by the sample count they are the real and imaginary parts of the empirical
    characteristic function; as sums they all-reduce over ranks exactly. Differentiable in
    ``projections``; computed in float32."""
    if num_points < 1 or not step > 0:
        raise ValueError(f"need num_points >= 1 and step > 0, got num_points={num_points}, step={step}.")
    return _CharacteristicSums.apply(projections.float(), float(step), int(num_points))


class SIGReg(nn.Module):
    """Sketched Isotropic Gaussian Regulariser: ``[N, D]`` embeddings -> a scalar statistic.

    For each of ``num_slices`` random unit directions ``a`` the projections ``a^T x`` are compared
    with N(0, 1) by the Epps-Pulley statistic

        ``EP = N * integral |phi_N(t) - exp(-t^2 / 2)|^2 w(t) dt``,

    with ``phi_N`` the empirical characteristic function of the ``N`` projections and the
    Gaussian window ``w(t) = exp(-t^2 / 2)``, integrated by the trapezoid rule over
    ``num_points`` points on ``[0, t_max]`` (the integrand is even in ``t``). The result is the
    mean over directions. For standard Gaussian samples its expectation is
    ``integral (1 - exp(-t^2)) exp(-t^2 / 2) dt``, about 1.05 whatever ``N``; for samples that are
    not Gaussian, such as a collapsed or low-rank set, it grows like ``N``.

    Under ``torch.distributed`` the characteristic-function sums and the sample count are
    all-reduced (differentiably), so every rank computes the statistic of the global batch and
    the gradients equal a one-process run's. Directions come from ``seed`` (pass the global
    step), identical on every rank and redrawn every step.

    Args:
        num_slices: random 1-D projections per call (LeJEPA: 256 to 1024).
        num_points: integration points on ``[0, t_max]``.
        t_max: upper end of the integration range.
    """

    def __init__(self, num_slices: int = 256, num_points: int = 17, t_max: float = 3.0):
        super().__init__()
        if num_slices < 1:
            raise ValueError(f"num_slices must be >= 1, got {num_slices}.")
        if num_points < 2:
            raise ValueError(f"num_points must be >= 2, got {num_points}.")
        if not t_max > 0:
            raise ValueError(f"t_max must be > 0, got {t_max}.")
        self.num_slices = num_slices
        self.step = t_max / (num_points - 1)
        t = torch.linspace(0.0, t_max, num_points)
        gaussian = torch.exp(-0.5 * t**2)  # N(0, 1)'s characteristic function, also the window
        step = t[1] - t[0]
        trapezoid = torch.full_like(t, float(step))
        trapezoid[0] = trapezoid[-1] = step / 2
        # Twice the half-line integral: the whole real line, the integrand being even in t.
        self.register_buffer("t", t, persistent=False)
        self.register_buffer("target", gaussian, persistent=False)
        self.register_buffer("weights", 2 * trapezoid * gaussian, persistent=False)

    def forward(self, embeddings: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """``embeddings [N, D]`` (this rank's share of the batch) -> the statistic of the global batch."""
        if embeddings.dim() != 2 or embeddings.size(0) < 1:
            raise ValueError(f"embeddings must have shape [N, D] with N >= 1, got {tuple(embeddings.shape)}.")
        directions = random_directions(embeddings.size(1), self.num_slices, seed, embeddings.device)
        cos_sum, sin_sum = epps_pulley_terms(embeddings.float() @ directions, self.step, self.t.numel())
        count = torch.tensor(float(embeddings.size(0)), device=embeddings.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            cos_sum = differentiable_all_reduce(cos_sum)
            sin_sum = differentiable_all_reduce(sin_sum)
            count = count.clone()
            dist.all_reduce(count)
        error = (cos_sum / count - self.target) ** 2 + (sin_sum / count) ** 2  # [S, T]
        return count * (error * self.weights).sum(-1).mean()

    def extra_repr(self) -> str:
        return f"num_slices={self.num_slices}, num_points={self.t.numel()}, t_max={float(self.t[-1]):g}"


class VarianceCovariance(nn.Module):
    """VICReg's variance and covariance terms of ``[N, D]`` embeddings over the global batch.

    ``variance_weight * mean_d relu(target_std - sqrt(var_d + eps)) + covariance_weight *
    sum_{i != j} cov_ij^2 / D``, with VICReg's defaults (25 and 1; its invariance weight of 25
    is the JEPA loss's place here). Under DDP the mean and the second moments are all-reduced
    (differentiably), so every rank computes the global batch's value, as VICReg's own code does
    by gathering the embeddings.

    Args:
        variance_weight: weight of the variance hinge (>= 0).
        covariance_weight: weight of the covariance term (>= 0).
        target_std: the standard deviation below which the hinge pushes (> 0).
        eps: added to each variance under the square root (> 0).
    """

    def __init__(
        self, variance_weight: float = 25.0, covariance_weight: float = 1.0, target_std: float = 1.0, eps: float = 1e-4
    ):
        super().__init__()
        if variance_weight < 0 or covariance_weight < 0:
            raise ValueError(
                f"variance_weight and covariance_weight must be >= 0, got {variance_weight} and {covariance_weight}."
            )
        if target_std <= 0:
            raise ValueError(f"target_std must be > 0, got {target_std}.")
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}.")
        self.variance_weight, self.covariance_weight = variance_weight, covariance_weight
        self.target_std, self.eps = target_std, eps

    def terms(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The unweighted variance hinge and covariance term of ``embeddings [N, D]``."""
        if embeddings.dim() != 2 or embeddings.size(0) < 1:
            raise ValueError(f"embeddings must have shape [N, D] with N >= 1, got {tuple(embeddings.shape)}.")
        x = embeddings.float()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # the global count stays a tensor: checking it in Python would sync the device each step
            count = torch.tensor(float(x.size(0)), device=x.device)
            dist.all_reduce(count)
            mean = differentiable_all_reduce(x.sum(0)) / count
            centred = x - mean
            second = differentiable_all_reduce(centred.T @ centred)
        else:
            if x.size(0) < 2:
                raise ValueError(f"VarianceCovariance needs at least 2 embeddings, got {x.size(0)}.")
            count = x.size(0)
            centred = x - x.mean(0)
            second = centred.T @ centred
        covariance = second / (count - 1)  # [D, D]
        variance = covariance.diagonal()
        hinge = torch.relu(self.target_std - torch.sqrt(variance + self.eps)).mean()
        off_diagonal = covariance - torch.diag(variance)
        return hinge, off_diagonal.pow(2).sum() / x.size(1)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``embeddings [N, D]`` (this rank's share of the batch) -> the weighted sum of both terms."""
        hinge, covariance = self.terms(embeddings)
        return self.variance_weight * hinge + self.covariance_weight * covariance

    def extra_repr(self) -> str:
        return (
            f"variance_weight={self.variance_weight:g}, covariance_weight={self.covariance_weight:g}, "
            f"target_std={self.target_std:g}"
        )


class Projector(nn.Sequential):
    """The MLP between the encoder and a regulariser: ``[N, D] -> [N, widths[-1]]``, each hidden
    layer ``Linear -> BatchNorm1d -> GELU`` and the last a plain ``Linear`` (LeJEPA's and
    VICReg's projector shape).

    A regulariser that makes its input isotropic makes every direction of it equally large, the
    nuisance ones included. Behind a projector only the projector's output has to be isotropic,
    and the encoder's features stay free to weigh directions unequally.

    Args:
        in_features: ``D``, the encoder width.
        widths: output widths of the layers, e.g. ``(512, 128)``; at least one.
    """

    def __init__(self, in_features: int, widths: tuple[int, ...] | list[int]):
        widths = list(widths)
        if not widths or any(int(w) < 1 for w in widths):
            raise ValueError(f"projector widths must be one or more positive ints, got {widths}.")
        layers: list[nn.Module] = []
        for width in widths[:-1]:
            layers += [nn.Linear(in_features, width), nn.BatchNorm1d(width), nn.GELU()]
            in_features = width
        layers.append(nn.Linear(in_features, widths[-1]))
        super().__init__(*layers)
