"""Checkpoint files and their adaptation, in one place.

* Atomic writes: :class:`AtomicCheckpointIO`, Lightning's checkpoint IO that writes to a temporary
  file and renames it, so a checkpoint file is either the old one or the complete new one
  (:func:`stale_temporaries` finds what an interrupted save left behind).
* Resolution change: :func:`resize_state_dict` adapts a whole model's state dict saved at one
  image or patch size to a model built at another (each position encoding resizes its own
  tensors, patch kernels follow FlexiViT), and :func:`resize_optimizer_states` maps the AdamW
  moments of the resized parameters the same way, so ``fit`` can continue.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
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
        atomic_save(checkpoint, path)


def atomic_save(obj: Any, path) -> None:
    """``torch.save(obj, path)`` through :func:`temporary_path`: written, flushed to disk, then
    renamed over ``path`` (``os.replace`` is atomic on one filesystem), so ``path`` is always
    either its old content or the complete new one. Creates the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    try:
        with open(temporary, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


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
