"""ThroughputLogger: images/s, tokens/s, FLOPs per step, MFU and data-wait share during ``fit``."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from conftest import TINY_CONFIG, TINY_MODEL
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.loggers import TensorBoardLogger

from ijepa.callbacks import ThroughputLogger, throughput
from ijepa.callbacks.throughput import images_and_tokens, peak_flops
from ijepa.cli import main
from ijepa.data.batch import ClipBatch, GridBatch, PackedBatch
from ijepa.module import IJEPA
from ijepa.nn.packing import Packed


def drive(callback, clock_steps, world_size=1):
    """Run the callback's batch hooks over batches of 4 images 32 px, with a validation before
    the last one; ``clock_steps`` [(wait, step)] set the clock."""
    readings = [0.0]
    for wait, step in clock_steps:
        readings += [readings[-1] + wait, readings[-1] + wait + step]
    clock = iter(readings[1:])
    cpu = torch.device("cpu")
    trainer = SimpleNamespace(
        global_step=0,
        loggers=[mock.Mock()],
        world_size=world_size,
        log_every_n_steps=50,
        precision="32-true",
        strategy=SimpleNamespace(root_device=cpu),
    )
    module = SimpleNamespace(device=cpu, hparams=SimpleNamespace(patch_size=8, tubelet_size=2))
    batch = grid_batch(torch.zeros(4, 3, 32, 32))
    callback.setup(trainer, module, "fit")
    callback.on_train_start(trainer, module)
    with mock.patch.object(throughput, "perf_counter", lambda: next(clock)):
        for index in range(len(clock_steps)):
            if index == len(clock_steps) - 1:
                callback.on_validation_start(trainer, module)
            callback.on_train_batch_start(trainer, module, batch, index)
            trainer.global_step += 1
            callback.on_train_batch_end(trainer, module, None, batch, index)
    return trainer.loggers[0].log_metrics.call_args_list


def test_the_data_wait_share_is_the_wait_over_wait_plus_step_over_the_window():
    callback = ThroughputLogger(log_every_n_steps=3, window=2)
    # step 1 is the warm-up, steps 2-3 fill the window, step 4 follows a validation: not timed
    calls = drive(callback, [(9.0, 9.0), (0.5, 1.0), (0.25, 2.0), (7.0, 1.0)], world_size=2)
    assert len(calls) == 1 and calls[0].kwargs["step"] == 2
    metrics = calls[0].args[0]
    assert metrics["throughput/data_wait_share"] == (0.5 + 0.25) / (0.5 + 0.25 + 1.0 + 2.0)
    assert metrics["throughput/images_per_s"] == 2 * 8 / (0.5 + 0.25 + 1.0 + 2.0)  # both processes
    assert metrics["throughput/tokens_per_s"] == 2 * 8 * 16 / (0.5 + 0.25 + 1.0 + 2.0)
    assert "throughput/mfu" not in metrics  # no FLOPs counted outside a real step


def test_a_cpu_without_peak_tflops_logs_no_mfu_and_says_so_once(tmp_path, monkeypatch, make_trainer):
    said = []
    monkeypatch.setattr(throughput, "rank_zero_info", said.append)
    trainer = make_trainer(accelerator="cpu", logger=TensorBoardLogger(tmp_path), max_steps=1)
    for peak in (None, 3.0):
        callback = ThroughputLogger(peak_tflops=peak)
        callback.setup(trainer, IJEPA(**TINY_MODEL), "fit")
        callback.flops_per_step = 10**9
        callback.steps.append((4, 64, 0.5, 1.0))
        assert ("throughput/mfu" in callback.metrics()) == (peak is not None)
        assert callback.metrics()["throughput/tflops_per_s"] == 1e-3
    assert len(said) == 1 and "peak_tflops" in said[0] and said[0].startswith("ThroughputLogger: no peak FLOP/s")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("log_every_n_steps", "0", "log_every_n_steps must be >= 1 (steps) or null, got 0."),
        ("window", "0", "window must be >= 1 (steps) or null, got 0."),
        ("peak_tflops", "0", "peak_tflops must be a finite number > 0 (TFLOP/s of one device) or null, got 0.0."),
    ],
)
def test_a_bad_option_is_an_error_naming_it_and_its_range(capsys, option, value, message):
    args = ["--trainer.callbacks+=ijepa.callbacks.ThroughputLogger", f"--trainer.callbacks.{option}={value}"]
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", str(TINY_CONFIG), *args])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == f"error: trainer.callbacks: ThroughputLogger: {message}"


def test_an_infinite_peak_is_refused():
    with pytest.raises(ValueError, match=r"^peak_tflops must be a finite number > 0 .* got inf\.$"):
        ThroughputLogger(peak_tflops=float("inf"))


def test_the_peak_comes_from_the_table_then_from_lightning(monkeypatch):
    cuda = torch.device("cuda")

    def peak(name, precision="bf16-mixed"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return peak_flops(cuda, precision)

    # Lightning does not know the plain "NVIDIA H200"; its dense figures agree with the table
    assert peak("NVIDIA H200") == 989.4e12 and get_available_flops(cuda, torch.bfloat16) is None
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4"):
        assert peak(name) == get_available_flops(cuda, torch.bfloat16), name
    assert peak("NVIDIA A10") == 125e12 and peak("NVIDIA L40S") == 362.05e12
    assert peak("NVIDIA GeForce RTX 4090") == 82.6e12  # not in the table: Lightning's
    with mock.patch.object(torch, "get_float32_matmul_precision", lambda: "highest"):
        assert peak("NVIDIA H100 PCIe", "32-true") == 51.2e12
    with mock.patch.object(torch, "get_float32_matmul_precision", lambda: "high"):
        assert peak("NVIDIA H100 PCIe", "32-true") == 378e12  # tf32
    assert peak_flops(torch.device("cpu"), "32-true") is None


def grid_batch(images: torch.Tensor, patch_size: int | None = None) -> GridBatch:
    """A batch of ``images`` with one context and one target patch each (the counts ignore masks)."""
    rows = images.size(0)
    indices = torch.zeros(rows, 1, dtype=torch.long)
    kind = ClipBatch if images.dim() == 5 else GridBatch
    return kind(images, indices, indices[:, None], patch_size=patch_size)


def test_tokens_are_every_patch_of_every_image_clip_and_packed_batch():
    assert images_and_tokens(grid_batch(torch.zeros(2, 3, 32, 32)), 8, 2) == (2, 32)
    assert images_and_tokens(grid_batch(torch.zeros(2, 3, 32, 32), patch_size=16), 8, 2) == (2, 8)
    assert images_and_tokens(grid_batch(torch.zeros(2, 3, 4, 16, 16)), 8, 2) == (2, 16)  # 2 tubelets x 2 x 2
    ids = torch.tensor([[0, 0, 1, -1], [2, 2, 2, -1]])
    layout = Packed(None, ids.clamp_min(0), ids)
    packed = PackedBatch(torch.zeros(3), layout, layout, layout, ids, ids)
    assert images_and_tokens(packed, 8, 2) == (3, 6)
