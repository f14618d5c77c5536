"""Shared by every test: the seed and thread count, the tiny model, config, data module and Trainer.

Tests are laid out like the package (``tests/nn`` for ``ijepa/nn``, ``tests/data`` for
``ijepa/data``, ``tests/callbacks`` for ``ijepa/callbacks``, ``tests/evaluation``); the rest of
``ijepa/`` is tested at the top level. ``tests/end_to_end`` holds the slow tests and only them:
whole ``ijepa fit`` runs, learning checks, two-process launches and the notebooks as scripts, one
file per area, each module marked ``pytestmark = pytest.mark.slow``, so ``pytest -m "not slow"`` is
the suite without that folder (a quick loop; CI runs everything). ``tests/test_layout.py`` checks
both directions, that basenames are unique, and that no test module imports another: helpers that
several modules use are in ``tests/helpers.py``, fixtures here.

A test that needs the tiny data module or Trainer asks for ``make_datamodule`` / ``make_trainer``
(or imports ``tiny_datamodule`` / ``tiny_trainer``) and passes only what differs from the defaults.
"""

import getpass
import os
import tempfile
from pathlib import Path

import lightning as L
import pytest
import torch

from ijepa.callbacks import KNNProbe
from ijepa.data import IJEPADataModule
from ijepa.data.shapes import ShapesDataset
from ijepa.data.sources import ShapesSource
from ijepa.masks import MultiBlockMasks, SpatioTemporalMasks
from ijepa.module import IJEPA

# torch.compile's on-disk cache is not keyed by ATen's CPU capability: kernels compiled under
# ATEN_CPU_CAPABILITY=avx2 and loaded by a default (AVX-512) run aborted the process (and the
# reverse raised "tuple args required"). One cache per capability, unless the user chose a
# folder; importing Lightning has already set torch's default, so that is replaced here, and
# subprocesses inherit it.
_DEFAULT_CACHE = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
if os.environ.get("TORCHINDUCTOR_CACHE_DIR", _DEFAULT_CACHE) == _DEFAULT_CACHE:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{_DEFAULT_CACHE}_{torch.backends.cpu.get_cpu_capability()}"

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the repository: configs/, docs/, ijepa/
TINY_CONFIG = TESTS / "tiny.yaml"  # a seconds-long ijepa fit config


# pytest-xdist runs the suite in one worker process per core (`-n auto` in pyproject.toml): each
# worker then computes on one thread, and so do the processes a test starts (they inherit the
# variable), because OpenMP threads that find their core taken spin-wait and slow everything
# several-fold. Run alone (`-n 0`), a test computes on two threads, as CI's machines have.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
os.environ["OMP_NUM_THREADS"] = str(THREADS)


def pytest_collection_modifyitems(config, items):
    """The slow tests first (stable order otherwise), so that under xdist the minutes-long runs start
    at once and the quick tests fill the other workers, rather than one long run trailing at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Every test starts from the same RNG state and thread count (THREADS)."""
    torch.manual_seed(0)
    torch.set_num_threads(THREADS)
    torch.set_flush_denormal(False)  # IJEPA.setup turns it on process-wide; start every test from the default
    yield


# Generated shapes are a pure function of the dataset's options, and rendering them was a third
# of a tiny fit's time: outside tests/data (which tests the rendering itself), a worker renders each
# set once and later datasets with the same options get copies of it.
_RENDERED: dict[tuple, tuple] = {}
_render_all = ShapesDataset._render_all


def _render_all_once(self: ShapesDataset):
    key = (self.num_samples, self.image_size, self.split, self.seed, self.background, self.num_objects)
    key += (self.radius, self.dense)
    if key not in _RENDERED:
        _RENDERED[key] = (_render_all(self), self.masks, self.counts)
    images, masks, counts = _RENDERED[key]
    self.masks, self.counts = (None if t is None else t.clone() for t in (masks, counts))
    return images.clone()


@pytest.fixture(autouse=True)
def _shapes_rendered_once(request, monkeypatch):
    if TESTS / "data" not in Path(request.node.path).parents:
        monkeypatch.setattr(ShapesDataset, "_render_all", _render_all_once)


TINY_MODEL = dict(
    image_size=32,
    patch_size=8,
    embed_dim=32,
    depth=2,
    num_heads=2,
    predictor_embed_dim=16,
    predictor_depth=1,
    predictor_num_heads=2,
)
# The clip tests' tiny model: 16 px x 4 frames, tubelets of 2 frames (a 2 x 4 x 4 grid), one block.
TINY_CLIP_MODEL = {**TINY_MODEL, "image_size": 16, "patch_size": 4, "depth": 1, "num_frames": 4, "tubelet_size": 2}


# The settings most tests share: TINY_MODEL's sizes, generated shapes, no workers, no random crop,
# small target blocks that fit a 4x4 grid.
TINY_DATA = dict(
    image_size=32,
    patch_size=8,
    batch_size=32,
    num_workers=0,
    crop_scale=None,
    masks=MultiBlockMasks(target_scale=(0.1, 0.15), min_keep=2),
)
# TINY_DATA's masks for clips (tiny_datamodule picks them when num_frames > 0 and no masks are given).
TINY_CLIP_MASKS = SpatioTemporalMasks(target_scale=(0.1, 0.15), min_keep=2)
# A quiet Trainer that writes nothing unless asked to.
TINY_TRAINER = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def tiny_datamodule(train_size: int = 64, val_size: int = 64, **overrides) -> IJEPADataModule:
    """The tiny data module: ``ShapesSource(train_size, val_size)`` with ``TINY_DATA``; ``overrides``
    (any IJEPADataModule argument, ``source`` included) replace the defaults."""
    source = overrides.pop("source", None) or ShapesSource(train_size=train_size, val_size=val_size)
    if overrides.get("num_frames", 0) > 0:
        overrides.setdefault("masks", TINY_CLIP_MASKS)
    return IJEPADataModule(source=source, **{**TINY_DATA, **overrides})


def tiny_trainer(root: Path, **overrides) -> L.Trainer:
    """A ``TINY_TRAINER`` writing under ``root``; ``overrides`` are any other Trainer arguments."""
    return L.Trainer(**{**TINY_TRAINER, "default_root_dir": root, **overrides})


def save_tiny_checkpoint(model: IJEPA, path: Path) -> Path:
    """``model`` as an untrained Lightning checkpoint at ``path`` (no fit: the weights as built)."""
    trainer = tiny_trainer(path.parent, max_steps=0)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(path)
    return path


def end_distributed_run() -> None:
    """The last line of a multi-process run script, once its results are on disk: every rank
    meets, the process groups go, and the process leaves without interpreter finalization.
    Gloo's and the TCP store's C++ threads can still be unwinding then, and on a loaded machine
    that aborted rank zero (SIGABRT, "terminate called without an active exception") after every
    result was written, failing the test on its exit code alone."""
    import sys

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture
def make_datamodule():
    """``tiny_datamodule``: ``make_datamodule(batch_size=16)`` states only what differs."""
    return tiny_datamodule


@pytest.fixture
def make_trainer(tmp_path):
    """``tiny_trainer`` writing under the test's ``tmp_path``: ``make_trainer(max_steps=2, callbacks=[...])``."""

    def make(**overrides) -> L.Trainer:
        return tiny_trainer(tmp_path, **overrides)

    return make


def knn_of_checkpoint(path: Path, root: Path) -> float:
    """``val/knn_top1`` of a tiny-config checkpoint probed in one process, on the data the
    two-process tests (DDP, FSDP) train on: 192 training and 64 held-out generated shapes."""
    model = IJEPA.load_from_checkpoint(path, weights_only=True)
    data = tiny_datamodule(train_size=192, val_size=64)
    trainer = tiny_trainer(root, callbacks=[KNNProbe()])
    return trainer.validate(model, datamodule=data, verbose=False)[0]["val/knn_top1"]
