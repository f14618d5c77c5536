"""Sharded training (``trainer.strategy: fsdp2``, FSDP2 through Lightning's ModelParallelStrategy) on
two CPU processes (gloo): the same losses and weights as one process on the same global batch,
the target encoder the EMA of the online one at every step, checkpoints saved and resumed exactly,
and the CLI command the README documents. tests/test_fsdp.py tests the sharding helpers in one process."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TESTS, TINY_CONFIG, knn_of_checkpoint

from ijepa.module import IJEPA

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

HERE = Path(__file__).resolve().parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(TESTS))


# --- two processes against one ---------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    reports, weights = {}, {}
    for mode in ("single", "fsdp", "resume", "resume_single"):  # resume* read the fsdp run's checkpoint
        result = subprocess.run(
            [sys.executable, str(HERE / "fsdp_run.py"), str(out), mode],
            cwd=out,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        reports[mode] = json.loads((out / f"{mode}.json").read_text())
        weights[mode] = torch.load(out / f"{mode}.pt", weights_only=True)
    return out, reports, weights


def test_sharded_losses_equal_one_process_on_the_same_global_batch(runs):
    _, reports, _ = runs
    assert reports["single"]["world"] == 1 and reports["fsdp"]["world"] == 2
    assert reports["fsdp"]["steps"] == reports["single"]["steps"] == 6
    assert reports["fsdp"]["losses"] == pytest.approx(reports["single"]["losses"], rel=1e-5)


def test_each_rank_holds_about_half_of_the_weights_and_optimizer_state(runs):
    _, reports, _ = runs
    assert reports["single"]["held_by_rank0"] == {"parameters": 1.0, "adam_moments": 1.0}
    for share in reports["fsdp"]["held_by_rank0"].values():  # dim-0 shards: uneven rows round up
        assert 0.45 <= share <= 0.56


def test_sharded_weights_equal_one_process_after_six_steps(runs):
    _, _, weights = runs
    single, sharded = weights["single"], weights["fsdp"]
    assert single.keys() == sharded.keys()
    assert any(k.startswith("target_encoder.") for k in single) and any(k.startswith("predictor.") for k in single)
    for name in single:  # the order of the gradient reductions differs: float tolerance
        torch.testing.assert_close(sharded[name], single[name], rtol=0, atol=2e-5, msg=name)
    # and training moved them: the comparison is not between two initial states
    assert not torch.equal(single["encoder.patch_embed.proj.weight"], single["target_encoder.patch_embed.proj.weight"])


def test_sharded_target_is_the_ema_of_the_online_encoder_at_every_step(runs):
    _, reports, _ = runs
    # target == before.lerp(online, 1 - m) on whole tensors, bit for bit, after each of the 6 steps
    assert reports["fsdp"]["ema_exact"] == [True] * 6
    assert reports["single"]["ema_exact"] == [True] * 6


def test_sharded_run_resumes_exactly_from_its_checkpoint(runs):
    _, reports, weights = runs
    assert reports["resume"]["losses"] == reports["fsdp"]["losses"][-2:]  # steps 5 and 6, bit for bit
    for name, value in weights["fsdp"].items():
        assert torch.equal(weights["resume"][name], value), name


def test_sharded_checkpoint_resumes_in_one_process(runs):
    _, reports, weights = runs
    assert reports["resume_single"]["world"] == 1
    assert reports["resume_single"]["losses"] == pytest.approx(reports["fsdp"]["losses"][-2:], rel=1e-5)
    for name, value in weights["fsdp"].items():  # optimizer moments and schedules came along
        torch.testing.assert_close(weights["resume_single"][name], value, rtol=0, atol=2e-5, msg=name)


def test_sharded_checkpoint_is_one_ordinary_file_that_loads_in_one_process(runs):
    out, _, _ = runs
    path = out / "checkpoints" / "epoch=1-step=4.ckpt"
    assert path.is_file()  # gathered on rank 0 and written by AtomicCheckpointIO, not a folder of shards
    assert not list(out.glob("checkpoints/*.tmp*"))
    model = IJEPA.load_from_checkpoint(path, weights_only=True)
    reference = IJEPA(**{k: v for k, v in model.hparams.items() if k in IJEPA.__init__.__code__.co_varnames})
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert shapes == {k: v.shape for k, v in reference.state_dict().items()}


# --- the CLI -----------------------------------------------------------------------------------
def test_cli_fit_with_fsdp2_trains_probes_and_checkpoints(tmp_path):
    args = [
        sys.executable,
        "-m",
        "ijepa",
        "fit",
        "--config",
        str(TINY_CONFIG),
        "--data.source.train_size=192",
        "--data.source.val_size=64",
        "--data.batch_size=32",
        "--trainer.strategy=fsdp2",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.max_steps=6",
    ]
    result = subprocess.run(args, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    logged = [float(x) for x in re.findall(r"k-NN probe \(step 6\): val/knn_top1 = ([0-9.]+)", output)]
    assert len(logged) == 1  # rank 0 reports the probe, gathered over both ranks
    # the sharded run's last checkpoint, probed in one process, scores what the sharded run logged
    knn = knn_of_checkpoint(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", tmp_path)
    assert knn == pytest.approx(logged[0], abs=1e-4)
