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
* The model's checkpoint hooks as plain functions: the finite-weight guards
  (:func:`refuse_to_save_non_finite`, :func:`refuse_to_load_non_finite`,
  :func:`non_finite_update`, :func:`resume_advice`), the RNG state (:func:`rng_states`), and
  :func:`adapt_checkpoint` / :func:`load_adapted`, which every path that loads weights at
  another size calls.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ijepa.legacy import upgrade_state_dict
from ijepa.nn.patch import PatchEmbed
from ijepa.nn.position import PositionEncoding
from ijepa.nn.resize import INTERPOLATION_MODES, Grid, Resizer, check_grid, resize_patch_embed_kernel
from ijepa.nn.stem import ConvStem
from ijepa.optim import parameter_order

_TEMPORARY = re.compile(r"^\..+\.tmp-(?P<pid>\d+)$")


def temporary_path(path: Path) -> Path:
    """Where :class:`AtomicCheckpointIO` writes ``path`` before renaming it: a hidden file in the
    same folder, named after the writing process."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def unwritable(folder: Path) -> str | None:
    """Why files cannot be written into ``folder``, or None. Nothing is created: a probe file is
    written into (and removed from) the folder or, if it does not exist yet, the nearest folder
    above it that does, so a read-only mount, missing permissions and a file in the way all show."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        return f"NotADirectoryError: {existing} is a file, not a folder"
    probe = existing / f".ijepa-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


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
    hold a diverging state that is finite but gives NaN at its next step.

    Loading reads tensors only (``weights_only``) whatever the path: a file the run resolved itself
    (``--ckpt_path last``, ``best``, ``hpc``) is never unpickled, and a pickled payload is loaded
    only from ``named_path``, the file the user named, under ``--weights_only false``. A file that
    cannot be read is an error naming an intact earlier checkpoint of its folder.
    """

    def __init__(self, keep_previous: bool = True):
        super().__init__()
        self.keep_previous = keep_previous
        self.named_path: str | None = None  # set by the CLI: the ckpt_path the user typed, if a path

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if "://" in str(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if not Path(path).is_file():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        named = self.named_path is not None and Path(self.named_path).resolve() == Path(path).resolve()
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            if named and weights_only is False:  # the user named this file and said it is trusted
                return torch.load(path, map_location=map_location, weights_only=False)
            how = "name it with --ckpt_path and add --weights_only false" if not named else "add --weights_only false"
            raise ValueError(
                f"{path} holds pickled Python objects besides tensors ({_first_line(error)}); refusing to unpickle "
                f"it{'' if named else ', a file the run found itself'}. If you trust it, {how}."
            ) from None
        except Exception as error:  # truncated, interrupted copy, not a checkpoint at all
            raise ValueError(unreadable_checkpoint(path, error)) from None

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options, got {storage_options!r}.")
        keep = self.keep_previous and Path(path).name.startswith(ModelCheckpoint.CHECKPOINT_NAME_LAST)
        atomic_save(checkpoint, path, keep_previous=keep)


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def unreadable_checkpoint(path, error: BaseException) -> str:
    """The message for a checkpoint that cannot be read, naming the newest intact one beside it."""
    path = Path(path)
    candidates = [p for p in path.parent.glob("*.ckpt") if p.resolve() != path.resolve()]
    intact = None
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            torch.load(candidate, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            continue
        intact = candidate
        break
    advice = f"resume from {intact}, an intact earlier checkpoint" if intact else "no other checkpoint beside it reads"
    return (
        f"cannot read {path} ({type(error).__name__}: {_first_line(error)}): it is truncated or not a Lightning "
        f"checkpoint; {advice}."
    )


SAVE_ADVICE = "point trainer.default_root_dir (or the ModelCheckpoint's dirpath) at a disk with room."


def atomic_save(
    obj: Any, path, keep_previous: bool = False, what: str = "the checkpoint", advice: str = SAVE_ADVICE
) -> None:
    """``torch.save(obj, path)`` through :func:`temporary_path`: written, flushed to disk, then
    renamed over ``path`` (``os.replace`` is atomic on one filesystem), so ``path`` is always
    either its old content or the complete new one. Creates the parent folder. With
    ``keep_previous``, an existing ``path`` stays as :func:`previous_path` (hard-linked).

    A write that fails for want of space (``ENOSPC`` or ``EDQUOT``, or any error while the folder
    has less free space than ``obj`` needs: torch reports some as ``RuntimeError``) raises ``OSError`` naming the folder, its free space
    and the size needed, then ``advice`` (what to point elsewhere; ``what`` names the file); the temporary
    file is removed."""
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
                f"could not write {what} {path} ({type(error).__name__}: {error}): it needs about "
                f"{format_bytes(needed)} and {path.parent} has {format_bytes(free)} free. Free space there, or {advice}"
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
    :class:`~ijepa.nn.PatchEmbed` kernel is resized when the patch size differs (a
    :class:`~ijepa.nn.stem.ConvStem` has no kernel to resize: refused). For clip models
    ``old_grid_size`` is ``(T', H', W')``: ``learned_flat_3d`` tables are resampled trilinearly (over
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
        elif isinstance(module, ConvStem) and old_patch_size != module.patch_size:
            raise ValueError(
                f"patch_size={module.patch_size}: the checkpoint was trained at patch_size={old_patch_size}, and a conv "
                "stem (stem='conv') has one stride-2 convolution per factor of 2 and no kernel to resize: only "
                "image_size can change on load."
            )

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


# --- the model's checkpoint hooks, as functions ----------------------------------------------
def _listed(names: list[str]) -> str:
    return f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"


def refuse_to_save_non_finite(checkpoint: dict, step: int, advice: str) -> None:
    """Never write non-finite weights: ``ModelCheckpoint`` deletes the previous file after a save,
    so a NaN state written once would replace the last finite one."""
    bad = non_finite_tensors(checkpoint["state_dict"])
    if bad:
        raise FloatingPointError(
            f"refusing to write a checkpoint with non-finite weights at step {step} ({len(bad)} tensors: "
            f"{_listed(bad)}). {advice}"
        )


def refuse_to_load_non_finite(checkpoint: dict, source: str = "the checkpoint") -> None:
    """A NaN checkpoint would be scored (validate, test, predict) or trained (fit) without a word."""
    bad = non_finite_tensors(checkpoint.get("state_dict", {}))
    if bad:
        raise ValueError(
            f"{source} holds non-finite weights ({len(bad)} tensor{'s' * (len(bad) > 1)} with NaN or inf: "
            f"{_listed(bad)}); refusing to load it. Use an earlier checkpoint of the run (previous-last.ckpt "
            "beside last.ckpt is the one before the newest)."
        )


def refuse_student_without_teacher(checkpoint: dict, source: str, trainer, has_teacher: bool) -> None:
    """A plain model reads a distilled student's encoders (eval, convert, predict), but to fit or
    validate one its loss needs the teacher, which only ``ijepa distill`` holds."""
    stage = str(getattr(trainer.state.fn, "value", "")) if trainer is not None else ""
    if "distillation" in checkpoint and not has_teacher and stage in ("fit", "validate", "test"):
        raise ValueError(
            f"{source} holds a distilled student (teacher={checkpoint['distillation'].get('teacher')!r}), whose "
            f"loss needs its teacher: run ijepa distill {'' if stage == 'fit' else f'{stage} '}--model.teacher "
            "TEACHER --ckpt_path ..., or score its encoder with ijepa eval."
        )


def refuse_teacher_switch(checkpoint: dict, source: str, teacher_policy: dict, has_teacher_network: bool) -> None:
    """An EMA run's teacher is its target encoder; a frozen or stepwise teacher is a network of its
    own (``teacher_network``). A checkpoint of one read by a model of the other would fail on
    missing or unexpected keys (a frozen teacher's initial weights are not in an EMA checkpoint)."""
    saved = checkpoint.get("hyper_parameters", {}).get("teacher_policy") or {}
    stored = any(key.startswith("teacher_network.") for key in checkpoint.get("state_dict", {}))
    if stored != has_teacher_network:
        saved_name, asked = (str(r.get("class_path", "EMATeacher")).rsplit(".", 1)[-1] for r in (saved, teacher_policy))
        raise ValueError(
            f"{source} was trained with model.teacher_policy={saved_name} and this run "
            f"asks for {asked}: an EMA teacher is the target encoder, a frozen or stepwise one a network "
            "of its own, so a run cannot switch between them. Drop model.teacher_policy to go on with the "
            "checkpoint's, or start a new run."
        )


def rng_states() -> dict:
    """The global RNG states a resumed run restores. The only global randomness of a step is
    stochastic depth; data order, augmentations and masks are seeded per sample
    (:mod:`ijepa.data.sampling`). Tensors only: the checkpoint loads under ``weights_only``."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_states(states: dict | None) -> None:
    """Restore :func:`rng_states` (the CUDA ones only on as many devices as were saved)."""
    if states is None:
        return
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


def resolution_record(hparams) -> dict:
    """What a checkpoint records of the grid it was trained on (``checkpoint["resolution"]``):
    ``load_from_checkpoint`` overwrites the saved hyperparameters with its keyword arguments
    (e.g. ``image_size=96``), so the hyperparameters alone cannot tell."""
    record = {"image_size": hparams["image_size"], "patch_size": hparams["patch_size"]}
    if hparams.get("num_frames"):
        record.update(num_frames=hparams["num_frames"], tubelet_size=hparams["tubelet_size"])
    return record


def saved_grid(checkpoint: dict, hparams) -> tuple[int, int, tuple[int, ...]]:
    """``(image_size, patch_size, grid)`` a checkpoint was trained at (``grid`` is ``(T', H', W')``
    for clip models), defaulting to ``hparams``' own where it does not say."""
    saved = checkpoint.get("resolution") or checkpoint.get("hyper_parameters") or {}
    image = saved.get("image_size", hparams["image_size"])
    patch = saved.get("patch_size", hparams["patch_size"])
    if image % patch != 0:
        raise ValueError(f"checkpoint has image_size={image} not divisible by patch_size={patch}.")
    grid = (image // patch,) * 2
    if hparams.get("num_frames"):
        frames = saved.get("num_frames", hparams["num_frames"])
        tubelet = saved.get("tubelet_size", hparams["tubelet_size"])
        if (patch, tubelet) != (hparams["patch_size"], hparams["tubelet_size"]):
            raise ValueError(
                f"a clip checkpoint can change image_size and num_frames, not the tubelet: it has patch_size={patch}, "
                f"tubelet_size={tubelet}; this model has {hparams['patch_size']}, {hparams['tubelet_size']}."
            )
        grid = (frames // tubelet, *grid)
    return image, patch, grid


def adapt_checkpoint(model: nn.Module, checkpoint: dict, mode: str = "bicubic", antialias: bool = False) -> str:
    """Adapt, in place, a checkpoint of ``model``'s architecture saved at another image or patch
    size (or frame count) to ``model``, before it is loaded; returns a report of what changed
    ("" if nothing).

    ``model`` is an :class:`ijepa.module.IJEPA` (its ``hparams`` and ``encoder.grid``). Keys of
    older checkpoints are renamed (:func:`ijepa.legacy.upgrade_state_dict`); learned position tables of the
    encoders and the predictor are interpolated, patch kernels resized (FlexiViT), sin-cos and
    RoPE rebuilt (:func:`resize_state_dict`); AdamW's moments of resized parameters follow the
    same map, so ``fit`` can continue at the new resolution. Anything else that does not fit
    raises ValueError listing the keys. A checkpoint without ``state_dict`` (a sharded strategy
    has loaded the weights itself) must be at the model's own resolution."""
    hparams = model.hparams
    if mode not in INTERPOLATION_MODES:
        raise ValueError(f"position interpolation mode must be one of {INTERPOLATION_MODES}, got {mode!r}.")
    old_image, old_patch, old_grid = saved_grid(checkpoint, hparams)
    new_grid = tuple(model.encoder.grid)
    if "state_dict" not in checkpoint:
        if (old_image, old_patch, tuple(old_grid)) != (hparams["image_size"], hparams["patch_size"], new_grid):
            raise ValueError(
                f"the checkpoint was trained at image_size={old_image}, patch_size={old_patch} (grid {list(old_grid)}); "
                f"this sharded run is at image_size={hparams['image_size']}, patch_size={hparams['patch_size']}. "
                "A sharded strategy loads weights before they can be adapted: adapt the checkpoint in one process "
                "first (IJEPA.load_from_checkpoint(path, image_size=..., patch_size=...), then save it)."
            )
        return ""
    upgrade_state_dict(checkpoint["state_dict"], hparams.get("regularizers", []))
    if not hasattr(model, "distill"):  # a distilled student read as a plain model: its teacher is not part of it
        for key in [key for key in checkpoint["state_dict"] if key.startswith("distill.")]:
            del checkpoint["state_dict"][key]
    changed = resize_state_dict(model, checkpoint["state_dict"], old_grid, old_patch, mode, antialias)
    if not changed:
        return ""
    resize_optimizer_states(checkpoint, changed, parameter_order(model))
    lines = [f"  {key}: {list(old)} -> {list(new)}" for key, (old, new, _) in changed.items()]
    saved = checkpoint.get("resolution") or checkpoint.get("hyper_parameters") or {}
    frames = f", num_frames={saved.get('num_frames')}" if hparams.get("num_frames") else ""
    new_frames = f", num_frames={hparams['num_frames']}" if hparams.get("num_frames") else ""
    return (
        f"Checkpoint adapted from image_size={old_image}, patch_size={old_patch}{frames} "
        f"(grid {'x'.join(map(str, old_grid))}) to image_size={hparams['image_size']}, "
        f"patch_size={hparams['patch_size']}{new_frames} (grid {'x'.join(map(str, new_grid))}) "
        f"with {mode} interpolation:\n" + "\n".join(lines)
    )


def load_adapted(model: nn.Module, checkpoint: dict, mode: str = "bicubic", antialias: bool = False) -> str:
    """Load a checkpoint's weights into ``model`` at ``model``'s resolution, exactly
    (:func:`adapt_checkpoint`, then a strict ``load_state_dict``); the checkpoint is not changed.
    What every path that loads weights at another size calls (the ``init_checkpoint`` of
    :class:`ijepa.callbacks.PositionEmbeddingInterpolation`, the resolution study)."""
    weights = {key: checkpoint.get(key) for key in ("state_dict", "hyper_parameters", "resolution")}
    weights["state_dict"] = dict(weights["state_dict"])
    refuse_to_load_non_finite(weights)
    report = adapt_checkpoint(model, weights, mode, antialias)
    model.load_state_dict(weights["state_dict"], strict=True)
    return report


# --- the divergence guard's advice ------------------------------------------------------------
def saved_checkpoints(trainer) -> list[tuple[int, str]]:
    """``(global step, path)`` of a run's checkpoints still on disk, newest step first, one per
    step: what its checkpoint callbacks keep (``last.ckpt``, the top-k files), the
    ``previous-last.ckpt`` that :class:`AtomicCheckpointIO` keeps, and the ``ckpt_path`` it
    resumed from. Every one is finite: the model refuses to save or load the others."""
    callbacks = trainer.checkpoint_callbacks if trainer is not None else []
    resumed = trainer.ckpt_path if trainer is not None else None
    paths = []
    for callback in callbacks:
        last = getattr(callback, "last_model_path", "")
        paths += [last, str(previous_path(last)) if last else "", getattr(callback, "best_model_path", "")]
        paths += list(getattr(callback, "best_k_models", {}))
    paths.append(str(resumed) if resumed else "")
    steps = {}
    for path in dict.fromkeys(p for p in paths if p and os.path.isfile(p)):
        try:  # mmap: reads the step, not the tensors
            step = torch.load(path, mmap=True, weights_only=True, map_location="cpu")["global_step"]
        except Exception:
            continue
        steps.setdefault(int(step), path)  # last.ckpt first: it is the one a user resumes
    return sorted(steps.items(), reverse=True)


def resume_advice(saved: list[tuple[int, str]], global_step: int) -> str:
    """Which checkpoint a diverged run should resume from, and how, given
    :func:`saved_checkpoints`."""
    if not saved:
        return "No checkpoint of this run was written: restart with a lower model.optim.lr or longer model.optim.warmup_steps."
    (step, newest), earlier = saved[0], saved[1:]
    # A finite checkpoint can already hold a diverging state (weights grown by an lr that is
    # too high): resumed, even at lr 0, its next step's gradients overflow. So the advice
    # names the checkpoint before the newest one, which AtomicCheckpointIO keeps.
    state = (
        "the state this diverging step started from"
        if step == global_step
        else "finite, but it may already hold the diverging state"
    )
    if not earlier:
        return (
            f"The only checkpoint left, {newest} (step {step}), is {state}; resume it with a lower model.optim.lr "
            "or a longer model.optim.warmup_steps, or restart if it diverges again at once."
        )
    return (
        f"Resume from the checkpoint before the newest, {earlier[0][1]} (step {earlier[0][0]}), with a lower "
        f"model.optim.lr or a longer model.optim.warmup_steps (or precision 32-true / bf16-mixed); the newest, {newest} "
        f"(step {step}), is {state}: resumed, it can give NaN at its next step at any learning rate. If the "
        "one before diverges at once too, the divergence began earlier: restart with a lower model.optim.lr."
    )


def non_finite_update(parameters: list[torch.Tensor], what: str) -> str | None:
    """None if every trainable tensor is finite, else a description: a finite loss can still give
    an update that overflows. One fused norm; its sync costs what the loss check costs."""
    total = torch.nn.utils.get_total_norm(parameters)
    if torch.isfinite(total):
        return None
    bad = sum(not torch.isfinite(p).all() for p in parameters)
    return f"{what} ({bad} of {len(parameters)} trainable tensors hold inf or NaN; total norm {total.item()})"
