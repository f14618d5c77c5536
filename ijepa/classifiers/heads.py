"""Grids of classifier heads trained together in one pass over frozen features.

A grid is ``H`` heads that read the same batch, which the caller computes once. Every head starts
from the same ``seed`` and owns its optimizer param groups, and the loss is the sum of the heads'
own losses, so each head in a grid trains exactly as it would alone: a sweep over learning rate x
weight decay costs one pass over the data instead of ``H``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ijepa.data.sampling import mix_seed
from ijepa.nn.checks import check_range
from ijepa.nn.vit import MLP, Block, rescale_residual_branches
from ijepa.schedules import warmup_cosine_schedule


def _check_divisor(num_heads: int, dim: int) -> None:
    check_range(num_heads, "num_heads", 1)
    if dim % num_heads:
        raise ValueError(f"num_heads must divide the feature width dim={dim}, got {num_heads}.")


class LinearHeadGrid(nn.Module):
    """``num_heads`` linear heads on ``features [B, D] -> logits [H, B, C]``, computed as one batched
    matmul. ``batch_norm=True`` puts a BatchNorm1d without affine before the heads (the DINOv2 / MAE
    linear probe); it has no parameters, so all heads share it and it runs once per batch. Each
    head's weight is drawn from N(0, 0.01^2) by a generator seeded with ``seed``, its bias is 0."""

    def __init__(self, in_features: int, num_classes: int, num_heads: int, batch_norm: bool = False, seed: int = 0):
        super().__init__()
        for value, name in ((in_features, "in_features"), (num_classes, "num_classes"), (num_heads, "num_heads")):
            check_range(value, name, 1)
        self.norm = nn.BatchNorm1d(in_features, affine=False) if batch_norm else nn.Identity()
        self.heads = nn.ModuleList()
        for _ in range(num_heads):
            head = nn.utils.skip_init(nn.Linear, in_features, num_classes)  # no draw from the global RNG
            nn.init.normal_(head.weight, std=0.01, generator=torch.Generator().manual_seed(seed))
            nn.init.zeros_(head.bias)
            self.heads.append(head)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() != 2:
            raise ValueError(f"features must have shape [B, D], got {tuple(features.shape)}.")
        weight = torch.stack([head.weight for head in self.heads])  # [H, C, D]
        bias = torch.stack([head.bias for head in self.heads])  # [H, C]
        x = self.norm(features).expand(len(self.heads), -1, -1)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


class AttentiveHead(nn.Module):
    """V-JEPA's attentive probe: ``tokens [B, K, D] -> logits [B, C]``.

    ``depth - 1`` self-attention blocks over the tokens, then a cross-attention block in which
    ``num_queries`` learned queries attend over the (LayerNorm-ed) tokens with ``num_heads`` heads,
    followed by an MLP, both residual on the queries; the queries' mean goes through LayerNorm and
    a linear layer. Initialised from ``seed`` alone (ViT init: trunc-normal 0.02 weights, zero
    biases, residual branches of the blocks scaled by ``1/sqrt(2 * layer)``)."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        depth: int = 1,
        num_heads: int = 4,
        num_queries: int = 1,
        mlp_ratio: float = 4.0,
        seed: int = 0,
    ):
        super().__init__()
        for value, name in ((dim, "dim"), (num_classes, "num_classes"), (depth, "depth"), (num_queries, "num_queries")):
            check_range(value, name, 1)
        check_range(mlp_ratio, "mlp_ratio", 0, low_open=True)
        _check_divisor(num_heads, dim)
        self.num_heads = num_heads
        # The layers' default inits draw from the global RNG; they are redrawn from the seed below.
        with torch.random.fork_rng(devices=[]):
            self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio) for _ in range(depth - 1))
            self.queries = nn.Parameter(torch.empty(num_queries, dim))
            self.norm_tokens = nn.LayerNorm(dim, eps=1e-6)
            self.q = nn.Linear(dim, dim)
            self.kv = nn.Linear(dim, 2 * dim)
            self.proj = nn.Linear(dim, dim)
            self.norm_mlp = nn.LayerNorm(dim, eps=1e-6)
            self.mlp = MLP(dim, int(dim * mlp_ratio))
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.linear = nn.Linear(dim, num_classes)
        self.reset_parameters(torch.Generator().manual_seed(seed))

    def reset_parameters(self, generator: torch.Generator) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02, generator=generator)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        nn.init.trunc_normal_(self.queries, std=0.02, generator=generator)
        rescale_residual_branches(self.blocks)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 3:
            raise ValueError(f"tokens must have shape [B, K, D], got {tuple(tokens.shape)}.")
        for block in self.blocks:
            tokens = block(tokens)
        x = self.queries + self.proj(self.cross_attention(tokens))
        x = x + self.mlp(self.norm_mlp(x))
        return self.linear(self.norm(x.mean(1)))

    def cross_attention(self, tokens: torch.Tensor) -> torch.Tensor:
        """The queries' multi-head attention over ``LayerNorm(tokens)``, ``[B, K, D] -> [B, Q, D]``,
        in an exactly equal, folded form. Projecting every token to keys and values costs
        ``B K D 2D`` per head, which would make a grid of heads cost more than the encoder's pass.
        Instead the key projection is folded into each query (``q . W_k(g x + b) = (g W_k^T q) . x``
        plus a term that is the same for every token, which the softmax cancels) and the value
        projection is applied after pooling (``sum_k p_k W_v(g x_k + b) = W_v(g sum_k p_k x_k + b)``
        as the weights sum to 1): ``B K D`` per attention head. ``tests/evaluation`` checks it
        against the unfolded attention."""
        batch, count, dim = tokens.shape
        heads, queries = self.num_heads, self.queries.size(0)
        width = dim // heads
        normed = F.layer_norm(tokens, (dim,), eps=self.norm_tokens.eps)  # the affine part is folded below
        gain, shift = self.norm_tokens.weight, self.norm_tokens.bias
        w_k, w_v = self.kv.weight[:dim].view(heads, width, dim), self.kv.weight[dim:].view(heads, width, dim)
        q = self.q(self.queries).view(queries, heads, width)
        folded = torch.einsum("qaw,awd->qad", q, w_k) * gain  # [Q, A, D]
        scores = torch.einsum("bkd,qad->bqak", normed, folded) / math.sqrt(width)
        pooled = torch.einsum("bqak,bkd->bqad", scores.softmax(-1), normed)  # [B, Q, A, D]
        values = torch.einsum("bqad,awd->bqaw", pooled * gain + shift, w_v) + self.kv.bias[dim:].view(heads, width)
        return values.reshape(batch, queries, dim)


class AttentiveHeadGrid(nn.Module):
    """``count`` :class:`AttentiveHead` s, each from ``seed``: ``tokens [B, K, D] -> logits [H, B, C]``.
    The heads run one after another (their parameters differ); the tokens are computed once."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        count: int,
        depth: int = 1,
        num_heads: int = 4,
        num_queries: int = 1,
        mlp_ratio: float = 4.0,
        seed: int = 0,
    ):
        super().__init__()
        check_range(count, "count", 1)
        self.heads = nn.ModuleList(
            AttentiveHead(dim, num_classes, depth, num_heads, num_queries, mlp_ratio, seed) for _ in range(count)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.stack([head(tokens) for head in self.heads])


def grid_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over heads of each head's mean cross-entropy (``logits [H, B, C]``, ``labels [B]``), so the
    gradient reaching head ``h`` is that of its own loss."""
    if logits.dim() != 3 or labels.shape != logits.shape[1:2]:
        raise ValueError(
            f"logits must be [H, B, C] and labels [B], got {tuple(logits.shape)} and {tuple(labels.shape)}."
        )
    # Batched over heads, and each head's gradient is bit for bit that of F.cross_entropy on its own logits.
    picked = logits.log_softmax(-1).gather(-1, labels.expand(logits.size(0), -1).unsqueeze(-1))
    return -picked.squeeze(-1).mean(1).sum()


@torch.no_grad()
def grid_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Top-1 accuracy of each head, ``[H]``."""
    return (logits.argmax(-1) == labels).float().mean(1)


def product_grid(lrs: list[float], weight_decays: list[float]) -> tuple[list[float], list[float]]:
    """Every (learning rate, weight decay) pair, learning rate major: the per-head lists of
    :func:`grid_optimizer` for a grid of ``len(lrs) * len(weight_decays)`` heads."""
    pairs = list(itertools.product(lrs, weight_decays))
    return [lr for lr, _ in pairs], [wd for _, wd in pairs]


def grid_optimizer(
    grid: nn.Module,
    lrs: list[float],
    weight_decays: list[float],
    kind: str = "sgd",
    momentum: float = 0.9,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.Optimizer:
    """A torch optimizer over ``grid.heads`` with head ``h`` in param groups ``2h`` (its weight
    matrices and queries, ``lr=lrs[h]``, ``weight_decay=weight_decays[h]``) and ``2h + 1`` (its biases
    and norm weights, same lr, no weight decay); every group carries ``"head": h``. ``kind``: ``"sgd"``
    with ``momentum`` (DINOv2's linear probe) or ``"adamw"`` with ``betas`` (V-JEPA's attentive probe)."""
    heads = grid.heads
    for values, name in ((lrs, "lrs"), (weight_decays, "weight_decays")):
        if len(values) != len(heads):
            raise ValueError(f"{name} must have one value per head of the grid ({len(heads)}), got {len(values)}.")
    groups = []
    for h, (head, lr, decay) in enumerate(zip(heads, lrs, weight_decays)):
        check_range(lr, "lrs", 0, low_open=True)
        check_range(decay, "weight_decays", 0)
        params = [p for p in head.parameters() if p.requires_grad]
        groups.append({"params": [p for p in params if p.dim() > 1], "lr": lr, "weight_decay": decay, "head": h})
        groups.append({"params": [p for p in params if p.dim() <= 1], "lr": lr, "weight_decay": 0.0, "head": h})
    if kind == "sgd":
        check_range(momentum, "momentum", 0, 1, high_open=True)
        return torch.optim.SGD(groups, momentum=momentum)
    if kind == "adamw":
        return torch.optim.AdamW(groups, betas=betas)
    raise ValueError(f"kind must be one of 'sgd', 'adamw', got {kind!r}.")


def cosine_lr_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Every group's lr times the same factor: linear warm-up from 0 over ``warmup_steps``, then a
    cosine to 0 at ``total_steps`` (step the scheduler after each optimizer step)."""
    check_range(total_steps, "total_steps", 1)
    check_range(warmup_steps, "warmup_steps", 0, total_steps, high_open=True)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_schedule(step, total_steps, warmup_steps, 1.0, 0.0)
    )


# mix_seed ignores trailing zeros: a tag per stream keeps the draws of one seed apart
ORDER_STREAM = 2


def feature_batches(
    features: torch.Tensor, labels: torch.Tensor, batch_size: int, seed: int, steps: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` shuffled minibatches of ``batch_size`` rows of cached ``features [N, ...]`` and
    ``labels [N]``, epoch after epoch: epoch ``e``'s order is a permutation drawn from
    ``(seed, e)`` alone, and its last, partial batch is dropped. The same batches on every process."""
    check_range(batch_size, "batch_size", 1, features.size(0))
    check_range(steps, "steps", 0)
    per_epoch = features.size(0) // batch_size
    for step in range(steps):
        epoch, index = divmod(step, per_epoch)
        if index == 0:
            order = torch.randperm(
                len(labels), generator=torch.Generator().manual_seed(mix_seed(seed, ORDER_STREAM, epoch))
            )
        rows = order[index * batch_size : (index + 1) * batch_size]
        yield features[rows], labels[rows]


class HeadGridTrainer:
    """Trains grids of heads together: each grid (``(grid, read)``, ``read(features)`` the part of a
    batch's features it takes) has one head per ``(lrs[h], weight_decays[h])``, its own optimiser
    (:func:`grid_optimizer`) and a cosine schedule over ``total_steps`` after ``warmup_steps``.
    :meth:`step` trains every head on one batch; what it trains on (cached features or images
    encoded on the fly) is the caller's. ``loss(logits, targets)`` is the grid's summed loss
    (:func:`grid_loss`; segmentation grids: :func:`~ijepa.classifiers.segmentation.segmentation_grid_loss`)."""

    def __init__(
        self,
        grids: list[tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]],
        lrs: list[float],
        weight_decays: list[float],
        optimizer: str,
        total_steps: int,
        warmup_steps: int = 0,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = grid_loss,
    ):
        self.grids, self.loss = grids, loss
        self.optimizers = [grid_optimizer(grid, lrs, weight_decays, kind=optimizer) for grid, _ in grids]
        self.schedules = [cosine_lr_scheduler(o, total_steps, warmup_steps) for o in self.optimizers]

    def step(self, features: torch.Tensor, labels: torch.Tensor) -> float:
        """One step of every head on ``features`` (the whole global batch) -> the summed loss."""
        with torch.inference_mode(False), torch.enable_grad():  # the probes run under inference mode
            features, labels = features.clone(), labels.clone()
            loss = sum(self.loss(grid(read(features)), labels) for grid, read in self.grids)
            for optimizer in self.optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for optimizer, schedule in zip(self.optimizers, self.schedules):
                optimizer.step()
                schedule.step()
        return float(loss.detach())

    def fit(
        self,
        batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
        device: torch.device,
        total_steps: int,
        on_loss: Callable[[int, float], None] | None = None,
        every: int = 10,
    ) -> None:
        """:meth:`step` on each ``(features, targets)`` of ``batches`` (moved to ``device``), and
        ``on_loss(step, summed loss)`` every ``every`` steps and at step ``total_steps``."""
        for step, (features, targets) in enumerate(batches, 1):
            loss = self.step(features.to(device), targets.to(device))
            if on_loss is not None and (step % every == 0 or step == total_steps):
                on_loss(step, loss)


@torch.no_grad()
def grid_scores(
    grid: nn.Module,
    features: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    read: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
) -> list[float]:
    """Top-1 accuracy of each head of ``grid`` (in eval mode) on ``features [N, ...]``, ``labels [N]``,
    in batches of ``batch_size``, on the grid's device."""
    device = next(grid.parameters()).device
    was_training = grid.training
    grid.eval()
    correct = None
    for xs, ys in zip(features.split(batch_size), labels.split(batch_size)):
        ys = ys.to(device)
        hits = grid_accuracy(grid(read(xs.to(device))), ys) * ys.numel()
        correct = hits if correct is None else correct + hits
    grid.train(was_training)
    return (correct / labels.numel()).tolist()
