"""The GPU benchmark suite runs its models end to end (here on the CPU): a whole fit loop per model."""

import pytest
from conftest import TINY_CONFIG

pytestmark = pytest.mark.slow  # about 45 s on 2 CPU cores: `pytest -m "not slow"` skips it


def test_gpu_suite_runs_its_models_on_any_device(monkeypatch, capsys):
    from ijepa.benchmark import gpu

    tiny = str(TINY_CONFIG)
    monkeypatch.setattr(gpu, "SUITE", {"tiny": (tiny, ["--data.batch_size=8"])})
    # aot_eager: the static step traced as on a GPU, without inductor's C++ builds (a minute here)
    argv = "--device cpu --precision 32-true --steps 1 --warmup 1 --peak-tflops 1 --compile-backend aot_eager"
    results = gpu.main(argv.split())
    assert results[0]["model"] == "tiny" and results[0]["batch_size"] == 8 and 0 < results[0]["mfu"] < 1
    assert gpu.peak_tflops("NVIDIA H200") == 989.0 and gpu.peak_tflops("Mystery GPU") is None
