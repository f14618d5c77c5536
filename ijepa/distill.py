"""``ijepa distill``: a student ViT trained against a frozen teacher encoder.

The default objective is the JEPA step with the frozen teacher as the target encoder and no
EMA (how V-JEPA 2.1 makes its smaller models): the student encodes the context block, its
predictor predicts the teacher's normalised features of the target blocks. ``features`` is
plain feature matching instead: the student sees every patch and a linear head maps each of its
tokens to the teacher's token at the same position.

The student may differ from the teacher in width, depth, heads, patch size and position
encoding; the two must share the token grid (``image_size / patch_size`` per side). A teacher
with another patch size runs at ``teacher_image_size`` (its positions adapted as on any load at
another resolution) on the student's images resized to it.

A student's checkpoint is an ordinary :class:`~ijepa.module.IJEPA` checkpoint whose target
encoder is the student itself (kept equal to it after every step), with ``target_dim`` the
teacher's width (in its hyperparameters, however the student was built) and the teacher under
``distill.*``: ``ijepa eval``, ``ijepa convert`` and ``IJEPA.load_from_checkpoint`` read the
student; ``ijepa distill --ckpt_path`` resumes it and ``ijepa distill validate --ckpt_path``
validates it (a plain model refuses to fit or validate it: its loss needs the teacher). The
checkpoint's ``distillation`` record names the teacher: its path and the SHA-256 of its weights
(:func:`weights_sha256`); a resume with another teacher is refused (the checkpoint's teacher
weights would keep teaching under the new one's name).
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.checkpoint import load_adapted, refuse_to_load_non_finite
from ijepa.data.batch import GridBatch, PackedBatch
from ijepa.interop.encoder import load_encoder, read_torch_file
from ijepa.interop.huggingface import load_hf
from ijepa.interop.ijepa_model import ijepa_from_encoder
from ijepa.interop.official import NETWORKS
from ijepa.legacy import upgrade_hparams
from ijepa.module import IJEPA
from ijepa.nn.checks import check_range
from ijepa.nn.vit import DropPath, VisionTransformer
from ijepa.step import StepOutput, step_targets, target_blocks
from ijepa.teachers import teacher_from_config

OBJECTIVES = ("jepa", "features")


def weights_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's tensors: each name, dtype, shape and value, in sorted name order.
    A teacher's identity: the same weights give the same digest at any path, in any file."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        value = state_dict[name]
        if not torch.is_tensor(value):
            continue
        value = value.detach().cpu().contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy())  # the bytes, not copied
    return digest.hexdigest()


def checked_teacher(network: VisionTransformer, source: str | Path, prefix: str = "") -> str:
    """The SHA-256 of a teacher's weights as read (:func:`weights_sha256`), after refusing
    non-finite ones in one line naming the file and the tensors (``prefix``: their names there)."""
    state = network.state_dict()
    refuse_to_load_non_finite({"state_dict": {prefix + k: v for k, v in state.items()}}, f"teacher={str(source)!r}")
    return weights_sha256(state)


def read_teacher(
    source: str | Path, encoder: str = "target", image_size: int | None = None
) -> tuple[VisionTransformer, str, str]:
    """The frozen encoder of a teacher, how it was read and the SHA-256 of its weights as stored
    (:func:`weights_sha256`, at its own resolution): an ``ijepa`` checkpoint (its ``encoder``:
    ``target`` or ``online``), or a Hugging Face ``IJepaModel`` folder (an official checkpoint:
    after ``ijepa convert SOURCE teacher.ckpt ckpt``). Non-finite weights are refused, naming
    the tensors. ``image_size`` (None: the teacher's own) rebuilds it at another resolution, its
    weights adapted as on any load there (:func:`ijepa.checkpoint.load_adapted`: learned tables
    interpolated, sin-cos and RoPE rebuilt)."""
    path = Path(source)
    if encoder not in ("target", "online"):
        raise ValueError(f"teacher_encoder must be 'target' or 'online', got {encoder!r}.")
    if path.is_dir():
        network, kind = load_hf(path), "Hugging Face folder"
        digest = checked_teacher(network, source)
        if image_size in (None, network.patch_embed.image_size):
            return network.requires_grad_(False), kind, digest
        model = ijepa_from_encoder(network)
        hparams, state = dict(model.hparams), model.state_dict()
    elif path.is_file():
        saved = read_torch_file(path, "teacher checkpoint")
        if isinstance(saved, dict) and all(name in saved for name in NETWORKS):
            raise ValueError(
                f"teacher={str(source)!r} is an official I-JEPA checkpoint: convert it first "
                "(ijepa convert SOURCE teacher.ckpt ckpt --num_heads 16 --predictor_num_heads 16) and give teacher.ckpt."
            )
        if not (isinstance(saved, dict) and "state_dict" in saved and "hyper_parameters" in saved):
            raise ValueError(
                f"teacher={str(source)!r} is not an ijepa checkpoint (state_dict, hyper_parameters) nor a "
                "Hugging Face folder."
            )
        kind = "ijepa checkpoint"
        if saved["hyper_parameters"].get("num_frames"):
            raise ValueError(f"teacher={str(source)!r} is a clip encoder; ijepa distill takes image encoders.")
        network = load_encoder(path, encoder)
        digest = checked_teacher(network, source, "target_encoder." if encoder == "target" else "encoder.")
        if image_size in (None, saved["hyper_parameters"].get("image_size")):
            return network, kind, digest
        hparams = {k: v for k, v in upgrade_hparams(saved["hyper_parameters"]).items() if not k.startswith("_")}
        state = {k: v for k, v in saved["state_dict"].items() if not k.startswith("distill.")}
    else:
        raise FileNotFoundError(f"teacher={str(source)!r} does not exist.")
    model = IJEPA(**{**hparams, "image_size": image_size})
    load_adapted(model, {"state_dict": state, "hyper_parameters": hparams}, **model.position_interpolation)
    network = model.target_encoder if encoder == "target" else model.encoder
    return network.eval().requires_grad_(False), kind, digest


class Resized(nn.Module):
    """A frozen encoder fed the student's images resized to its own ``image_size`` (bilinear,
    antialiased), so that both see one picture on one token grid."""

    def __init__(self, network: VisionTransformer, image_size: int):
        super().__init__()
        self.network, self.image_size = network, image_size

    @property
    def transformer(self) -> nn.Module:
        return self.network.transformer

    def resize(self, images: torch.Tensor) -> torch.Tensor:
        size = (self.image_size, self.image_size)
        return F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)

    def forward(self, images: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.network(self.resize(images), **kwargs)

    def block_outputs(self, images: torch.Tensor, *args, **kwargs) -> list[torch.Tensor]:
        return self.network.block_outputs(self.resize(images), *args, **kwargs)


class DistillIJEPA(IJEPA):
    """An :class:`~ijepa.module.IJEPA` student whose targets come from a frozen teacher.

    Args:
        teacher: the teacher: an ``ijepa`` checkpoint (``.ckpt``: a run's, or an official
            checkpoint after ``ijepa convert ... ckpt``) or a Hugging Face ``IJepaModel`` folder.
        teacher_encoder: which encoder of an ``ijepa`` checkpoint teaches: ``target`` (EMA) or ``online``.
        teacher_image_size: the side the teacher sees (null: its own). The teacher's grid there
            must be the student's (``image_size / patch_size``); the student's images are resized to it.
        objective: ``jepa`` (the student's context predicts the teacher's target blocks, through
            the predictor) or ``features`` (every student token, through a linear head, matches
            the teacher's token at its position; the predictor is not trained).
        kwargs: the student's options, as ``ijepa fit``'s ``model.*`` (``target_dim`` is the teacher's width).
    """

    target_by_ema = False  # a changed objective on resume is caught by the checkpoint's "distillation" record
    # Hyperparameters the teacher sets: the CLI takes them from this run's teacher, not from a
    # resumed checkpoint (whose other teacher check_same_teacher then names).
    SET_BY_TEACHER = ("target_dim",)

    def __init__(
        self,
        teacher: str | None = None,
        teacher_encoder: Literal["target", "online"] = "target",
        teacher_image_size: int | None = None,
        objective: Literal["jepa", "features"] = "jepa",
        **kwargs,
    ):
        if teacher is None:
            raise ValueError("teacher is required: an ijepa checkpoint or a Hugging Face IJepaModel folder.")
        if teacher_image_size is not None:
            check_range(teacher_image_size, "teacher_image_size", 1)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}.")
        policy = kwargs.get("teacher_policy")
        if policy is not None and not teacher_from_config(copy.deepcopy(policy)).by_ema:
            raise ValueError(
                f"teacher_policy={teacher_from_config(copy.deepcopy(policy))!r}: ijepa distill's teacher is "
                "model.teacher (frozen, read from that checkpoint); model.teacher_policy is ijepa fit's. Drop it."
            )
        network, kind, digest = read_teacher(teacher, teacher_encoder, teacher_image_size)
        width = network.embed_dim
        if kwargs.get("target_dim") not in (None, width):
            raise ValueError(
                f"target_dim={kwargs['target_dim']} is not the teacher's width {width}: leave it unset "
                "(ijepa distill sets it)."
            )
        kwargs["target_dim"] = width
        super().__init__(**kwargs)
        hp = self.hparams
        for key in ("teacher", "teacher_encoder", "teacher_image_size", "objective", "kwargs"):
            hp.pop(key, None)  # the checkpoint's hyperparameters stay IJEPA's: a plain model loads the student
        hp["target_dim"] = width  # under the CLI they are its config, where target_dim is unset (None)
        if hp.num_frames or network.is_clip_encoder:
            raise ValueError("ijepa distill takes image encoders: the student (num_frames) and the teacher.")
        if tuple(network.grid) != tuple(self.encoder.grid):
            teacher_patch = network.patch_embed.patch_size
            raise ValueError(
                f"teacher: its patch grid {'x'.join(map(str, network.grid))} (image_size "
                f"{network.patch_embed.image_size} / patch {teacher_patch}) does not align with the student's "
                f"{'x'.join(map(str, self.encoder.grid))} ({hp.image_size} / {hp.patch_size}): set "
                f"teacher_image_size={self.encoder.grid[0] * teacher_patch} (the student's grid times the "
                "teacher's patch), or give the student a patch size that gives the teacher's grid."
            )
        if objective == "features" and self.objectives:
            raise ValueError("objectives (ContextLoss, MultiLevelTargets) need objective 'jepa', not 'features'.")
        depth = len(network.transformer.blocks)
        if not 1 <= hp.target_last_blocks <= depth:
            raise ValueError(f"target_last_blocks must be in [1, {depth}] (the teacher's depth).")
        self.target_blocks = target_blocks(self.objectives, depth)  # the teacher's blocks
        if network.patch_embed.image_size != hp.image_size:
            network = Resized(network, network.patch_embed.image_size)
        for module in network.modules():  # a teacher is deterministic in any mode (train() keeps it in eval too)
            if isinstance(module, DropPath):
                module.p = 0.0
        self.distill = nn.ModuleDict({"teacher": network.train(self.training)})
        if objective == "features":
            self.distill["head"] = nn.Linear(hp.embed_dim, width * len(self.target_blocks))
            self.predictor.requires_grad_(False)  # no gradient reaches it: out of the optimizer
        self.distillation = {
            "teacher": str(teacher),
            "teacher_sha256": digest,
            "teacher_kind": kind,
            "teacher_encoder": teacher_encoder,
            "teacher_image_size": network.image_size if isinstance(network, Resized) else hp.image_size,
            "teacher_width": width,
            "teacher_depth": depth,
            "objective": objective,
        }

    @property
    def teacher(self) -> nn.Module:
        return self.distill["teacher"]

    @property
    def target_network(self) -> nn.Module:
        return self.teacher

    def train(self, mode: bool = True) -> DistillIJEPA:
        super().train(mode)
        self.teacher.eval()
        return self

    def predict(self, batch: GridBatch | PackedBatch) -> StepOutput:
        """The JEPA step with the teacher's targets (:meth:`IJEPA.predict`), or with
        ``objective: features`` every student token through the head against the teacher's:
        ``predictions`` and ``targets`` ``[B, 1, N, D_teacher]``, ``context`` the student's ``[B, N, D]``.
        Square batches only."""
        if isinstance(batch, PackedBatch):
            raise ValueError("ijepa distill takes square batches, not native-resolution (packed) ones.")
        if batch.patch_size is not None and int(batch.patch_size) != self.hparams.patch_size:
            raise ValueError("ijepa distill takes one patch size (data.train_patch_sizes is for ijepa fit).")
        if self.distillation["objective"] == "jepa":
            return super().predict(batch)
        hp = self.hparams
        with torch.no_grad():
            features, normed = step_targets(
                self.teacher, batch.images, self.target_blocks, hp.target_last_blocks, hp.target_norm
            )
        tokens = self.encoder(batch.images)  # [B, N, D]
        predictions = self.distill["head"](tokens)
        every = torch.arange(tokens.size(1), device=tokens.device).expand(tokens.size(0), -1)  # [B, N]
        return StepOutput(
            predictions[:, None], normed[:, None], tokens, features,
            context_indices=every, target_indices=every[:, None], grid=tuple(self.encoder.grid),
        )  # fmt: skip

    def jepa_step(self, batch: GridBatch | PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss; outside training also the student's features ``[B, N, D]`` (what the
        monitors read: the student's, not the teacher's)."""
        loss, teacher_features = super().jepa_step(batch)
        if self.training:
            return loss, teacher_features
        with torch.no_grad():
            return loss, self.target_encoder(batch.images)

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # No EMA: the target encoder is the student, so that every reader of it (probes, ijepa
        # eval, convert) reads the student.
        with torch.no_grad():
            torch._foreach_copy_(list(self.target_encoder.parameters()), list(self.encoder.parameters()))

    def on_fit_start(self) -> None:
        moving = [type(cb).__name__ for cb in self.trainer.callbacks if getattr(cb, "updates_target_encoder", False)]
        if moving:
            raise ValueError(
                f"trainer.callbacks: {', '.join(moving)} moves the target encoder, which ijepa distill keeps equal to "
                "the student (its targets are the teacher's): remove it."
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["distillation"] = dict(self.distillation)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint.get("distillation")
        if saved is None:
            raise ValueError(
                "the checkpoint is not a distilled student's (no 'distillation' record): ijepa distill resumes only "
                "its own checkpoints; start from another model's weights with a new run."
            )
        self.check_same_teacher(saved, checkpoint)
        for key in ("teacher_width", "teacher_depth", "objective"):
            if saved.get(key) != self.distillation[key]:
                raise ValueError(
                    f"the checkpoint was distilled with {key}={saved.get(key)!r}, this run has "
                    f"{self.distillation[key]!r}: resume with the checkpoint's teacher and objective."
                )
        super().on_load_checkpoint(checkpoint)

    def check_same_teacher(self, saved: dict, checkpoint: dict) -> None:
        """Refuse to resume a student with a teacher other than the one that taught it: the
        checkpoint's teacher weights (``distill.*``) would keep teaching while its record named
        this run's teacher. The same weights at another path resume. A checkpoint from before
        teacher digests were recorded is compared by the teacher weights it holds."""
        ours, theirs = self.distillation, saved.get("teacher_sha256")
        if theirs is not None:
            same = theirs == ours["teacher_sha256"]
        elif "state_dict" not in checkpoint:  # loaded by a sharded strategy: nothing to compare
            return
        else:
            prefix, current = "distill.teacher.", self.teacher.state_dict()
            held = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
            same = held.keys() == current.keys() and all(
                v.shape == current[k].shape and torch.equal(v.cpu(), current[k].cpu()) for k, v in held.items()
            )
        if same:
            return
        source = f"ckpt_path={str(self.trainer.ckpt_path)!r}" if self._trainer is not None else "the checkpoint"
        raise ValueError(
            f"{source} was distilled from teacher={saved.get('teacher')!r} ({saved.get('teacher_encoder')} encoder, "
            f"weights sha256 {theirs[:12] if theirs else 'not recorded'}), this run's teacher={ours['teacher']!r} "
            f"({ours['teacher_encoder']} encoder, weights sha256 {ours['teacher_sha256'][:12]}) is another model: "
            "the checkpoint's teacher would keep teaching under this one's name. Resume with the checkpoint's "
            "teacher (a copy at any path will do), or start a new run without ckpt_path."
        )
