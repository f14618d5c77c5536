"""``model.activation_checkpointing`` composes with the rest of a run: DDP and FSDP2 on two CPU
processes (activation_checkpointing_run.py beside this file, launched once) and ``model.compile``.
Each checkpointed run gives the losses and gradients of the same run without it;
tests/test_module.py proves the same for the bare module, tests/test_activation_checkpointing_bf16.py
under ``trainer.precision: bf16-mixed``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo
from conftest import TESTS, TINY_MODEL
from functorch.compile import make_boxed_func
from helpers import assert_same
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(TESTS))


# --- DDP and FSDP2: two processes, four trainings --------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("checkpointing")
    script = Path(__file__).resolve().parent / "activation_checkpointing_run.py"
    result = subprocess.run(
        [sys.executable, str(script), str(out)], cwd=out, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {
        run: (json.loads((out / f"{run}.json").read_text()), torch.load(out / f"{run}.pt", weights_only=True))
        for run in ("ddp-0", "ddp-1", "fsdp2-0", "fsdp2-1")
    }


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_checkpointed_training_gives_the_losses_gradients_and_weights_of_plain_training(runs, strategy):
    (report, tensors), (plain_report, plain_tensors) = runs[f"{strategy}-1"], runs[f"{strategy}-0"]
    assert report["world"] == plain_report["world"] == 2 and len(report["losses"]) == 3
    assert report["losses"] == pytest.approx(plain_report["losses"], rel=1e-6)
    assert_same(tensors["grads"], plain_tensors["grads"])  # the first step's, all-reduced or gathered whole
    assert_same(tensors["weights"], plain_tensors["weights"])  # after three steps, target encoder included


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_checkpointed_blocks_run_again_in_the_backward_pass_with_whole_weights(runs, strategy):
    calls, plain_calls = runs[f"{strategy}-1"][0]["calls"], runs[f"{strategy}-0"][0]["calls"]
    # every block of the online encoder and the predictor is recomputed once; the target never
    assert calls["encoder"] == 2 * plain_calls["encoder"] > 0
    assert calls["predictor"] == 2 * plain_calls["predictor"] > 0
    assert calls["target_encoder"] == plain_calls["target_encoder"]
    # under FSDP2 the recomputation runs on the gathered weights, not this rank's shards
    assert runs[f"{strategy}-1"][0]["whole_weights"]


# --- torch.compile, in one process ----------------------------------------------------------------
def one_batch() -> dict:
    generator = torch.Generator().manual_seed(0)
    collate = MaskCollator(MultiBlockMaskSampler(4, target_scale=(0.1, 0.15), min_keep=2))
    return collate([(torch.randn(3, 32, 32, generator=generator), 0, i) for i in range(8)])


def loss_and_grads(model: IJEPA, batch: dict) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(1)  # stochastic depth: the same draws in both runs
    loss = model.jepa_loss(batch)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


# compiling the three networks takes seconds
def test_compiled_checkpointed_step_equals_the_eager_plain_step_and_recomputes_in_its_backward():
    graphs = {"forward": [], "backward": []}

    def keep(kind):
        def compiler(graph, inputs):
            graphs[kind].append(graph)
            return make_boxed_func(graph.forward)

        return compiler

    # aot_eager with the graphs kept: AOTAutograd and the partitioner that inductor uses, without
    # its C++ build (over a minute on two cores). Inductor, checked by hand without stochastic
    # depth (it draws from its own generator), gave gradients within 1e-8 of eager.
    backend = aot_autograd(
        fw_compiler=keep("forward"), bw_compiler=keep("backward"), partition_fn=min_cut_rematerialization_partition
    )
    options = {**TINY_MODEL, "drop_path_rate": 0.2}
    batch = one_batch()
    torch.manual_seed(0)
    loss, grads = loss_and_grads(IJEPA(**options), batch)
    dynamo.reset()
    dynamo.utils.counters.clear()
    try:
        torch.manual_seed(0)
        model = IJEPA(
            **options, activation_checkpointing=1, compile=True, compile_options={"backend": backend, "dynamic": False}
        )  # static shapes compile in a third of the time; the default, dynamic, composes alike (checked by hand)
        model.configure_model()
        compiled_loss, compiled_grads = loss_and_grads(model, batch)
        breaks = dict(dynamo.utils.counters["graph_break"])
    finally:
        dynamo.reset()
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-5)
    assert_same(compiled_grads, grads, tolerance=1e-5)
    assert breaks == {}  # the checkpointed blocks are traced whole, not split at the checkpoint
    # the online encoder's and the predictor's backward graphs run the blocks' attention forward again
    assert len(graphs["backward"]) == 2
    for graph in graphs["backward"]:
        ops = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
        assert any("scaled_dot_product" in op and "backward" not in op for op in ops), ops
