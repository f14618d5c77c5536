"""The GPU check's dry run: every part of scripts/gpu_check.sh on the CPU at toy sizes, with a
wheelhouse installed offline first, so that the check cannot rot between GPUs."""

import os
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

from ijepa.benchmark.gpu_check import PARTS, read_records

pytestmark = pytest.mark.slow  # about 2.5 minutes alone on 2 CPU cores, 6 beside the rest of the suite


def probe_wheel(folder) -> None:
    """A pure-Python wheel ``ijepa_probe 0.1`` (one module), as a wheelhouse would hold."""
    folder.mkdir(parents=True)
    info = "ijepa_probe-0.1.dist-info"
    files = {
        "ijepa_probe.py": "VALUE = 1\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: ijepa-probe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(folder / "ijepa_probe-0.1-py3-none-any.whl", "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))


def test_the_dry_run_runs_every_part_on_the_cpu_after_installing_the_wheelhouse(tmp_path):
    probe_wheel(tmp_path / "gpu" / "wheels")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, IJEPA_GPU_DIR=str(tmp_path / "gpu"), TMPDIR=str(tmp_path))
    command = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out), "--work-dir", str(tmp_path / "w")]
    # no stdin: under pytest-xdist it is the worker's channel to the controller
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800)
    log = (out / "check.log").read_text() if (out / "check.log").exists() else done.stdout
    summary = (out / "summary.md").read_text() if (out / "summary.md").exists() else ""
    failed = {r["part"] for r in read_records(out) if r["kind"] == "status" and r["status"] != "ok"}
    lines = [line for line in log.splitlines() if line.split("]")[0].lstrip("[") in failed]
    assert done.returncode == 0, summary + "\n".join(lines[-80:]) + done.stderr[-2000:]
    records = read_records(out)
    statuses = {r["part"]: r["status"] for r in records if r["kind"] == "status"}
    assert statuses == dict.fromkeys(PARTS, "ok"), log[-4000:]
    kinds = {(r["part"], r["kind"]) for r in records}
    assert {("env", "record"), ("cuda_tests", "TESTS"), ("step", "BENCHMARK"), ("learning_curve", "CURVE"),
            ("fit_loop", "FITLOOP"), ("finetune", "FINETUNE"), ("activation_memory", "ACTMEM")} <= kinds  # fmt: skip
    (env,) = [r for r in records if r["part"] == "env"][:1]
    assert env["wheelhouse"] == ["ijepa_probe-0.1"] and env["packages"]["torch"]
    (tests,) = [r for r in records if r["kind"] == "TESTS"]
    assert tests["passed"] == 3 and tests["failed"] == tests["skipped"] == 0  # tests/cuda ran, on the CPU
    steps = {r["model"]: r for r in records if r["kind"] == "BENCHMARK"}
    assert set(steps) == {"vit_tiny_96", "vit_base16_224"}
    assert all(r["static_compiled_images_per_s"] > 0 and "static_compiled_mfu" in r for r in steps.values())
    curve = [r["run"] for r in records if r["kind"] == "CURVE"]
    assert curve == ["random init", "raw pixels", "1x"]
    for line in ("| step | ok |", "| vit_base16_224 |", "| shapes | 1x | 4 | 4 |", "CUDA tests: 3 passed"):
        assert line in summary, summary
