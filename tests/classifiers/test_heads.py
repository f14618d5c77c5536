"""Grids of classifier heads: a grid trained in one pass equals each of its heads trained alone
from the same seed, its forward is batched, and bad settings are refused by name."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ijepa.classifiers.heads import (
    AttentiveHead,
    AttentiveHeadGrid,
    LinearHeadGrid,
    cosine_lr_scheduler,
    grid_accuracy,
    grid_loss,
    grid_optimizer,
    product_grid,
)

LRS, WEIGHT_DECAYS = [1e-3, 1e-2, 1e-1, 1.0], [0.0, 5e-2]


def batches(steps: int, shape: tuple[int, ...], num_classes: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*shape, generator=g, dtype=torch.float64), torch.randint(num_classes, shape[:1], generator=g))
        for _ in range(steps)
    ]


def train(grid, lrs, weight_decays, kind, data):
    grid.double().train()
    optimizer = grid_optimizer(grid, lrs, weight_decays, kind)
    schedule = cosine_lr_scheduler(optimizer, total_steps=len(data), warmup_steps=3)
    for x, y in data:
        loss = grid_loss(grid(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return grid


def assert_each_head_trains_as_alone(make_grid, lrs, weight_decays, kind, data):
    together = train(make_grid(len(lrs)), lrs, weight_decays, kind, data)
    for h, (lr, decay) in enumerate(zip(lrs, weight_decays)):
        alone = train(make_grid(1), [lr], [decay], kind, data)
        for (name, p), q in zip(together.heads[h].named_parameters(), alone.heads[0].parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=f"head {h} (lr={lr}, wd={decay}): {name}")
    # the sweep did move the heads apart: the test compares trained heads, not the shared init
    first, last = together.heads[0].parameters(), together.heads[-1].parameters()
    assert not all(torch.equal(p, q) for p, q in zip(first, last))


@pytest.mark.parametrize("batch_norm", [False, True])
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_linear_grid_trained_in_one_pass_equals_each_head_trained_alone_from_the_seed(kind, batch_norm):
    lrs, weight_decays = product_grid(LRS, WEIGHT_DECAYS)
    data = batches(30, (16, 12), num_classes=5)
    assert_each_head_trains_as_alone(
        lambda count: LinearHeadGrid(12, 5, count, batch_norm=batch_norm, seed=7), lrs, weight_decays, kind, data
    )


def test_an_attentive_grid_trained_in_one_pass_equals_each_head_trained_alone_from_the_seed():
    data = batches(4, (6, 5, 8), num_classes=3)
    make = lambda count: AttentiveHeadGrid(8, 3, count, depth=2, num_heads=2, num_queries=2, mlp_ratio=2.0, seed=5)  # noqa: E731
    assert_each_head_trains_as_alone(make, [1e-3, 1e-2, 1e-1], [0.0, 0.05, 0.5], "adamw", data)


@pytest.mark.parametrize(
    "make",
    [lambda: LinearHeadGrid(12, 5, 3, seed=11), lambda: AttentiveHeadGrid(8, 3, 3, depth=2, num_heads=2, seed=11)],
    ids=["linear", "attentive"],
)
def test_every_head_starts_from_the_seed_and_the_global_rng_is_left_alone(make):
    state = torch.get_rng_state()
    grid, again = make(), make()
    assert torch.equal(torch.get_rng_state(), state)
    for head in [*grid.heads, *again.heads]:
        for p, q in zip(head.parameters(), grid.heads[0].parameters()):
            assert torch.equal(p, q)


class CallLog(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch_norm", [False, True])
def test_the_linear_grid_is_one_batched_matmul_equal_to_each_heads_own_forward(batch_norm):
    grid = LinearHeadGrid(12, 5, 8, batch_norm=batch_norm)
    with torch.no_grad():  # heads that differ, so a mix-up of heads would show
        for head in grid.heads:
            head.weight.normal_()
            head.bias.normal_()
    x = torch.randn(16, 12)
    with CallLog() as log:
        logits = grid(x)
    assert log.names.count("baddbmm") == 1 and "linear" not in log.names, log.names
    assert [n for n in log.names if n == "batch_norm"] == (["batch_norm"] if batch_norm else [])
    normed = grid.norm(x)
    expected = torch.stack([head(normed) for head in grid.heads])
    torch.testing.assert_close(logits, expected)


def test_batch_norm_without_affine_has_no_parameters_and_normalises_by_batch_statistics_in_training():
    grid = LinearHeadGrid(12, 5, 4, batch_norm=True)
    assert list(grid.norm.parameters()) == []
    assert {id(p) for p in grid.parameters()} == {id(p) for head in grid.heads for p in head.parameters()}
    x = torch.randn(32, 12) * 3 + 2
    normed = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + grid.norm.eps)
    torch.testing.assert_close(grid.train()(x)[0], grid.heads[0](normed))
    grid.eval()  # then the running statistics, updated once from their init (0, 1) with momentum 0.1
    running = (x - 0.1 * x.mean(0)) / torch.sqrt(0.9 + 0.1 * x.var(0) + grid.norm.eps)
    torch.testing.assert_close(grid(x)[0], grid.heads[0](running))


def test_the_gradient_grid_loss_sends_each_head_is_that_of_its_own_loss():
    logits = torch.randn(3, 10, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(4, (10,))
    (together,) = torch.autograd.grad(grid_loss(logits, labels), logits)
    for h in range(3):
        (alone,) = torch.autograd.grad(F.cross_entropy(logits[h], labels), logits)
        torch.testing.assert_close(together[h], alone[h], rtol=0, atol=0)
    expected = sum(F.cross_entropy(logits[h], labels) for h in range(3))
    torch.testing.assert_close(grid_loss(logits, labels), expected)


def test_grid_accuracy_is_each_heads_top1():
    labels = torch.tensor([0, 1, 2, 1])
    logits = F.one_hot(torch.tensor([[0, 1, 2, 1], [0, 0, 0, 0], [2, 2, 1, 0]]), 3).float()
    assert grid_accuracy(logits, labels).tolist() == [1.0, 0.25, 0.0]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_head_h_owns_param_groups_2h_and_2h_plus_1_and_biases_and_norms_are_not_decayed(kind):
    lrs, weight_decays = product_grid(LRS, WEIGHT_DECAYS)
    assert list(zip(lrs, weight_decays)) == [(lr, wd) for lr in LRS for wd in WEIGHT_DECAYS]
    grid = AttentiveHeadGrid(8, 3, len(lrs), depth=2, num_heads=2)
    groups = grid_optimizer(grid, lrs, weight_decays, kind).param_groups
    assert len(groups) == 2 * len(lrs)
    for h, head in enumerate(grid.heads):
        decayed, plain = groups[2 * h], groups[2 * h + 1]
        assert decayed["head"] == plain["head"] == h and decayed["lr"] == plain["lr"] == lrs[h]
        assert decayed["weight_decay"] == weight_decays[h] and plain["weight_decay"] == 0.0
        assert {id(p) for p in decayed["params"] + plain["params"]} == {id(p) for p in head.parameters()}
        assert all(p.dim() == 1 for p in plain["params"]) and any(p is head.queries for p in decayed["params"])


def test_the_cosine_schedule_warms_up_linearly_then_decays_to_zero_for_every_head():
    grid = LinearHeadGrid(4, 2, 2)
    optimizer = grid_optimizer(grid, [1.0, 0.1], [0.0, 0.0])
    schedule = cosine_lr_scheduler(optimizer, total_steps=6, warmup_steps=2)
    seen = []
    for _ in range(7):
        seen.append([group["lr"] for group in optimizer.param_groups[::2]])
        optimizer.step()
        schedule.step()
    factors = [0.0, 0.5, *(0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)), 0.0]
    torch.testing.assert_close(seen, [[f, 0.1 * f] for f in factors])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LinearHeadGrid(12, 5, 0), "num_heads must be >= 1, got 0."),
        (lambda: AttentiveHeadGrid(8, 3, 0), "count must be >= 1, got 0."),
        (lambda: AttentiveHeadGrid(8, 3, 2, num_heads=3), "num_heads must divide the feature width dim=8, got 3."),
        (lambda: AttentiveHeadGrid(8, 3, 2, depth=0), "depth must be >= 1, got 0."),
        (lambda: AttentiveHeadGrid(8, 3, 2, num_queries=0), "num_queries must be >= 1, got 0."),
        (
            lambda: grid_optimizer(LinearHeadGrid(4, 2, 2), [0.1], [0.0, 0.0]),
            "lrs must have one value per head of the grid (2), got 1.",
        ),
        (
            lambda: grid_optimizer(LinearHeadGrid(4, 2, 2), [0.1, 0.1], [0.0]),
            "weight_decays must have one value per head of the grid (2), got 1.",
        ),
        (lambda: grid_optimizer(LinearHeadGrid(4, 2, 2), [0.1, 0.0], [0.0, 0.0]), "lrs must be > 0, got 0.0."),
        (
            lambda: grid_optimizer(LinearHeadGrid(4, 2, 2), [0.1, 0.1], [0.0, -1.0]),
            "weight_decays must be >= 0, got -1.0.",
        ),
        (
            lambda: grid_optimizer(LinearHeadGrid(4, 2, 2), [0.1, 0.1], [0.0, 0.0], "lars"),
            "kind must be one of 'sgd', 'adamw', got 'lars'.",
        ),
        (
            lambda: cosine_lr_scheduler(grid_optimizer(LinearHeadGrid(4, 2, 1), [0.1], [0.0]), 5, 5),
            "warmup_steps must be in [0, 5), got 5.",
        ),
        (
            lambda: grid_loss(torch.zeros(2, 3, 4), torch.zeros(5, dtype=torch.long)),
            "logits must be [H, B, C] and labels [B]",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_setting_and_its_range(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("num_queries", [1, 3])
def test_the_folded_cross_attention_equals_plain_multi_head_attention_over_projected_tokens(num_queries):
    torch.manual_seed(1)
    head = AttentiveHead(16, 5, num_heads=4, num_queries=num_queries, seed=3).double()
    with torch.no_grad():  # a LayerNorm affine and biases that are not the init's zeros and ones
        for parameter in (head.norm_tokens.weight, head.norm_tokens.bias, head.kv.bias, head.q.bias):
            parameter.copy_(torch.randn_like(parameter))
    tokens = torch.randn(6, 9, 16, dtype=torch.float64)
    q = head.q(head.queries).view(num_queries, 4, 4).transpose(0, 1).expand(6, -1, -1, -1)
    k, v = head.kv(head.norm_tokens(tokens)).view(6, 9, 2, 4, 4).permute(2, 0, 3, 1, 4)
    plain = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(6, num_queries, 16)
    torch.testing.assert_close(head.cross_attention(tokens), plain, rtol=1e-12, atol=1e-12)
