"""The benchmark script runs and its baseline computes the same loss as the model."""

import json
import subprocess

import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL

from ijepa.benchmark import main, packing
from ijepa.benchmark.baseline import SeedIJEPA, python_masks
from ijepa.data.batch import GridBatch
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA


def test_benchmark_prints_a_table_and_one_json_line(capsys):
    result = main(
        [
            "--config",
            str(TINY_CONFIG),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--mask-repeats",
            "5",
            "--knn-limit",
            "64",
        ]
    )
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("BENCHMARK "))
    assert json.loads(line[len("BENCHMARK ") :]) == json.loads(json.dumps(result))
    for key in (
        "images_per_s",
        "baseline_images_per_s",
        "speedup",
        "flops_per_step",
        "peak_memory_mb",
        "masks_per_s",
        "baseline_masks_per_s",
        "knn_seconds",
        "worker_images_per_s",
        "one_pass_images_per_s",
    ):
        assert result[key] > 0, key
    assert abs(result["loss"] - result["baseline_loss"]) < 1e-5  # the same math
    assert "training step (images/s)" in out


def test_seed_style_baseline_matches_the_model_on_sincos_and_learned():
    for pos in ("sincos", "learned"):
        model = IJEPA(**{**TINY_MODEL, "pos_embed": pos, "predictor_pos_embed": pos})
        sampler = MultiBlockMaskSampler(4, 3, (0.1, 0.2), min_keep=2)
        context, targets = sampler(6, torch.Generator().manual_seed(1))
        batch = GridBatch(torch.randn(6, 3, 32, 32), context, targets)
        with torch.no_grad():
            torch.testing.assert_close(SeedIJEPA(model).loss(batch), model.jepa_loss(batch), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stem", ["conv", "conv_in_patch"])
def test_seed_style_baseline_and_the_kernel_resize_refuse_a_conv_stem_in_one_line(stem):
    from ijepa.studies.resolution import patch_resize_error

    model = IJEPA(**{**TINY_MODEL, "stem": stem})
    with pytest.raises(ValueError, match="seed-style baseline.*model.stem"):
        SeedIJEPA(model)
    with pytest.raises(ValueError, match="--patch-sizes 8.*model.stem"):
        patch_resize_error(model, torch.randn(2, 3, 32, 32), 8)


def test_python_masks_are_valid():
    context, targets = python_masks(5, 6, num_blocks=3, min_keep=4)
    assert context.shape[0] == 5 and targets.shape[:2] == (5, 3) and context.shape[1] >= 4
    for b in range(5):
        assert not set(context[b].tolist()) & set(targets[b].flatten().tolist())


def test_index_checks_are_off_in_the_step_unless_debugging():
    from ijepa.nn import checks

    sampler = MultiBlockMaskSampler(4, 2, (0.1, 0.2), min_keep=2)
    context, targets = sampler(2, torch.Generator().manual_seed(0))
    batch = GridBatch(torch.randn(2, 3, 32, 32), context, targets)
    for debug in (False, True):
        model = IJEPA(**TINY_MODEL, debug_checks=debug)
        seen = []
        model.encoder.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(checks._INDEX_CHECKS))
        model.jepa_loss(batch)
        assert seen == [debug]
    assert checks._INDEX_CHECKS  # restored outside the step


def test_compile_switch_compiles_in_place_and_keeps_checkpoint_keys():
    plain = IJEPA(**TINY_MODEL)
    model = IJEPA(**TINY_MODEL, compile=True)
    model.configure_model()
    model.configure_model()  # idempotent: Lightning may call it again
    for network in (model.encoder, model.target_encoder, model.predictor):
        assert network._compiled_call_impl is not None
    assert list(model.state_dict()) == list(plain.state_dict())  # no _orig_mod. prefixes


def test_fit_loop_splits_step_and_data_wait(capsys):
    from ijepa.benchmark import fit_loop

    result = fit_loop.main(["--config", str(TINY_CONFIG), "--steps", "6", "--warmup", "2", "--bare-steps", "2"])
    assert result["steps_timed"] == 4 and result["step_ms"] > 0 and result["data_wait_ms"] >= 0
    assert 0 <= result["data_wait_fraction"] < 1 and result["images_per_s"] > 0
    assert result["loop_over_step"] == result["images_per_s"] / result["bare_step_images_per_s"] > 0
    assert "FITLOOP " in capsys.readouterr().out


def test_benchmark_times_the_one_pass_predictor_separately(capsys):
    result = main(
        [
            "--config",
            str(TINY_CONFIG),
            "--steps",
            "1",
            "--warmup",
            "1",
            "--mask-repeats",
            "2",
            "--no-knn",
            "--no-baseline",
        ]
    )
    assert result["one_pass_images_per_s"] > 0 and "one-pass predictor" in capsys.readouterr().out


def test_packing_benchmark_times_packed_against_padded_with_the_same_loss(capsys):
    args = ["--config", str(TINY_CONFIG), "--batches", "1", "--rounds", "1", "--warmup", "1"]
    result = packing.main([*args, "--data.native_sides=[2, 4]", "--data.token_budget=32", "--data.batch_size=16"])
    assert result["loss_packed"] == pytest.approx(result["loss_padded"], rel=1e-4)
    assert result["sequences_packed"] < result["sequences_padded"] == 16  # padded: one image per sequence
    assert result["slot_use_packed"] > result["slot_use_padded"]
    assert "packing / padding" in capsys.readouterr().out


def test_benchmark_times_the_static_shape_compiled_step_beside_the_eager_one(capsys):
    args = ["--config", str(TINY_CONFIG), "--steps", "2", "--rounds", "1", "--warmup", "2", "--no-baseline"]
    args += ["--no-knn", "--no-data", "--mask-repeats", "2", "--static-compiled", "--compile-backend", "eager"]
    result = main(args)
    context, targets = result["static_shapes"]
    assert context >= 2 and targets >= 1  # one count per run: the tiny config's static masks
    assert result["static_compiled_images_per_s"] > 0 and result["static_compiled_over_eager"] > 0
    assert "static shapes + torch.compile" in capsys.readouterr().out


def test_activation_memory_benchmark_measures_a_setting_and_tabulates_the_processes(monkeypatch, capsys):
    from ijepa.benchmark import activation_memory

    # what each child process runs (here in-process, on the tiny model)
    row = activation_memory.one_setting(1, 2, 1, torch.device("cpu"), "tiny")
    assert row["every"] == 1 and row["peak_bytes"] >= 0 and row["seconds"] > 0

    def child(command, **kwargs):  # the parent's side: one process per setting, each printing its row
        every = int(command[command.index("--one") + 1])
        line = json.dumps({"every": every, "peak_bytes": 100 // (every + 1), "seconds": 1.0 + every})
        return subprocess.CompletedProcess(command, 0, stdout=line + "\n")

    monkeypatch.setattr(activation_memory.subprocess, "run", child)
    result = activation_memory.main(["--model", "tiny", "--every", "0", "1"])
    assert [(r["every"], r["memory_ratio"], r["time_ratio"]) for r in result["rows"]] == [(0, 1.0, 1.0), (1, 0.5, 2.0)]
    out = capsys.readouterr().out
    assert out.count("\n| ") == 3 and out.splitlines()[-1].startswith("ACTMEM {")  # header and a row each
