"""The tests that need a GPU: the bf16 step, the static compiled step and a whole fit on the
device. Without CUDA they skip, unless ``IJEPA_TEST_DEVICE`` names a device: the GPU check's dry
run (``scripts/gpu_check.sh --dry-run``) sets it to ``cpu``, so that these tests run somewhere on
every CI run and cannot rot between GPUs; the GPU check runs them on the GPU first."""

import copy
import os

import pytest
import torch
from conftest import TINY_MODEL, tiny_datamodule, tiny_trainer
from lightning.fabric.utilities.apply_func import move_data_to_device

from ijepa.benchmark import synthetic_batches
from ijepa.callbacks import EMATargetUpdate
from ijepa.module import IJEPA


@pytest.fixture
def device() -> torch.device:
    name = os.environ.get("IJEPA_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
    if name is None:
        pytest.skip("needs a CUDA device (IJEPA_TEST_DEVICE=cpu runs it on the CPU, as the GPU check's dry run does)")
    return torch.device(name)


def test_the_bf16_step_on_the_device_fits_a_fixed_batch(device):
    # Twenty AdamW steps on one batch under bf16 autocast: the loss stays finite and falls (over
    # seeds 0-5 on the CPU it fell to 0.65-0.68 of its start; the bound is 0.85).
    model = IJEPA(**TINY_MODEL).to(device).train()
    data = tiny_datamodule(batch_size=16)
    batch = synthetic_batches(data, 1, device)[0]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(20):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model.jepa_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < 0.85 * losses[0], losses


@pytest.fixture
def full_float32():
    """float32 matrix products without TF32, for the duration of a test."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def test_the_static_compiled_step_gives_the_eager_loss_and_gradients_on_the_device(device, full_float32):
    # torch.compile(dynamic=False) over static-shape masks (CUDA graphs on a GPU, as the GPU
    # benchmark times it): the same function as the eager model, to float32 rounding. On the CPU
    # (the dry run) the same tracing through aot_eager, without inductor's C++ builds (a minute
    # on a cold cache); tests/end_to_end/test_compiled_static_run.py compiles for the CPU in full.
    model = IJEPA(**TINY_MODEL).to(device).train()
    data = tiny_datamodule(batch_size=8)
    sampler = data.image_sampler(data.grid_size, context_policy="static")
    batch = move_data_to_device(synthetic_batches(data, 1, device, sampler=sampler)[0], device)
    compiled = copy.deepcopy(model)
    compiled.hparams.compile = True
    on_cuda = device.type == "cuda"
    compiled.hparams.compile_options = {
        "dynamic": False,
        **({"mode": "reduce-overhead"} if on_cuda else {"backend": "aot_eager"}),
    }
    compiled._compiled = False
    compiled.configure_model()
    eager_loss, compiled_loss = model.jepa_loss(batch), compiled.jepa_loss(batch)
    eager_loss.backward()
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-5)
    for (name, ours), theirs in zip(model.named_parameters(), compiled.parameters()):
        if ours.grad is not None:
            torch.testing.assert_close(theirs.grad, ours.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_a_bf16_mixed_fit_on_the_device_trains_and_its_checkpoint_loads_on_the_cpu(device, tmp_path):
    model = IJEPA(**TINY_MODEL, optim={"warmup_steps": 1})
    trainer = tiny_trainer(
        tmp_path,
        accelerator=device.type,
        devices=1,
        precision="bf16-mixed",
        max_steps=4,
        limit_val_batches=0,
        callbacks=[EMATargetUpdate()],
    )
    trainer.fit(model, datamodule=tiny_datamodule())
    assert trainer.global_step == 4 and torch.isfinite(trainer.callback_metrics["train/loss"])
    trainer.save_checkpoint(tmp_path / "device.ckpt")
    loaded = IJEPA.load_from_checkpoint(tmp_path / "device.ckpt", map_location="cpu", weights_only=True)
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, model.state_dict()[name].cpu(), msg=name)
