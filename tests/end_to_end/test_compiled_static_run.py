"""``data.context_policy: static`` under ``model.compile``: after its first step a run compiles
nothing more (twenty steps of the compiled step, so an end-to-end run)."""

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow

GRID = 6  # the quickstart's grid
MODEL = {**TINY_MODEL, "image_size": 48}


def test_a_compiled_static_run_recompiles_nothing_after_its_first_step():
    dynamo = pytest.importorskip("torch._dynamo")
    counters = dynamo.utils.counters

    def graphs_over(policy: str, steps: int) -> list[int]:
        dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = IJEPA(**MODEL, compile=True, compile_options={"backend": "eager", "dynamic": False})
        model.configure_model()
        optimizer = model.build_optimizer()
        collate = MaskCollator(MultiBlockMaskSampler(GRID, context_policy=policy))
        seen = []
        for step in range(steps):
            batch = collate([(torch.randn(3, 48, 48), 0, step * 8 + i) for i in range(8)])
            loss = model.jepa_loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(counters["stats"]["unique_graphs"])
        return seen

    static = graphs_over("static", 20)
    assert static[0] > 0 and static[-1] == static[0], static
    # the per-batch draw changes shapes and so recompiles: the count above could fail
    per_batch = graphs_over("thin", 6)
    assert per_batch[-1] > per_batch[0], per_batch
