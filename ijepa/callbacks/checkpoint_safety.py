"""Checkpoint safety around a run: a writable folder with room before any work, a checkpoint on SIGTERM.

Both are on in every ``ijepa`` CLI run (``checkpoint_folder`` and ``preemption`` in the config).
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ijepa.checkpoint import (
    AtomicCheckpointIO,
    estimated_checkpoint_bytes,
    format_bytes,
    stale_temporaries,
    unwritable,
)


class CheckpointFolderCheck(Callback):
    """Before ``fit`` trains anything: every ``ModelCheckpoint`` folder exists and can be written
    (else ``OSError`` naming it, instead of a failure at the first save, after the work), and
    partial files left there, or beside ``ckpt_path``, by an interrupted save are removed with a
    warning. Rank 0 checks (it writes the checkpoints) and every rank raises the same error.

    With ``check_free_space`` each folder must also have room for the files its callbacks may
    keep at once: ``save_top_k`` (at least one), ``last.ckpt`` and the ``previous-last.ckpt``
    that :class:`~ijepa.checkpoint.AtomicCheckpointIO` keeps, plus the temporary file of the save
    in progress, each of :func:`~ijepa.checkpoint.estimated_checkpoint_bytes` (or of ``ckpt_path``
    if larger). Turn it off for filesystems whose free space is not what limits writes (quotas)."""

    def __init__(self, check_free_space: bool = True):
        self.check_free_space = check_free_space

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        problem = None
        if trainer.is_global_zero:
            callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
            folders = [Path(c.dirpath) for c in callbacks]
            problem = next(filter(None, map(_unwritable, folders)), None)
            if problem is None and self.check_free_space:
                problem = _too_little_space(trainer, pl_module, callbacks)
            if problem is None:
                folders += [Path(trainer.ckpt_path).parent] if trainer.ckpt_path else []
                for path in {p for folder in folders for p in stale_temporaries(folder)}:
                    path.unlink(missing_ok=True)
                    rank_zero_warn(f"removed a partial checkpoint left by an interrupted save: {path}")
        problem = trainer.strategy.broadcast(problem)
        if problem:
            raise OSError(problem)


def _unwritable(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)  # the free-space check reads its disk
    except OSError:
        pass  # unwritable() says why
    problem = unwritable(folder)
    if problem is None:
        return None
    return (
        f"cannot write checkpoints to {folder} ({problem}); point trainer.default_root_dir (or the ModelCheckpoint's "
        "dirpath) at a writable folder."
    )


def _too_little_space(trainer: L.Trainer, pl_module: L.LightningModule, callbacks: list[ModelCheckpoint]) -> str | None:
    size = estimated_checkpoint_bytes(pl_module)
    if trainer.ckpt_path and Path(trainer.ckpt_path).is_file():
        size = max(size, Path(trainer.ckpt_path).stat().st_size)
    io = trainer.strategy.checkpoint_io
    keeps_previous = isinstance(io, AtomicCheckpointIO) and io.keep_previous
    files: dict[Path, list[str]] = defaultdict(list)
    for callback in callbacks:
        kept = files[Path(callback.dirpath)]
        if callback.save_top_k != 0:
            # save_top_k=-1 keeps every one: the check can only ask for room for the first
            kept += [f"save_top_k={callback.save_top_k}"] * max(callback.save_top_k, 1)
        if callback.save_last:
            kept += ["last.ckpt"] + (["previous-last.ckpt"] * keeps_previous)
    for folder, kept in files.items():
        count = len(kept) + 1  # the temporary file of the save in progress
        free = shutil.disk_usage(folder).free
        if free < count * size:
            kinds = ", ".join(dict.fromkeys(kept))
            return (
                f"not enough free space for checkpoints in {folder}: {format_bytes(free)} free ({free} bytes), "
                f"{format_bytes(count * size)} needed ({count} files of about {format_bytes(size)}: {kinds}, and the "
                "temporary file of a save); free space there, point trainer.default_root_dir (or the "
                "ModelCheckpoint's dirpath) at a larger disk, or lower save_top_k. "
                "(checkpoint_folder.check_free_space=false skips this check.)"
            )
    return None


class PreemptionCheckpoint(Callback):
    """On SIGTERM, what schedulers send before they stop a job, save a resumable checkpoint.

    Lightning turns the signal into ``SIGTERMException`` between two training steps (under DDP
    on every rank at once); this callback then writes ``filename`` into the ``ModelCheckpoint``
    folder (else ``trainer.default_root_dir``) and logs the ``--ckpt_path`` to resume with. The
    ``ijepa`` command then exits with ``128 + SIGTERM`` (143), so a scheduler sees a failure and
    can requeue. Other exceptions save nothing: a failed step's state is not worth resuming.
    """

    def __init__(self, filename: str = "preempted.ckpt"):
        if not filename.endswith(".ckpt") or "/" in filename:
            raise ValueError(f"filename must be a plain file name ending in .ckpt, got {filename!r}.")
        self.filename = filename

    def path(self, trainer: L.Trainer) -> Path:
        callback = trainer.checkpoint_callback
        folder = (
            callback.dirpath if isinstance(callback, ModelCheckpoint) and callback.dirpath else trainer.default_root_dir
        )
        return Path(folder) / self.filename

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        path = self.path(trainer)
        trainer.save_checkpoint(path)
        rank_zero_info(f"SIGTERM at step {trainer.global_step}: saved {path}; resume with --ckpt_path {path}")
