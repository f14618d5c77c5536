"""The prepared GPU check: ``scripts/gpu_check.sh [--dry-run] OUT_DIR`` (this module behind it:
``python -m ijepa.benchmark.gpu_check [--dry-run] OUT_DIR``).

GPU time comes rarely and briefly, so one command measures everything wanted of a GPU, most
wanted first, each part a process of its own under its own time limit (a hang or a crash in one
part leaves the others' results), the whole inside ``--budget-s`` (480 s: 8 minutes):

======================  =====================================================================
part                    what it records
======================  =====================================================================
``env``                 GPU name, driver, memory; Python, torch (CUDA, cuDNN), Lightning and
                        the other packages' versions; the commit
``cuda_tests``          ``pytest tests/cuda`` (the tests that need a GPU): passed, failed, names
``step``                :mod:`ijepa.benchmark.gpu`: ViT-Ti/8, ViT-B/16, ViT-S/8 in bf16, eager
                        against static shapes + ``torch.compile`` (CUDA graphs): images/s, MFU,
                        peak memory, the seed-style baseline
``learning_curve``      :mod:`ijepa.studies.learning_curve`: the quickstart's recipe on
                        Fashion-MNIST (the generated shapes where its folder is absent) at 10x
                        and 40x its steps, the longer run stopped cleanly by the wall budget;
                        ``ijepa eval`` linear at each end, random init and raw pixels beside
``fit_loop``            :mod:`ijepa.benchmark.fit_loop`: the whole ``ijepa fit`` loop against
                        the bare step (STL-10 ViT-Ti/8 config on generated shapes)
``finetune``            :mod:`ijepa.benchmark.finetune`: one fine-tuning step against timm's
``activation_memory``   :mod:`ijepa.benchmark.activation_memory`: ViT-L/16 with and without
                        activation checkpointing, peak memory and seconds a step
======================  =====================================================================

It writes three files into OUT_DIR, each as the run goes, so whatever ends the run keeps what
came before: ``results.jsonl`` (one JSON object a line: ``{"part", "kind", ...}``; a part's
records as they are printed, then ``kind: "status"`` with ``ok``, ``failed``, ``timeout`` or
``skipped``), ``check.log`` (every part's output, each line behind its part's name) and
``summary.md`` (the tables docs/benchmarks.md takes, and the goals met or not), rewritten after
every part; ``python -m ijepa.benchmark.gpu_check --summary OUT_DIR`` writes it again from
``results.jsonl``. Working files (checkpoints, logs of the runs) go under ``--work-dir``.

``--dry-run`` runs every part's code path on the CPU at toy sizes (about 2 minutes on 2 cores):
the slow test that keeps the check from rotting between GPUs. Its limits are generous (it checks
the code paths, not the time: a loaded CI machine must not time a part out).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESULTS, LOG, SUMMARY = "results.jsonl", "check.log", "summary.md"
# A child's line ``TAG {json}`` is one result record (the benchmarks' own output format).
RECORD = re.compile(r"^(BENCHMARK|FITLOOP|FINETUNE|ACTMEM|CURVE) (\{.*\})\s*$")
PACKAGES = (
    "torch", "torchvision", "lightning", "pytorch-lightning", "torchmetrics", "jsonargparse", "timm", "peft",
    "tensorboard", "scikit-learn", "litdata", "submitit", "numpy", "safetensors", "triton",
)  # fmt: skip
# The goals of the GPU issue, read off the records: (name, part, kind, field, model or None, test).
GOALS = (
    ("ViT-B/16 static + compiled MFU >= 35%", "step", "BENCHMARK", "static_compiled_mfu", "vit_base16_224", 0.35),
    ("ViT-Ti/8 static + compiled >= 3x the old eager 4,509 images/s", "step", "BENCHMARK",
     "static_compiled_images_per_s", "vit_tiny_96", 3 * 4509),
    ("fit loop within 10% of the bare step", "fit_loop", "FITLOOP", "loop_over_step", None, 0.9),
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """What every part's command is built from."""

    dry_run: bool
    work_dir: Path
    python: str = sys.executable
    fashion: Path | None = None  # an image folder of Fashion-MNIST (scripts/gpu_wheels.sh writes one)


@dataclass(frozen=True)
class Part:
    """One measurement: ``command(settings, limit_s)`` is the argv of its process under the time
    it is given (``None``: it runs in this process, ``run(settings)`` returning its one record);
    ``limit_s`` its own time cap on a GPU, ``dry_limit_s`` under ``--dry-run``."""

    name: str
    limit_s: float
    dry_limit_s: float
    command: Callable[[Settings, float], list[str]] | None = None
    run: Callable[[Settings], dict] | None = None


PARTS: dict[str, Part] = {}


def part(name: str, limit_s: float, dry_limit_s: float):
    """Registers the decorated function as the part ``name`` (an argv builder, or with
    ``in_process`` an in-process measurement). Parts run in registration order."""

    def register(function):
        in_process = getattr(function, "in_process", False)
        PARTS[name] = Part(
            name,
            limit_s,
            dry_limit_s,
            command=None if in_process else function,
            run=function if in_process else None,
        )
        return function

    return register


def in_process(function):
    function.in_process = True
    return function


# --- the parts, most wanted first ------------------------------------------------------------------


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _commit() -> str:
    if os.environ.get("IJEPA_COMMIT"):
        return os.environ["IJEPA_COMMIT"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return done.stdout.strip()
    return "unknown"


@part("env", limit_s=15, dry_limit_s=60)
@in_process
def environment(settings: Settings) -> dict:
    """The machine and the software the figures were measured with."""
    import torch

    record = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": _commit(),
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "packages": {name: _version(name) for name in PACKAGES},
    }
    if site := os.environ.get("IJEPA_WHEELHOUSE_SITE"):  # scripts/gpu_check.sh installed a wheelhouse there
        record["wheelhouse"] = sorted(p.name.removesuffix(".dist-info") for p in Path(site).glob("*.dist-info"))
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        record |= {
            "gpu": properties.name,
            "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
            "multiprocessors": properties.multi_processor_count,
            "capability": f"{properties.major}.{properties.minor}",
        }
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        query = "--query-gpu=name,driver_version,memory.total"
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        if done.returncode == 0:
            record["nvidia_smi"] = done.stdout.strip()
            record["driver"] = done.stdout.split(",")[1].strip()
    return record


@part("cuda_tests", limit_s=50, dry_limit_s=240)
def cuda_tests(settings: Settings, limit_s: float) -> list[str]:
    """The tests that need CUDA (``tests/cuda``); under ``--dry-run`` the same tests on the CPU
    (``IJEPA_TEST_DEVICE=cpu``, which their ``device`` fixture reads)."""
    report = settings.work_dir / "cuda_tests.xml"
    return [settings.python, "-m", "pytest", "tests/cuda", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "-n", "0", f"--junitxml={report}"]  # fmt: skip


# Toy sizes of every model of the GPU suite: the same code paths in seconds on the CPU.
TOY_MODEL = [
    "--model.embed_dim=32", "--model.depth=1", "--model.num_heads=2", "--model.predictor_embed_dim=16",
    "--model.predictor_depth=1", "--model.predictor_num_heads=2", "--data.batch_size=4",
]  # fmt: skip


@part("step", limit_s=140, dry_limit_s=240)
def step(settings: Settings, limit_s: float) -> list[str]:
    """The training step of :mod:`ijepa.benchmark.gpu`; the two goals' models first. The dry run
    compiles with ``aot_eager`` (the same tracing of static shapes, forward and backward, without
    inductor's C++ builds, which take minutes on a loaded CPU)."""
    command = [settings.python, "-m", "ijepa.benchmark.gpu", "--models", "vit_tiny_96", "vit_base16_224"]
    if settings.dry_run:
        return [*command, "--device", "cpu", "--precision", "32-true", "--steps", "2", "--warmup", "1",
                "--peak-tflops", "1", "--no-knn", "--trainer.accelerator=cpu", "--compile-backend", "aot_eager",
                *TOY_MODEL]  # fmt: skip
    return [*command, "vit_small_96"]


@part("learning_curve", limit_s=165, dry_limit_s=420)
def learning_curve(settings: Settings, limit_s: float) -> list[str]:
    """The quickstart's recipe at 10x and 40x its steps (toy: 1x of 4 steps, one multiple being
    the same code path as two), DataLoader workers as many as a GPU machine's cores allow (the
    samples are seeded per index, so the batches do not depend on their number)."""
    root = settings.work_dir / "curve"
    budget = str(max(limit_s - 20, 1.0))  # the study stops its own fits inside the part's limit, with a margin
    command = [settings.python, "-m", "ijepa.studies.learning_curve", "run", "--root", str(root)]
    if settings.fashion is not None:
        command += ["--data", "fashion", "--folder", str(settings.fashion)]
    if settings.dry_run:
        fit = "--trainer.accelerator=cpu --model.embed_dim=32 --model.predictor_depth=1 --data.num_workers=0"
        shapes = "" if settings.fashion else " --data.source.train_size=256 --data.source.val_size=64"
        evaluation = shapes + " --data.batch_size=64 --data.num_workers=0"
        return [*command, "--multiples", "1", "--base-steps", "4", "--budget-s", budget,
                f"--fit-args={fit + shapes}", f"--eval-args={evaluation.strip()}", "--eval-epochs", "1"]  # fmt: skip
    workers = f"--data.num_workers={min(8, os.cpu_count() or 1)}"
    return [*command, "--multiples", "10", "40", "--budget-s", budget, f"--fit-args={workers}",
            f"--eval-args={workers}"]  # fmt: skip


@part("fit_loop", limit_s=40, dry_limit_s=120)
def fit_loop(settings: Settings, limit_s: float) -> list[str]:
    """The whole ``ijepa fit`` loop against the bare step, on generated shapes at STL-10's size."""
    command = [settings.python, "-m", "ijepa.benchmark.fit_loop", "--config", "configs/stl10_vit_tiny.yaml",
               "--data.source=ijepa.data.ShapesSource"]  # fmt: skip
    if settings.dry_run:
        return [*command, "--steps", "6", "--warmup", "2", "--bare-steps", "2", "--trainer.accelerator=cpu",
                "--trainer.precision=32-true", "--data.source.init_args.train_size=64", "--data.num_workers=0",
                *TOY_MODEL]  # fmt: skip
    return [*command, "--steps", "300", "--warmup", "50"]


@part("finetune", limit_s=25, dry_limit_s=120)
def finetune(settings: Settings, limit_s: float) -> list[str]:
    """One fine-tuning step of ``ijepa finetune`` against timm's, from the same weights."""
    command = [settings.python, "-m", "ijepa.benchmark.finetune", "--config", "configs/finetune/quickstart.yaml"]
    if settings.dry_run:
        return [*command, "--steps", "2", "--warmup", "1", "--batch-size", "8", "--device", "cpu"]
    return [*command, "--steps", "20", "--device", "cuda"]


@part("activation_memory", limit_s=40, dry_limit_s=120)
def activation_memory(settings: Settings, limit_s: float) -> list[str]:
    """ViT-L/16 at 224 px with activation checkpointing off and on every block."""
    command = [settings.python, "-m", "ijepa.benchmark.activation_memory", "--every", "0", "1"]
    if settings.dry_run:
        return [*command, "--model", "tiny", "--batch_size", "4", "--steps", "1", "--device", "cpu"]
    return [*command, "--model", "vit_l16", "--batch_size", "32", "--steps", "3", "--device", "cuda"]


# --- running them ---------------------------------------------------------------------------------


class Recorder:
    """Appends records to ``results.jsonl`` and lines to ``check.log`` as they come."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.lock = threading.Lock()

    def record(self, part: str, kind: str, payload: dict) -> None:
        line = json.dumps({"part": part, "kind": kind, **payload})
        with self.lock, open(self.out_dir / RESULTS, "a") as file:
            file.write(line + "\n")

    def log(self, part: str, line: str) -> None:
        with self.lock, open(self.out_dir / LOG, "a") as file:
            file.write(f"[{part}] {line.rstrip()}\n")
        print(f"[{part}] {line.rstrip()}", flush=True)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the part's whole process group (DataLoader workers, compile workers), then
    SIGKILL to what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
            return


def run_command(name: str, argv: list[str], limit_s: float, recorder: Recorder, env: dict) -> dict:
    """Runs ``argv`` under ``limit_s``, streaming its output to the log and its records to the
    results; returns its status record."""
    recorder.log(name, "$ " + shlex.join(argv))
    start = time.perf_counter()
    process = subprocess.Popen(  # no stdin: a part must never wait on (or read) its caller's input
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        bufsize=1,
    )

    def pump() -> None:
        for line in process.stdout:
            recorder.log(name, line)
            if match := RECORD.match(line.strip()):
                with contextlib.suppress(json.JSONDecodeError):
                    recorder.record(name, match.group(1), json.loads(match.group(2)))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        returncode = process.wait(limit_s)
        status = "ok" if returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        _stop(process)
        returncode, status = process.returncode, "timeout"
    reader.join(10)
    return {"status": status, "returncode": returncode, "wall_s": round(time.perf_counter() - start, 1)}


def junit_record(report: Path) -> dict | None:
    """Counts and failing names of a pytest ``--junitxml`` report."""
    if not report.is_file():
        return None
    cases = ElementTree.parse(report).getroot().iter("testcase")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failing = []
    for case in cases:
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        key = {"failure": "failed", "error": "failed"}.get(outcome, outcome)
        counts[key] += 1
        if key == "failed":
            failing.append(f"{case.get('classname')}::{case.get('name')}")
    return {**counts, "failing": failing}


def child_env(settings: Settings) -> dict:
    """The parts' environment: this package's folder on ``PYTHONPATH`` (so ``python -m ijepa``
    works uninstalled, as on a bare GPU machine), unbuffered output; on ``--dry-run`` no GPU."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    if settings.dry_run:
        env |= {"CUDA_VISIBLE_DEVICES": "", "IJEPA_TEST_DEVICE": "cpu"}
    return env


def run_check(out_dir: Path, settings: Settings, budget_s: float, parts: list[str]) -> list[dict]:
    """Every part of ``parts`` in registry order inside ``budget_s``; their status records."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(out_dir)
    env = child_env(settings)
    deadline = time.perf_counter() + budget_s
    statuses = []
    for name, member in PARTS.items():
        if name not in parts:
            continue
        cap = member.dry_limit_s if settings.dry_run else member.limit_s
        left = deadline - time.perf_counter()
        if left < min(5.0, cap):  # too little for a process to start and measure anything
            status = {"status": "skipped", "reason": f"the budget of {budget_s:.0f} s is spent"}
        elif member.run is not None:
            start = time.perf_counter()
            try:
                recorder.record(name, "record", member.run(settings))
                status = {"status": "ok"}
            except Exception as error:  # noqa: BLE001 -- a part's failure is a result, not the end of the check
                recorder.log(name, f"{type(error).__name__}: {error}")
                status = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
            status["wall_s"] = round(time.perf_counter() - start, 1)
        else:
            limit = min(cap, left)
            status = run_command(name, member.command(settings, limit), limit, recorder, env)
            if name == "cuda_tests" and (tests := junit_record(settings.work_dir / "cuda_tests.xml")):
                recorder.record(name, "TESTS", tests)
        status |= {"limit_s": round(min(cap, max(left, 0)), 1)}
        recorder.record(name, "status", status)
        statuses.append({"part": name, **status})
        write_summary(out_dir)
    return statuses


# --- the summary -----------------------------------------------------------------------------------


def read_records(out_dir: Path) -> list[dict]:
    path = out_dir / RESULTS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _of(records: list[dict], part: str, kind: str) -> list[dict]:
    return [r for r in records if r["part"] == part and r["kind"] == kind]


def _num(value, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if value is None else format(scale * value, fmt)


def goals(records: list[dict]) -> list[tuple[str, str, str]]:
    """``(goal, value, met)`` for each goal, ``-`` where its part gave no figure."""
    rows = []
    for name, part_name, kind, field, model, threshold in GOALS:
        found = [r.get(field) for r in _of(records, part_name, kind) if model is None or r.get("model") == model]
        value = next((v for v in found if v is not None), None)
        if value is None:
            rows.append((name, "-", "not measured"))
            continue
        shown = (
            f"{100 * value:.1f}%" if field.endswith("mfu") else (f"{value:.2f}x" if "over" in field else f"{value:.0f}")
        )
        rows.append((name, shown, "met" if value >= threshold else "not met"))
    return rows


def summary(records: list[dict]) -> str:
    """The markdown summary of a check's records."""
    lines = ["# GPU check", ""]
    for env in _of(records, "env", "record"):
        packages = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
        gpu = env.get("gpu") or "no GPU"
        lines += [f"{gpu}, driver {env.get('driver', '-')}, CUDA {env.get('torch_cuda')}, Python {env['python']}, "
                  f"commit {env['commit']}; {packages}", ""]  # fmt: skip
    lines += ["| part | status | wall s | limit s |", "|---|---|---|---|"]
    for status in (r for r in records if r["kind"] == "status"):
        note = status.get("reason") or status.get("error") or ""
        lines.append(f"| {status['part']} | {status['status']} {note}".rstrip() + f" | {status.get('wall_s', '-')} | "
                     f"{status.get('limit_s', '-')} |")  # fmt: skip
    for tests in _of(records, "cuda_tests", "TESTS"):
        lines += ["", f"CUDA tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
                  + (f" ({', '.join(tests['failing'])})" if tests["failing"] else "")]  # fmt: skip
    lines += ["", "| goal | value | |", "|---|---|---|", *(f"| {g} | {v} | {m} |" for g, v, m in goals(records))]
    steps = _of(records, "step", "BENCHMARK")
    if steps:
        lines += ["", "| model | eager images/s | static + compiled images/s | over eager | seed-style | MFU eager | "
                  "MFU static + compiled | peak memory GiB |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in steps:
            lines.append(
                f"| {r['model']} | {_num(r.get('images_per_s'), '.0f')} | {_num(r.get('static_compiled_images_per_s'), '.0f')} | "
                f"{_num(r.get('static_compiled_over_eager'), '.2f')} | {_num(r.get('baseline_images_per_s'), '.0f')} | "
                f"{_num(r.get('mfu'), '.1f', 100)}% | {_num(r.get('static_compiled_mfu'), '.1f', 100)}% | "
                f"{_num(r.get('peak_memory_mb'), '.1f', 1 / 1024)} |"
            )
    curve = _of(records, "learning_curve", "CURVE")
    if curve:
        lines += ["", "| data | run | steps planned | steps reached | wall s | in-fit k-NN | in-fit linear | "
                  "`ijepa eval` linear |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in curve:
            lines.append(
                f"| {r['data']} | {r['run']} | {r.get('max_steps', '-')} | {r.get('steps_reached', '-')} | "
                f"{_num(r.get('wall_s'), '.0f')} | {_num(r.get('knn_top1'), '.1f', 100)} | "
                f"{_num(r.get('linear_top1'), '.1f', 100)} | {_num(r.get('eval_linear_top1'), '.1f', 100)} |"
            )
    for r in _of(records, "fit_loop", "FITLOOP"):
        lines += ["", f"Fit loop: {_num(r.get('images_per_s'), '.0f')} images/s through `ijepa fit`, the bare step "
                  f"{_num(r.get('bare_step_images_per_s'), '.0f')}: {_num(r.get('loop_over_step'), '.2f')}x; data wait "
                  f"{_num(r.get('data_wait_fraction'), '.1f', 100)}% of the time"]  # fmt: skip
    for r in _of(records, "finetune", "FINETUNE"):
        ms, ratio = r.get("ms_per_step", {}), r.get("ratios", {}).get("timm / ours")
        lines += ["", f"Fine-tuning step, batch {r.get('batch_size')} at {r.get('image_size')} px: ours "
                  f"{_num(ms.get('ours'), '.2f')} ms, timm {_num(ms.get('timm'), '.2f')} ms, timm / ours "
                  f"{_num(ratio, '.2f')}x (same logits to {_num(r.get('max_logit_difference'), '.1e')})"]  # fmt: skip
    for r in _of(records, "activation_memory", "ACTMEM"):
        lines += ["", f"Activation checkpointing, {r['model']}, batch {r['batch_size']}:", "",
                  "| every | step's peak GiB | against off | s a step | against off |", "|---|---|---|---|---|"]  # fmt: skip
        for row in r["rows"]:
            lines.append(f"| {row['every']} | {row['peak_bytes'] / 2**30:.2f} | {_num(row.get('memory_ratio'), '.2f')} | "
                         f"{row['seconds']:.3f} | {row['time_ratio']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path) -> Path:
    path = out_dir / SUMMARY
    path.write_text(summary(read_records(out_dir)))
    return path


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m ijepa.benchmark.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out_dir", type=Path, help="where results.jsonl, check.log and summary.md go")
    parser.add_argument("--dry-run", action="store_true", help="every part on the CPU at toy sizes")
    parser.add_argument("--budget-s", type=float, default=None, help="the whole check's wall (default 480; dry 1500)")
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="a subset, in order")
    parser.add_argument("--work-dir", type=Path, default=None, help="runs' files (default: a temporary folder)")
    parser.add_argument("--fashion", type=Path, default=None, help="Fashion-MNIST image folder for the curve")
    parser.add_argument("--summary", action="store_true", help="only rewrite OUT_DIR/summary.md from its results")
    args = parser.parse_args(argv)
    if args.summary:
        print(write_summary(args.out_dir).read_text())
        return []
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {args.budget_s}")
    if args.fashion is not None and not (args.fashion / "train").is_dir():
        parser.error(
            f"--fashion must be an image folder with train/ and val/ (scripts/gpu_wheels.sh), got {args.fashion}"
        )
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device: run on a GPU machine, or pass --dry-run for the CPU check")
    budget = args.budget_s or (1500.0 if args.dry_run else 480.0)
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ijepa-gpu-check-")))
        settings = Settings(
            dry_run=args.dry_run, work_dir=work.resolve(), fashion=args.fashion and args.fashion.resolve()
        )
        statuses = run_check(args.out_dir, settings, budget, args.parts)
    print(write_summary(args.out_dir).read_text())
    return statuses


if __name__ == "__main__":
    # exit 1 when a part failed or ran out of time (its figures are missing from the summary)
    sys.exit(int(any(s["status"] in ("failed", "timeout") for s in main())))
