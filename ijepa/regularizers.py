"""Regularisers of the context encoder's output: one class each, chosen in YAML by ``class_path``.

``model.regularizers`` is a list of :class:`Regularizer` members. Each reads the context
encoder's output of a step (:class:`ContextTokens`), measures its statistic on the ``input`` it
names (a sample of ``tokens``, each image's ``pooled`` mean token, or ``both``), optionally behind
its own :class:`Projector`, and says how its ``weight``-ed term joins the JEPA loss
(``combine``: ``add`` or ``mix``). A new regulariser is one subclass with a ``statistic``; the
module needs no edit.

* :class:`SIGReg` is LeJEPA's Sketched Isotropic Gaussian Regulariser (Balestriero & LeCun 2025):
  it pushes the distribution of embeddings towards an isotropic standard Gaussian by testing
  many random 1-D projections of them against the standard normal with the Epps-Pulley
  statistic. A collapsed or low-rank set of embeddings puts most projections near a point mass,
  far from N(0, 1), so the statistic is large; the gradient spreads the embeddings over every
  direction.
* :class:`VarianceCovariance` is VICReg's variance and covariance terms (Bardes, Ponce & LeCun
  2022), which C-JEPA (Mo & Tong 2024) adds to I-JEPA: a hinge that keeps every dimension's
  standard deviation at 1 or more, and the squared off-diagonal covariances. Unlike SIGReg it
  constrains only the first two moments.
"""

from __future__ import annotations

import abc
import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce

from ijepa.nn.checks import check_range
from ijepa.registry import class_path, concrete_subclasses, from_config

INPUTS = ("tokens", "pooled", "both")
COMBINES = ("add", "mix")


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


@dataclass
class ContextTokens:
    """What the regularisers read of one step: the context encoder's output ``tokens [B, Kc, D]``
    (packed batches: ``[S, L, D]``), ``mask`` (True for real tokens; None when every token is
    real) and, when the step computed it, ``pooled [B, D]``, each image's mean real token.

    Every member of one step gets the same tensors for the same draw (:func:`sample_tokens`,
    :func:`pooled_tokens` remember them), so members that read one input share its gradient
    path, as one term on that input would."""

    tokens: torch.Tensor
    mask: torch.Tensor | None = None
    pooled: torch.Tensor | None = None
    drawn: dict = field(default_factory=dict, repr=False)


def sample_tokens(context: ContextTokens, count: int, step: int, rank: int) -> torch.Tensor:
    """``[n, D]``: ``min(count, real tokens)`` real tokens drawn at random. The draw is seeded by
    the global step and the rank alone, so a resumed run draws the same ones, and two draws of
    different counts at one step share their first tokens."""
    key = ("tokens", count, step, rank)
    if key not in context.drawn:
        tokens = context.tokens
        tokens = tokens.flatten(0, 1) if context.mask is None else tokens[context.mask]
        generator = torch.Generator().manual_seed(step * 65_537 + rank)
        chosen = torch.randperm(tokens.size(0), generator=generator)[: min(count, tokens.size(0))]
        context.drawn[key] = tokens[chosen.to(tokens.device)]
    return context.drawn[key]


def pooled_tokens(context: ContextTokens) -> torch.Tensor:
    """Each image's mean real context token ``[B, D]``."""
    if context.pooled is None:
        if context.mask is None:
            context.pooled = context.tokens.mean(1)
        else:
            weights = context.mask.to(context.tokens.dtype)[..., None]
            context.pooled = (context.tokens * weights).sum(1) / weights.sum(1)
    return context.pooled


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


class Regularizer(nn.Module, metaclass=abc.ABCMeta):
    """A term of the training loss measured on the context encoder's output.

    Subclasses implement :meth:`statistic` (``[N, D]`` -> a scalar) and set ``log_name`` (the
    step logs ``train/<log_name>``) and ``default_combine``; the base class chooses the inputs,
    applies the projector and combines the term with the loss.

    Args:
        weight: the term's weight ``w``; 0 switches the regulariser off (the module skips it).
        input: what the statistic sees: ``tokens`` (a random sample of ``tokens`` real context
            tokens of the batch), ``pooled`` (each image's mean context token) or ``both`` (the
            mean of the two statistics).
        tokens: context tokens per step that ``input: tokens`` samples.
        projector: widths of an MLP (:class:`Projector`) between the context tokens and the
            statistic, e.g. ``[512, 128]``; null measures the encoder's output itself.
        projector_share: with a projector, the share of the term measured on its output; the
            rest is measured on the inputs themselves (1: all behind the projector).
        combine: ``add`` (``loss + w * term``) or ``mix`` (``(1 - w) * loss + w * term``, ``w``
            in [0, 1]); null takes the member's default.
    """

    log_name = "regularizer"
    default_combine = "add"

    def __init__(
        self,
        weight: float,
        input: str = "tokens",
        tokens: int = 1024,
        projector: list[int] | None = None,
        projector_share: float = 1.0,
        combine: str | None = None,
    ):
        super().__init__()
        combine = self.default_combine if combine is None else combine
        name = type(self).__name__
        if combine not in COMBINES:
            raise ValueError(f"{name} combine must be one of {COMBINES}, got {combine!r}.")
        check_range(weight, f"{name} weight", 0, 1 if combine == "mix" else None)
        if input not in INPUTS:
            raise ValueError(f"{name} input must be one of {INPUTS}, got {input!r}.")
        check_range(tokens, f"{name} tokens", 2)
        check_range(projector_share, f"{name} projector_share", 0, 1)
        for width in projector or ():
            check_range(width, f"{name} projector widths", 1)
        self.weight, self.input, self.num_tokens, self.combine = weight, input, int(tokens), combine
        self.projector_widths = list(projector) if projector else None
        self.projector_share = projector_share
        self.projector: Projector | None = None
        self.options = dict(
            weight=weight,
            input=input,
            tokens=tokens,
            projector=self.projector_widths,
            projector_share=projector_share,
            combine=combine,
        )

    def build(self, embed_dim: int) -> Regularizer:
        """Create the projector for an encoder of width ``embed_dim`` (the module calls it once)."""
        if self.projector_widths and self.projector is None:
            self.projector = Projector(embed_dim, self.projector_widths)
        return self

    def config(self) -> dict:
        """``{"class_path", "init_args"}``: plain values that rebuild this member, stored in
        checkpoints instead of the object (:func:`regularizer_from_config`)."""
        return {"class_path": class_path(self), "init_args": copy.deepcopy(self.options)}

    @abc.abstractmethod
    def statistic(self, embeddings: torch.Tensor, step: int) -> torch.Tensor:
        """``embeddings [N, D]`` (this rank's share) -> the statistic of the global batch."""

    def inputs(self, context: ContextTokens, step: int, rank: int) -> list[torch.Tensor]:
        """The ``[n, D]`` tensors :attr:`input` names, in the order tokens, pooled."""
        kinds = ("tokens", "pooled") if self.input == "both" else (self.input,)
        return [
            sample_tokens(context, self.num_tokens, step, rank) if kind == "tokens" else pooled_tokens(context)
            for kind in kinds
        ]

    def forward(self, context: ContextTokens, step: int, rank: int = 0) -> torch.Tensor:
        """The unweighted term: the statistic of each input, averaged; with a projector,
        ``projector_share`` of it measured behind the projector and the rest on the input."""
        inputs = self.inputs(context, step, rank)
        share = self.projector_share if self.projector is not None else 0.0
        total = 0.0
        for x in inputs:
            if share > 0:
                total = total + share * self.statistic(self.projector(x), step)
            if share < 1:
                total = total + (1 - share) * self.statistic(x, step)
        return total / len(inputs)

    def combine_with(self, loss: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        """The loss with this term joined: ``loss + w * term`` or ``(1 - w) * loss + w * term``."""
        if self.combine == "mix":
            return (1 - self.weight) * loss + self.weight * term
        return loss + self.weight * term

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.options.items())


class SIGReg(Regularizer):
    """LeJEPA's Sketched Isotropic Gaussian Regulariser; its default ``combine`` is ``mix``:
    ``(1 - w) * jepa + w * sigreg``.

    :meth:`statistic`: for each of ``slices`` random unit directions ``a`` the projections
    ``a^T x`` are compared with N(0, 1) by the Epps-Pulley statistic

        ``EP = N * integral |phi_N(t) - exp(-t^2 / 2)|^2 w(t) dt``,

    with ``phi_N`` the empirical characteristic function of the ``N`` projections and the
    Gaussian window ``w(t) = exp(-t^2 / 2)``, integrated by the trapezoid rule over
    ``num_points`` points on ``[0, t_max]`` (the integrand is even in ``t``). The result is the
    mean over directions. For standard Gaussian samples its expectation is
    ``integral (1 - exp(-t^2)) exp(-t^2 / 2) dt``, about 1.05 whatever ``N``; for samples that are
    not Gaussian, such as a collapsed or low-rank set, it grows like ``N``.

    Under ``torch.distributed`` the characteristic-function sums and the sample count are
    all-reduced (differentiably), so every rank computes the statistic of the global batch and
    the gradients equal a one-process run's. Directions come from the global step, identical on
    every rank and redrawn every step.

    Args:
        weight: the term's weight ``w`` (in [0, 1] with ``combine: mix``); 0 switches it off.
        slices: random 1-D projections per step (LeJEPA: 256 to 1024).
        num_points: integration points on ``[0, t_max]``.
        t_max: upper end of the integration range.
    """

    log_name = "sigreg"
    default_combine = "mix"

    def __init__(
        self,
        weight: float = 0.05,
        input: str = "tokens",
        tokens: int = 1024,
        projector: list[int] | None = None,
        projector_share: float = 1.0,
        combine: str | None = None,
        slices: int = 256,
        num_points: int = 17,
        t_max: float = 3.0,
    ):
        super().__init__(weight, input, tokens, projector, projector_share, combine)
        check_range(slices, "SIGReg slices", 1)
        check_range(num_points, "SIGReg num_points", 2)
        check_range(t_max, "SIGReg t_max", 0, low_open=True)
        self.options.update(slices=slices, num_points=num_points, t_max=t_max)
        self.num_slices = int(slices)
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

    def statistic(self, embeddings: torch.Tensor, step: int = 0) -> torch.Tensor:
        """``embeddings [N, D]`` (this rank's share of the batch) -> the statistic of the global
        batch, with the directions of ``step``."""
        if embeddings.dim() != 2 or embeddings.size(0) < 1:
            raise ValueError(f"embeddings must have shape [N, D] with N >= 1, got {tuple(embeddings.shape)}.")
        directions = random_directions(embeddings.size(1), self.num_slices, step, embeddings.device)
        cos_sum, sin_sum = epps_pulley_terms(embeddings.float() @ directions, self.step, self.t.numel())
        count = torch.tensor(float(embeddings.size(0)), device=embeddings.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            cos_sum = differentiable_all_reduce(cos_sum)
            sin_sum = differentiable_all_reduce(sin_sum)
            count = count.clone()
            dist.all_reduce(count)
        error = (cos_sum / count - self.target) ** 2 + (sin_sum / count) ** 2  # [S, T]
        return count * (error * self.weights).sum(-1).mean()


class VarianceCovariance(Regularizer):
    """VICReg's variance and covariance terms; its default ``combine`` is ``add``:
    ``jepa + w * varcov``.

    :meth:`statistic`: ``variance_weight * mean_d relu(target_std - sqrt(var_d + eps)) +
    covariance_weight * sum_{i != j} cov_ij^2 / D`` of ``[N, D]`` embeddings over the global
    batch, with VICReg's defaults (25 and 1; its invariance weight of 25 is the JEPA loss's place
    here). Under DDP the mean and the second moments are all-reduced (differentiably), so every
    rank computes the global batch's value, as VICReg's own code does by gathering the embeddings.

    Args:
        weight: the term's weight ``w`` (>= 0); 0 switches it off.
        variance_weight: weight of the variance hinge (>= 0).
        covariance_weight: weight of the covariance term (>= 0).
        target_std: the standard deviation below which the hinge pushes (> 0).
        eps: added to each variance under the square root (> 0).
    """

    log_name = "varcov"
    default_combine = "add"

    def __init__(
        self,
        weight: float = 0.04,
        input: str = "tokens",
        tokens: int = 1024,
        projector: list[int] | None = None,
        projector_share: float = 1.0,
        combine: str | None = None,
        variance_weight: float = 25.0,
        covariance_weight: float = 1.0,
        target_std: float = 1.0,
        eps: float = 1e-4,
    ):
        super().__init__(weight, input, tokens, projector, projector_share, combine)
        check_range(variance_weight, "VarianceCovariance variance_weight", 0)
        check_range(covariance_weight, "VarianceCovariance covariance_weight", 0)
        check_range(target_std, "VarianceCovariance target_std", 0, low_open=True)
        check_range(eps, "VarianceCovariance eps", 0, low_open=True)
        self.options.update(
            variance_weight=variance_weight, covariance_weight=covariance_weight, target_std=target_std, eps=eps
        )
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

    def statistic(self, embeddings: torch.Tensor, step: int = 0) -> torch.Tensor:
        """``embeddings [N, D]`` (this rank's share of the batch) -> the weighted sum of both terms."""
        hinge, covariance = self.terms(embeddings)
        return self.variance_weight * hinge + self.covariance_weight * covariance


def regularizer_kinds() -> tuple[type[Regularizer], ...]:
    """The concrete regularisers imported so far, in definition order: the registry the CLI's
    choices and the generated docs read."""
    return concrete_subclasses(Regularizer)


def regularizer_from_config(config: dict | Regularizer) -> Regularizer:
    """The member a :meth:`Regularizer.config` dict describes (a member is returned as it is)."""
    return config if isinstance(config, Regularizer) else from_config(config, Regularizer)


def log_names(members) -> list[str]:
    """Each member's ``log_name``, numbered from the second of a kind on: ``sigreg``, ``sigreg_1``, ..."""
    names = [member.log_name for member in members]
    return [name if names[:i].count(name) == 0 else f"{name}_{names[:i].count(name)}" for i, name in enumerate(names)]
