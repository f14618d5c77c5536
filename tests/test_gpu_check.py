"""The prepared GPU check: parts in order under their own limits, partial results kept, the
summary and goals read off the records, clear refusals; the wheelhouse's choice of wheels."""

import importlib.util
import json
import sys
import time
import zipfile

import pytest
from conftest import ROOT

from ijepa.benchmark import gpu_check
from ijepa.benchmark.gpu_check import GOALS, PARTS, Recorder, Settings, goals, read_records, run_check, run_command


def test_the_parts_run_most_wanted_first_and_each_has_a_limit_under_the_eight_minutes():
    assert list(PARTS)[:4] == ["env", "cuda_tests", "step", "learning_curve"]
    assert {"fit_loop", "finetune", "activation_memory"} <= set(PARTS)
    assert sum(part.limit_s for part in PARTS.values()) <= 480
    settings = Settings(dry_run=False, work_dir=ROOT)
    for part in PARTS.values():  # every command is a python -m of this package (it runs uninstalled)
        if part.command is not None:
            argv = part.command(settings, part.limit_s)
            assert argv[0] == sys.executable and argv[1] == "-m", part.name


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_part_past_its_limit_is_killed_with_its_children_and_its_printed_records_kept(tmp_path):
    recorder = Recorder(tmp_path)
    # the child prints one record, starts a grandchild, then hangs
    script = (
        "import json, subprocess, sys, time\n"
        "print('BENCHMARK ' + json.dumps({'model': 'm', 'images_per_s': 1.0}), flush=True)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('CHILD', child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    status = run_command("step", [sys.executable, "-c", script], 3, recorder, env=None)
    assert status["status"] == "timeout" and status["wall_s"] < 20
    records = read_records(tmp_path)
    assert records == [{"part": "step", "kind": "BENCHMARK", "model": "m", "images_per_s": 1.0}]
    log = (tmp_path / "check.log").read_text()
    grandchild = int(next(line for line in log.splitlines() if line.startswith("[step] CHILD")).split()[-1])
    time.sleep(0.5)
    assert not alive(grandchild)  # the part's whole process group went


def test_a_failing_part_does_not_stop_the_next_and_a_spent_budget_skips_the_rest(tmp_path, monkeypatch):
    calls = []

    def crash(settings, limit_s):
        calls.append("crash")
        return [sys.executable, "-c", "raise SystemExit(3)"]

    def fine(settings, limit_s):
        calls.append("fine")
        return [sys.executable, "-c", 'print(\'FITLOOP {"loop_over_step": 0.95, "images_per_s": 1.0}\')']

    def slow(settings, limit_s):
        calls.append("slow")
        return [sys.executable, "-c", "import time; time.sleep(30)"]

    parts = {
        "crash": gpu_check.Part("crash", 30, 30, command=crash),
        "fit_loop": gpu_check.Part("fit_loop", 30, 30, command=fine),
        "slow": gpu_check.Part("slow", 4, 4, command=slow),
        "never": gpu_check.Part("never", 30, 30, command=slow),
    }
    monkeypatch.setattr(gpu_check, "PARTS", parts)
    statuses = run_check(
        tmp_path / "out", Settings(dry_run=True, work_dir=tmp_path / "work"), 8, list(parts)
    )  # 8 s: 4 left after slow
    assert [(s["part"], s["status"]) for s in statuses] == [
        ("crash", "failed"),
        ("fit_loop", "ok"),
        ("slow", "timeout"),
        ("never", "skipped"),
    ]
    assert calls == ["crash", "fine", "slow"] and statuses[0]["returncode"] == 3
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| never | skipped the budget of 8 s is spent |" in summary
    assert "| fit loop within 10% of the bare step | 0.95x | met |" in summary


def test_the_goals_are_read_off_the_records_met_not_met_or_not_measured():
    records = [
        {"part": "step", "kind": "BENCHMARK", "model": "vit_base16_224", "static_compiled_mfu": 0.36},
        {"part": "step", "kind": "BENCHMARK", "model": "vit_tiny_96", "static_compiled_images_per_s": 13000.0},
    ]
    found = {name: (value, met) for name, value, met in goals(records)}
    assert found[GOALS[0][0]] == ("36.0%", "met")
    assert found[GOALS[1][0]] == ("13000", "not met")  # 3 x 4,509 = 13,527
    assert found[GOALS[2][0]] == ("-", "not measured")


def test_the_check_refuses_a_bad_budget_a_folder_without_images_and_a_machine_without_cuda(tmp_path, capsys):
    for argv, words in (
        ([str(tmp_path), "--dry-run", "--budget-s", "0"], "--budget-s must be > 0, got 0"),
        ([str(tmp_path), "--dry-run", "--fashion", str(tmp_path)], "--fashion must be an image folder"),
        ([str(tmp_path)], "no CUDA device"),
    ):
        with pytest.raises(SystemExit):
            gpu_check.main(argv)
        assert words in capsys.readouterr().err


# --- scripts/gpu_wheels.py ------------------------------------------------------------------------


@pytest.fixture
def wheels_module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "scripts" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(folder, name: str, requires: list[str]):
    path = folder / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"  # as wheels are named
    with zipfile.ZipFile(path, "w") as archive:
        metadata = "\n".join([f"Name: {name}", "Version: 1.0", *(f"Requires-Dist: {r}" for r in requires)])
        archive.writestr(f"{name}-1.0.dist-info/METADATA", metadata + "\n")
    return path


def test_the_wheelhouse_follows_requirements_and_leaves_out_what_the_gpu_image_has(
    wheels_module, tmp_path, monkeypatch
):
    requires = {
        "alpha": ["torch>=2.4", "beta_pkg[fast]>=1", "gamma; extra == 'docs'", 'delta; python_version < "3.10"'],
        "beta-pkg": ["PyYAML>=5", "epsilon; extra == 'fast'", "zeta; sys_platform == 'win32'"],
        "epsilon": ["alpha"],
    }

    def download(requirement, folder):
        name = wheels_module.parse(requirement)[0]
        return fake_wheel(folder, name, requires[name])

    monkeypatch.setattr(wheels_module, "download", download)
    fetched = wheels_module.fetch(tmp_path, ("alpha>=1",))
    # torch and PyYAML are on the GPU image; gamma is another extra's, delta an older Python's, zeta Windows';
    # alpha is fetched once although epsilon asks for it again
    assert [wheels_module.wheel_name(p) for p in fetched] == ["alpha", "beta-pkg", "epsilon"]
    assert {"jsonargparse", "litdata", "submitit"} == {wheels_module.parse(w)[0] for w in wheels_module.WANTED}
    assert not {"jsonargparse", "litdata", "submitit", "docstring-parser"} & wheels_module.PRESENT
    assert {"torch", "lightning", "torchmetrics", "torchvision", "timm", "peft", "tensorboard", "scikit-learn"} <= (
        wheels_module.PRESENT
    )


def test_a_fetched_wheel_list_names_its_version_in_the_check_environment(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "probe_pkg-1.2.dist-info").mkdir(parents=True)
    monkeypatch.setenv("IJEPA_WHEELHOUSE_SITE", str(site))
    monkeypatch.setenv("IJEPA_COMMIT", "abc1234")
    record = gpu_check.environment(Settings(dry_run=True, work_dir=tmp_path))
    assert record["wheelhouse"] == ["probe_pkg-1.2"] and record["commit"] == "abc1234"
    assert record["packages"]["torch"] and json.dumps(record)


class _Captured(Exception):
    pass


def test_every_parts_gpu_command_parses_as_its_module_reads_it(tmp_path, monkeypatch):
    # The GPU-only argument lists never run on a CPU machine: each is handed to its module's own
    # parser here (the measurement replaced), so that a typo cannot wait for the next GPU.
    import importlib

    from ijepa.cli import fit_arguments_error

    (tmp_path / "fashion" / "train").mkdir(parents=True)
    settings = Settings(dry_run=False, work_dir=tmp_path, fashion=tmp_path / "fashion")
    monkeypatch.chdir(ROOT)
    parsed = {}
    for name, part in PARTS.items():
        if part.command is None:
            continue
        argv = part.command(settings, part.limit_s)
        module = argv[2]
        if module == "pytest":
            assert (ROOT / argv[3]).is_dir() and "-n" in argv
            continue
        target = importlib.import_module(module)
        runner = "main" if module == "ijepa.benchmark.gpu" else "run"

        def capture(*args, name=name, **kwargs):
            parsed[name] = args[0] if len(args) == 1 else args
            raise _Captured

        if module == "ijepa.benchmark.gpu":  # its main parses, then hands each model to ijepa.benchmark.run
            monkeypatch.setattr(target, "run", capture)
        else:
            monkeypatch.setattr(target, runner, capture)
        with pytest.raises(_Captured):
            target.main(argv[3:])
    assert set(parsed) == {"step", "learning_curve", "fit_loop", "finetune", "activation_memory"}
    step = parsed["step"]
    assert step.static_compiled and step.compile_mode == "reduce-overhead" and step.precision == "bf16-mixed"
    assert step.device == "cuda" and step.config == "configs/stl10_vit_tiny.yaml"
    assert parsed["learning_curve"].multiples == [10, 40] and parsed["learning_curve"].data == "fashion"
    assert 0 < parsed["learning_curve"].budget_s < PARTS["learning_curve"].limit_s
    assert parsed["activation_memory"].model == "vit_l16" and parsed["finetune"].device == "cuda"
    config, overrides, steps, warmup = parsed["fit_loop"][:4]  # fit_loop.run's; its overrides go to ijepa fit
    assert config == "configs/stl10_vit_tiny.yaml" and steps > warmup + 1
    assert fit_arguments_error(["--config", config, *overrides]) is None
