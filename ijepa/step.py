"""One I-JEPA step as the official code splits it: the target branch and the context branch.

``IJEPA.predict`` calls :func:`forward_target` then :func:`forward_context` (in that order: only
the context branch draws random numbers, for stochastic depth); the packed native-resolution
batch has its own pair. Both fill one :class:`StepOutput`, the record the loss, the objectives
(:mod:`ijepa.objectives`) and the monitors read; the targets (which blocks, how normalised) and
the step's patch size are decided here too. Shapes: ``B`` images (or clips), ``R`` mask sets per
image (``data.masks_per_image``; mask row ``r * B + i`` masks image ``i``), ``M`` target blocks
of ``Kt`` patches, contexts of ``Kc`` patches, ``N`` patches per image, width ``D``, target width
``D'`` (``k * D`` for ``k`` target levels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ijepa.nn.packing import instance_norm_per_image, pooled_per_image
from ijepa.nn.patch import gather_patches

LOSSES = ("smooth_l1", "mse")
TARGET_NORMS = ("layer", "instance")


def normalize_targets(features: torch.Tensor, kind: str = "layer", eps: float = 1e-5) -> torch.Tensor:
    """Target features ``[B, N, D]`` normalised for the loss: ``layer`` over each token's ``D``
    features (I-JEPA), ``instance`` over each feature's ``N`` tokens of one image (data2vec), which
    removes what all of an image's patches share."""
    if kind == "layer":
        return F.layer_norm(features, features.shape[-1:], eps=eps)
    if kind == "instance":
        mean = features.mean(dim=1, keepdim=True)
        var = features.var(dim=1, unbiased=False, keepdim=True)
        return (features - mean) * torch.rsqrt(var + eps)
    raise ValueError(f"target_norm must be one of {TARGET_NORMS}, got {kind!r}.")


@dataclass
class StepOutput:
    """One masked batch through both branches (``IJEPA.predict``).
    Grid batches: ``R * B`` mask rows, ``M`` target blocks of ``Kt`` patches, contexts of ``Kc``;
    packed batches: ``T`` target tokens in all, ``S_c`` context sequences of ``L_c`` slots. ``D'``
    is ``k * D`` with ``k`` target levels (:class:`ijepa.objectives.MultiLevelTargets`, level after level), else ``D``.

    Attributes:
        predictions: ``[R * B, M, Kt, D']`` (packed: ``[T, D]``), the predictor's output.
        targets: the same shape, the normalised target features, without gradient.
        context: ``[R * B, Kc, D]`` (packed: ``[S_c, L_c, D]``), the context encoder's output.
        target_features: ``[B, N, D]``, the target encoder's last block (packed: each image's mean ``[B, D]``).
        context_mask: ``[R * B, Kc]`` (packed: ``[S_c, L_c]``) True for real context tokens; None: all real.
        context_pooled: packed: ``[B, D]``, each image's mean context token; None for grid batches.
        target_mask: ``[R * B, M, Kt]`` True for real target tokens (static shapes); None: all real.
        context_predictions: ``[R * B, Kc, D']``, the predictor's output at the context positions
            (per_block: the mean over blocks), when an objective asked for it.
        context_targets: ``[R * B, Kc, D']``, the normalised targets at the context positions, then.
        context_indices, target_indices: the batch's ``[R * B, Kc]`` and ``[R * B, M, Kt]``.
        grid: the token grid of the indices, ``(H', W')`` or ``(T', H', W')``.
        images: the batch's images ``[B, C, H, W]`` (clips ``[B, C, T, H, W]``), as the target encoder saw them.
        predictor_hidden: ``[R * B, M, Kt, Dp]``, the predictor's last hidden states at the target
            positions (before its output projection), when an objective asked for them.
    """

    predictions: torch.Tensor
    targets: torch.Tensor
    context: torch.Tensor
    target_features: torch.Tensor
    context_mask: torch.Tensor | None = None
    context_pooled: torch.Tensor | None = None
    target_mask: torch.Tensor | None = None
    context_predictions: torch.Tensor | None = None
    context_targets: torch.Tensor | None = None
    context_indices: torch.Tensor | None = None
    target_indices: torch.Tensor | None = None
    grid: tuple[int, ...] | None = None
    images: torch.Tensor | None = None
    predictor_hidden: torch.Tensor | None = None


def target_blocks(objectives, depth: int) -> list[int]:
    """The target-encoder blocks (1-based) of the targets: the last one unless an objective says
    otherwise (two that do must agree)."""
    chosen = {tuple(b) for b in (member.target_blocks(depth) for member in objectives) if b is not None}
    if len(chosen) > 1:
        raise ValueError(f"model.objectives choose different target blocks: {sorted(chosen)}; keep one.")
    return list(chosen.pop()) if chosen else [depth]


def step_targets(encoder, images: torch.Tensor, blocks: list[int], last_blocks: int, norm: str, **kwargs):
    """``(target_features [B, N, D], normed [B, N, k * D])`` of the target encoder on ``images``:
    its last block, and the normalised targets of the ``k`` levels ``blocks`` side by side (one
    level: the last block, or the average of the last ``last_blocks``, as I-JEPA / data2vec)."""
    depth = len(encoder.transformer.blocks)
    if len(blocks) == 1 and blocks[0] == depth:
        if last_blocks == 1:  # the encoder's own forward (compiled with model.compile)
            features = encoder(images, **kwargs)
            return features, normalize_targets(features, norm)
        outputs = encoder.block_outputs(images, last_blocks, **kwargs)
        return outputs[-1], torch.stack([normalize_targets(b, norm) for b in outputs]).mean(0)
    if last_blocks != 1:
        raise ValueError("multi-level targets (ijepa.objectives.MultiLevelTargets) take model.target_last_blocks=1.")
    outputs = encoder.block_outputs(images, depth - min(blocks) + 1, **kwargs)  # blocks min(blocks) .. depth
    levels = [normalize_targets(outputs[block - min(blocks)], norm) for block in blocks]
    return outputs[-1], torch.cat(levels, dim=-1)


def mask_repeats(num_images: int, context_indices: torch.Tensor, target_indices: torch.Tensor) -> int:
    """``R``, the mask sets per image of a batch of ``num_images`` with ``context_indices [R * B,
    Kc]`` and ``target_indices [R * B, M, Kt]``; a ValueError when the rows are not a whole multiple."""
    rows = target_indices.size(0)
    if rows < num_images or rows % num_images or context_indices.size(0) != rows:
        raise ValueError(
            f"the batch's masks ({context_indices.size(0)} context and {rows} target rows) must be a "
            f"whole multiple of its {num_images} images (data.masks_per_image)."
        )
    return rows // num_images


def repeat_rows(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """``[B, ...] -> [R * B, ...]``, row ``r * B + i`` a copy of row ``i`` (the masks' order)."""
    return x if repeats == 1 else x.repeat(repeats, *(1,) * (x.dim() - 1))


@torch.no_grad()
def forward_target(
    network: torch.nn.Module,
    images: torch.Tensor,
    context_indices: torch.Tensor,
    target_indices: torch.Tensor,
    levels: list[int],
    last_blocks: int,
    norm: str,
    with_context: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The target branch, without gradient: ``network`` (the EMA target encoder, or a teacher) on
    every patch of ``images [B, C, H, W]`` (clips ``[B, C, T, H, W]``) once, its blocks ``levels``
    normalised (``norm``: ``layer`` or ``instance``; ``last_blocks`` > 1 averages the last blocks),
    then gathered per mask row. Returns ``target_features [B, N, D]`` (the last block before the
    norm, for monitors), ``targets [R * B, M, Kt, D']`` and, ``with_context``, the targets at the
    context positions ``[R * B, Kc, D']`` (else None). ``kwargs`` go to ``network``
    (``frame_times``, ``patch_size``)."""
    rows, num_blocks, num_targets = target_indices.shape
    features, normed = step_targets(network, images, levels, last_blocks, norm, **kwargs)
    normed = repeat_rows(normed, rows // images.size(0))  # [R * B, N, D']
    targets = gather_patches(normed, target_indices.flatten(1)).view(rows, num_blocks, num_targets, -1)
    return features, targets, gather_patches(normed, context_indices) if with_context else None


def forward_context(
    encoder: torch.nn.Module,
    predictor: torch.nn.Module,
    images: torch.Tensor,
    context_indices: torch.Tensor,
    target_indices: torch.Tensor,
    context_mask: torch.Tensor | None = None,
    target_mask: torch.Tensor | None = None,
    with_context: bool = False,
    frame_times: torch.Tensor | None = None,
    patch_size: int | None = None,
    grid: tuple[int, ...] | None = None,
    context_view=None,
    with_hidden: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The context branch, with gradient: ``encoder`` on each mask row's context patches
    (``images`` ``[B, ...]`` repeated to the ``R * B`` rows, then through ``context_view``, e.g.
    recoloured, when given), then ``predictor`` from that context to the target positions.
    Returns ``context [R * B, Kc, D]``, ``predictions [R * B, M, Kt, D']``, with ``with_context``
    the predictions at the context positions ``[R * B, Kc, D']`` and with ``with_hidden`` the
    predictor's hidden states at the targets ``[R * B, M, Kt, Dp]`` (else None each).
    ``context_mask [R * B, Kc]`` / ``target_mask [R * B, M, Kt]`` mark real tokens of padded
    masks; ``frame_times [B, T']`` are a clip's temporal positions; a FlexiViT batch gives its
    ``patch_size`` and the predictor's token ``grid``."""
    repeats = target_indices.size(0) // images.size(0)
    times = {} if frame_times is None else {"frame_times": repeat_rows(frame_times, repeats)}
    flexi = {} if patch_size is None else {"patch_size": patch_size}
    views = repeat_rows(images, repeats)
    views = views if context_view is None else context_view(views)
    context = encoder(views, context_indices, token_mask=context_mask, **times, **flexi)
    predictions = predictor(
        context,
        context_indices,
        target_indices,
        context_mask=context_mask,
        target_mask=target_mask,
        with_context=with_context,
        **times,
        **({} if grid is None else {"grid": grid}),
        **({"with_hidden": True} if with_hidden else {}),
    )
    if not (with_context or with_hidden):
        return context, predictions, None, None
    predictions, *extra = predictions
    context_predictions = extra.pop(0) if with_context else None
    return context, predictions, context_predictions, extra[0] if with_hidden else None


@torch.no_grad()
def forward_target_packed(network: torch.nn.Module, full, target_slot: torch.Tensor, num_images: int, norm: str):
    """The target branch of a native-resolution batch: ``network.forward_packed`` on the packed
    ``full`` images ``[S_f, L_f, D]``, normalised per token (``layer``) or per image
    (``instance``, wherever the packing put its tokens). Returns ``targets [T, D]`` (the slots
    ``target_slot`` names, ``-1`` for none) and each image's mean feature ``[B, D]``."""
    features = network.forward_packed(full)
    if norm == "layer":
        normed = normalize_targets(features, "layer")
    else:  # over each image's own tokens, wherever the packing put them
        normed = instance_norm_per_image(features, full.image_ids, num_images)
    targets = normed.flatten(0, 1)[target_slot[target_slot >= 0]]
    return targets, pooled_per_image(features, full.image_ids, num_images)


def forward_context_packed(encoder, predictor, context, layout, context_slot, target_slot):
    """The context branch of a native-resolution batch: ``encoder.forward_packed`` on the packed
    ``context`` sequences ``[S_c, L_c, D]``, then the predictor's packed ``layout`` from the
    ``context_slot`` tokens to the ``target_slot`` ones. Returns the context encoder's output
    ``[S_c, L_c, D]`` and ``predictions [T, D']``."""
    tokens = encoder.forward_packed(context)
    return tokens, predictor.forward_packed(tokens, layout, context_slot, target_slot)


def prediction_loss(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    loss: str = "smooth_l1",
    reduction: str = "mean",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The JEPA loss (``loss``: smooth L1 or MSE) between ``predictions`` and ``targets``, in
    float32. With ``mask [R * B, M, Kt]`` (static shapes: False for padded target slots) the mean
    over the real slots' values only."""
    loss_fn = F.mse_loss if loss == "mse" else F.smooth_l1_loss
    if mask is None:
        return loss_fn(predictions.float(), targets.float(), reduction=reduction)
    if reduction != "mean":
        raise ValueError(
            f"a target mask gives the mean over its real slots: reduction must be 'mean', got {reduction!r}."
        )
    per_value = loss_fn(predictions.float(), targets.float(), reduction="none")  # [R * B, M, Kt, D']
    weights = mask.to(per_value.dtype)[..., None]
    return (per_value * weights).sum() / (weights.sum() * per_value.size(-1))


def step_patch_size(patch_size, model_patch_size: int, num_frames: int) -> dict[str, int]:
    """``{"patch_size": p}`` for a batch cut at another patch size than the model's (FlexiViT:
    ``GridBatch.patch_size``), else ``{}``."""
    if patch_size is None or int(patch_size) == model_patch_size:
        return {}
    if num_frames:
        raise ValueError("per-batch patch sizes (data.train_patch_sizes) are for image models, not clips.")
    return {"patch_size": int(patch_size)}
