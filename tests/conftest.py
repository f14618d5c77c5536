"""Shared by every test: the seed and thread count, the tiny model and config, the ``slow`` marker.

Tests are laid out like the package (``tests/nn`` for ``ijepa/nn``, ``tests/data`` for
``ijepa/data``, ``tests/callbacks`` for ``ijepa/callbacks``); the rest of ``ijepa/`` is tested at
the top level. ``pytest -m "not slow"`` skips the end-to-end runs (whole ``ijepa fit`` runs, DDP
processes, notebooks) for a quick loop; CI runs everything.
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
from ijepa.data.sources import ShapesSource
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


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Every test starts from the same RNG state; two threads keep CI machines comparable."""
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.set_flush_denormal(False)  # IJEPA.setup turns it on process-wide; start every test from the default
    yield


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


def knn_of_checkpoint(path: Path, root: Path) -> float:
    """``val/knn_top1`` of a tiny-config checkpoint probed in one process, on the data the
    two-process tests (DDP, FSDP) train on: 192 training and 64 held-out generated shapes."""
    model = IJEPA.load_from_checkpoint(path, weights_only=True)
    data = IJEPADataModule(
        source=ShapesSource(train_size=192, val_size=64),
        image_size=32,
        patch_size=8,
        batch_size=32,
        num_workers=0,
        crop_scale=None,
        target_scale=(0.1, 0.15),
        min_keep=2,
    )
    trainer = L.Trainer(
        callbacks=[KNNProbe()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    return trainer.validate(model, datamodule=data, verbose=False)[0]["val/knn_top1"]
