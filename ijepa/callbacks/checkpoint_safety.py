"""Checkpoint safety around a run: a writable folder before any work, a checkpoint on SIGTERM.

Both are on in every ``ijepa`` CLI run (``checkpoint_folder`` and ``preemption`` in the config).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ijepa.checkpoint import stale_temporaries


class CheckpointFolderCheck(Callback):
    """Before ``fit`` trains anything: every ``ModelCheckpoint`` folder exists and can be written
    (else ``OSError`` naming it, instead of a failure at the first save, after the work), and
    partial files left there, or beside ``ckpt_path``, by an interrupted save are removed with a
    warning. Rank 0 checks (it writes the checkpoints) and every rank raises the same error."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        problem = None
        if trainer.is_global_zero:
            folders = [
                Path(c.dirpath) for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath
            ]
            problem = next(filter(None, map(_unwritable, folders)), None)
            if problem is None:
                folders += [Path(trainer.ckpt_path).parent] if trainer.ckpt_path else []
                for path in {p for folder in folders for p in stale_temporaries(folder)}:
                    path.unlink(missing_ok=True)
                    rank_zero_warn(f"removed a partial checkpoint left by an interrupted save: {path}")
        problem = trainer.strategy.broadcast(problem)
        if problem:
            raise OSError(problem)


def _unwritable(folder: Path) -> str | None:
    probe = folder / ".ijepa-write-test"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return (
            f"cannot write checkpoints to {folder} ({type(error).__name__}: {error}); point "
            f"trainer.default_root_dir (or the ModelCheckpoint's dirpath) at a writable folder."
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
