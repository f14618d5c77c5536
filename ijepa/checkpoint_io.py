"""Atomic checkpoint writes: a checkpoint file is either the old one or the complete new one."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


_TEMPORARY = re.compile(r"^\..+\.tmp-(?P<pid>\d+)$")


def temporary_path(path: Path) -> Path:
    """Where :class:`AtomicCheckpointIO` writes ``path`` before renaming it: a hidden file in the
    same folder, named after the writing process."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def stale_temporaries(folder: Path) -> list[Path]:
    """Partial checkpoints in ``folder`` left by an interrupted save: temporaries whose writer is
    no longer running on this machine."""
    if not folder.is_dir():
        return []
    stale = []
    for path in sorted(folder.iterdir()):
        match = _TEMPORARY.match(path.name)
        if match and not _running(int(match["pid"])):
            stale.append(path)
    return stale


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # no such process, or not a pid this system can have
        return False
    except PermissionError:  # it exists, owned by another user
        pass
    return True


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` that writes local checkpoints to a temporary file in the
    same folder, flushes it to disk and renames it over the target (``os.replace`` is atomic on
    one filesystem). A crash or preemption mid-save leaves the previous checkpoint intact.
    Remote paths (``s3://`` ...) fall back to Lightning's own writer."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options, got {storage_options!r}.")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_path(path)
        try:
            with open(temporary, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
