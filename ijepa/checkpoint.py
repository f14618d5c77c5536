"""Checkpoint files and their adaptation, in one place.

* Atomic writes: :class:`AtomicCheckpointIO`, Lightning's checkpoint IO that writes to a temporary
  file and renames it, so a checkpoint file is either the old one or the complete new one
  (:func:`stale_temporaries` finds what an interrupted save left behind); it keeps the version of
  ``last.ckpt`` it replaces as ``previous-last.ckpt`` (:func:`previous_path`), and a save that
  fails for want of space names the folder and the size needed.
* Sizes and contents: :func:`tensor_bytes`, :func:`estimated_checkpoint_bytes` (before any save,
  from the parameter counts), :func:`non_finite_tensors`.
* Resolution change: :func:`resize_state_dict` adapts a whole model's state dict saved at one
  image or patch size to a model built at another (each position encoding resizes its own
  tensors, patch kernels follow FlexiViT), and :func:`resize_optimizer_states` maps the AdamW
  moments of the resized parameters the same way, so ``fit`` can continue.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ijepa.nn.patch import PatchEmbed
from ijepa.nn.position import PositionEncoding
from ijepa.nn.resize import Grid, Resizer, check_grid, resize_patch_embed_kernel

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


def previous_path(path) -> Path:
    """Where :class:`AtomicCheckpointIO` keeps the version of ``path`` that a save replaced:
    ``previous-last.ckpt`` beside ``last.ckpt`` (a prefix, so that Lightning's ``ckpt_path="last"``,
    which matches names starting with ``last``, never picks it)."""
    path = Path(path)
    return path.with_name(f"previous-{path.name}")


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) checkpoint dict: about the size ``torch.save`` writes."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(value) for value in obj)
    return 0


def estimated_checkpoint_bytes(module: nn.Module) -> int:
    """The size of a training checkpoint of ``module`` before its optimizer has any state: every
    tensor of its state dict (both encoders, buffers) plus AdamW's two moments per trainable
    parameter. Global sizes, also for sharded (DTensor) weights: rank 0 writes them whole. The
    allowance of 256 bytes a tensor (its zip record and alignment) and 64 kB for the rest (loops,
    RNG, hyperparameters) keeps it above the files written (tiny test model: 0.68 MB for 0.64 MB)."""
    state = module.state_dict()
    trainable = [p for p in module.parameters() if p.requires_grad]
    moments = 2 * sum(p.numel() * p.element_size() for p in trainable)
    return tensor_bytes(state) + moments + 256 * (len(state) + 2 * len(trainable)) + 65_536


def non_finite_tensors(state_dict: dict[str, Any]) -> list[str]:
    """Names of the floating-point tensors of ``state_dict`` that hold a NaN or an inf."""
    return [
        name
        for name, value in state_dict.items()
        if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all()
    ]


def format_bytes(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} bytes"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` that writes local checkpoints to a temporary file in the
    same folder, flushes it to disk and renames it over the target (``os.replace`` is atomic on
    one filesystem). A crash or preemption mid-save leaves the previous checkpoint intact.
    Remote paths (``s3://`` ...) fall back to Lightning's own writer.

    With ``keep_previous`` (default), a save that replaces ``ModelCheckpoint``'s ``last.ckpt``
    keeps the version it replaces as ``previous-last.ckpt`` (a hard link: nothing is copied, but
    that state stays on disk). The divergence guard names it: the newest checkpoint can already
    hold a diverging state that is finite but gives NaN at its next step."""

    def __init__(self, keep_previous: bool = True):
        super().__init__()
        self.keep_previous = keep_previous

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options, got {storage_options!r}.")
        keep = self.keep_previous and Path(path).name.startswith(ModelCheckpoint.CHECKPOINT_NAME_LAST)
        atomic_save(checkpoint, path, keep_previous=keep)


def atomic_save(obj: Any, path, keep_previous: bool = False) -> None:
    """``torch.save(obj, path)`` through :func:`temporary_path`: written, flushed to disk, then
    renamed over ``path`` (``os.replace`` is atomic on one filesystem), so ``path`` is always
    either its old content or the complete new one. Creates the parent folder. With
    ``keep_previous``, an existing ``path`` stays as :func:`previous_path` (hard-linked).

    A write that fails for want of space (``ENOSPC`` or ``EDQUOT``, or any error while the folder
    has less free space than ``obj`` needs: torch reports some as ``RuntimeError``) raises ``OSError`` naming the folder, its free space
    and the size needed; the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    try:
        with open(temporary, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.is_file():
            _link_previous(path)
        os.replace(temporary, path)
    except (OSError, RuntimeError) as error:
        temporary.unlink(missing_ok=True)
        needed = tensor_bytes(obj)
        free = shutil.disk_usage(path.parent).free
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or free < needed:
            raise OSError(
                f"could not write the checkpoint {path} ({type(error).__name__}: {error}): it needs about "
                f"{format_bytes(needed)} and {path.parent} has {format_bytes(free)} free. Free space there, or point "
                "trainer.default_root_dir (or the ModelCheckpoint's dirpath) at a disk with room."
            ) from error
        raise
    finally:
        temporary.unlink(missing_ok=True)


def _link_previous(path: Path) -> None:
    previous = previous_path(path)
    link = temporary_path(previous)
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)
    except OSError:  # a filesystem without hard links: keep nothing rather than copy every save
        return
    os.replace(link, previous)


def resize_state_dict(
    model: nn.Module,
    state_dict: dict[str, torch.Tensor],
    old_grid_size: Grid,
    old_patch_size: int,
    mode: str = "bicubic",
    antialias: bool = False,
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], Resizer]]:
    """Adapt, in place, a state dict saved at ``old_grid_size`` / ``old_patch_size`` to ``model``.

    Every :class:`~ijepa.nn.PositionEncoding` in ``model`` resizes its own grid-dependent
    tensors (``learned`` as a 2D grid, ``learned_2d`` per axis, ``relative_bias`` over the new
    offsets; sin-cos and RoPE need nothing: they are rebuilt for the model's grid), and every
    :class:`~ijepa.nn.PatchEmbed` kernel is resized when the patch size differs. For clip models
    ``old_grid_size`` is ``(T', H', W')``: ``learned_3d`` tables are resampled trilinearly (over
    time and space), ``sincos_3d`` and ``mrope`` are rebuilt.

    Returns ``{key: (old_shape, new_shape, resizer)}`` for every tensor it changed (the resizer
    lets a caller apply the same map to, e.g., optimizer moments). Raises ValueError listing the
    keys that are missing, unexpected or still mismatched: never a silent partial load.
    """
    old_grid_size = check_grid(old_grid_size, "old_grid_size", dims=(2, 3))
    changed: dict[str, tuple[tuple[int, ...], tuple[int, ...], Resizer]] = {}

    def apply(key: str, resizer: Resizer) -> None:
        before = state_dict[key]
        state_dict[key] = resizer(before)
        if state_dict[key].shape != before.shape or not torch.equal(state_dict[key], before):
            changed[key] = (tuple(before.shape), tuple(state_dict[key].shape), resizer)

    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, PositionEncoding):
            for local, resizer in module.state_resizers(old_grid_size, mode, antialias).items():
                if prefix + local in state_dict:
                    apply(prefix + local, resizer)
        elif isinstance(module, PatchEmbed) and old_patch_size != module.patch_size:
            key = prefix + "proj.weight"
            if key in state_dict:
                apply(key, lambda w, p=module.patch_size: resize_patch_embed_kernel(w, p))

    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(state_dict))
        if state_dict[k].shape != expected[k].shape
    ]
    if missing or unexpected or mismatched:
        lines = []
        if mismatched:
            lines.append("mismatched shapes:\n  " + "\n  ".join(mismatched))
        if missing:
            lines.append("missing from the checkpoint:\n  " + "\n  ".join(missing))
        if unexpected:
            lines.append("not in the model:\n  " + "\n  ".join(unexpected))
        raise ValueError(
            "the checkpoint does not fit this model's architecture (only the image size, patch size "
            "and grid-dependent position tables can be adapted):\n" + "\n".join(lines)
        )
    return changed


def resize_optimizer_states(
    checkpoint: dict, changed: dict[str, tuple[tuple[int, ...], tuple[int, ...], Resizer]], parameter_order: list[str]
) -> None:
    """Map, in place, the optimizer moments of every parameter :func:`resize_state_dict` changed.

    ``parameter_order`` names the parameters in the order the optimizer holds them (its state is
    keyed by that index). Each moment of a resized parameter gets the parameter's own (linear)
    map; the second moment ``exp_avg_sq`` is clamped at 0 since bicubic weights can be negative.
    Approximate, but it keeps the step count and the scale, unlike resetting the moments."""
    states = checkpoint.get("optimizer_states") or []
    if not states:
        return
    state = states[0].get("state", {})
    for index, name in enumerate(parameter_order):
        if name not in changed or index not in state:
            continue
        old_shape, _, resizer = changed[name]
        for moment, value in state[index].items():
            if torch.is_tensor(value) and tuple(value.shape) == old_shape:
                value = resizer(value)
                state[index][moment] = value.clamp_min(0) if moment == "exp_avg_sq" else value
