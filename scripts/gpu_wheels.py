"""The wheels an offline GPU machine lacks, for ``scripts/gpu_wheels.sh``: standard library only.

The machine (this workplace's GPU image: CPython 3.12, manylinux x86-64) holds torch, Lightning,
torchmetrics, torchvision, timm, peft, tensorboard, scikit-learn and the packages in
``PRESENT``; ``import ijepa`` and the GPU check need ``WANTED`` on top. Starting from those, each
downloaded wheel's requirements (its ``Requires-Dist`` lines outside extras, plus the extras
asked for) are followed, and every one the machine already has is left out, so the folder holds
exactly what is missing (``pip download`` with its own resolver would fetch torch again).
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

# What `import ijepa`, the GPU check and its parts need beyond the image (extras in brackets).
WANTED = ("jsonargparse[signatures]>=4.36", "litdata>=0.2.40", "submitit>=1.5")
# The GPU image's Python packages (read on the machine, 2026-11-17), normalised names.
PRESENT = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
    charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
    llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
    nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
    nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
    patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
    py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
    safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
    setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
    torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
    typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)
PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    *(f"--platform={tag}" for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                      "manylinux2014_x86_64", "manylinux1_x86_64")),
]  # fmt: skip
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*)$")


def normalise(name: str) -> str:
    """PEP 503's form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, set[str], str, str]:
    """``(name, extras, specifier, marker)`` of a requirement string."""
    requirement, _, marker = requirement.partition(";")
    match = REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    name, extras, specifier = match.groups()
    return (
        normalise(name),
        {e.strip() for e in (extras or "").split(",") if e.strip()},
        specifier.strip(),
        marker.strip(),
    )


def needs(wheel: Path, extras: set[str]) -> list[str]:
    """The requirements of ``wheel`` for a CPython 3.12 Linux machine: those without an ``extra``
    marker and those of ``extras``. Other markers (Python versions, platforms) are read simply:
    ``python_version < "3.12"``-style requirements are dropped."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    found = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        _, _, _, marker = parse(requirement)
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if extra and extra.group(1) not in extras:
            continue
        older = re.search(r"python_version\s*<\s*['\"]3\.(\d+)['\"]", marker)
        if older and int(older.group(1)) <= 12:
            continue
        if re.search(r"sys_platform\s*==\s*['\"](win32|darwin)['\"]", marker):
            continue
        found.append(requirement.split(";")[0].strip())
    return found


def wheel_name(wheel: Path) -> str:
    return normalise(wheel.name.split("-")[0])


def missing(requirements: list[str], have: set[str]) -> list[str]:
    """The requirements whose distribution is neither on the machine nor fetched already."""
    return [r for r in requirements if parse(r)[0] not in PRESENT | have]


def download(requirement: str, folder: Path) -> Path:
    """One wheel (no dependencies) for the GPU machine into ``folder``."""
    name = parse(requirement)[0]
    before = {p.name for p in folder.glob("*.whl")}
    spec = requirement if not parse(requirement)[1] else re.sub(r"\[[^\]]*\]", "", requirement)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *PLATFORM, "-d", str(folder), spec]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    new = [folder / n for n in {p.name for p in folder.glob("*.whl")} - before]
    found = new or [p for p in folder.glob("*.whl") if wheel_name(p) == name]
    if not found:
        raise SystemExit(f"gpu_wheels: pip download {spec} wrote no wheel into {folder}")
    return found[0]


def fetch(folder: Path, wanted: tuple[str, ...] = WANTED) -> list[Path]:
    """``wanted`` and what they need that the GPU machine lacks, as wheels in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    queue, have, wheels = list(wanted), set(), []
    while queue:
        requirement = queue.pop(0)
        name, extras, _, _ = parse(requirement)
        if name in have or name in PRESENT:
            continue
        wheel = download(requirement, folder)
        have.add(name)
        wheels.append(wheel)
        queue += missing(needs(wheel, extras), have)
    return wheels


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".gpu/wheels")
    for wheel in fetch(target):
        print(f"{wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
