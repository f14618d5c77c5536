"""Linear segmentation heads on patch tokens, trained as a grid in one pass, and their scores.

DINOv2's linear segmentation protocol: a BatchNorm and a linear (1x1) layer map every patch token
to class logits on the ``h x w`` token grid; the logits are upsampled bilinearly to the mask's
``H x W`` and trained with a per-pixel cross-entropy that skips ignored pixels. A
:class:`SegmentationHeadGrid` holds ``G`` such heads reading one batch of tokens (each from the
same seed), :func:`segmentation_grid_loss` sums their own losses, so each head trains exactly as
it would alone (:class:`~ijepa.classifiers.heads.HeadGridTrainer` with ``loss=``).

The scores are those of mmsegmentation, which DINOv2 reports: each class's intersection and union
summed over every pixel of the split (:func:`confusion_matrices`), IoU = intersection / union,
mIoU the mean over the classes whose union is not empty (present in the target or predicted
somewhere in the split; mmseg's ``nanmean``), pixel accuracy the share of non-ignored pixels
predicted right (mmseg's ``aAcc``). Ignored pixels (:data:`~ijepa.data.batch.IGNORE_INDEX`) count
nowhere. This equals torchmetrics' ``MulticlassJaccardIndex(average="macro", ignore_index=255)``
accumulated over the split (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ijepa.classifiers.heads import LinearHeadGrid
from ijepa.data.batch import IGNORE_INDEX
from ijepa.nn.checks import check_range


class SegmentationHeadGrid(LinearHeadGrid):
    """``num_heads`` linear heads on patch tokens: ``tokens [B, h * w, D] -> logits [H, B, C, h, w]``
    (tokens in row-major order on the ``grid = (h, w)`` token grid). The BatchNorm (without
    affine: it has no parameters, so the heads share it) normalises each channel over the batch's
    tokens, as DINOv2's BatchNorm over the feature map; then one batched matmul, as
    :class:`~ijepa.classifiers.heads.LinearHeadGrid` (whose initialisation it keeps)."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        num_heads: int,
        grid: tuple[int, int],
        batch_norm: bool = True,
        seed: int = 0,
    ):
        super().__init__(in_features, num_classes, num_heads, batch_norm=batch_norm, seed=seed)
        if len(grid) != 2:
            raise ValueError(f"grid must be (rows, columns) of the token grid, got {grid}.")
        for value in grid:
            check_range(value, "grid", 1)
        self.grid = (int(grid[0]), int(grid[1]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows, columns = self.grid
        if tokens.dim() != 3 or tokens.size(1) != rows * columns:
            raise ValueError(
                f"tokens must have shape [B, {rows * columns}, D] (a {rows} x {columns} grid), got {tuple(tokens.shape)}."
            )
        batch = tokens.size(0)
        logits = super().forward(tokens.flatten(0, 1))  # [H, B * K, C]
        return logits.view(len(self.heads), batch, rows, columns, -1).permute(0, 1, 4, 2, 3)


def upsample_logits(logits: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``logits [H, B, C, h, w] -> [H, B, C, *size]``, bilinear (``align_corners=False``, as mmseg's
    ``resize`` of the logits to the label's size)."""
    heads, batch, classes = logits.shape[:3]
    if tuple(logits.shape[-2:]) == tuple(size):
        return logits
    up = F.interpolate(logits.flatten(0, 1), size=tuple(size), mode="bilinear", align_corners=False)
    return up.view(heads, batch, classes, *size)


def interpolation_matrix(size_in: int, size_out: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """``[size_out, size_in]``: 1-D linear interpolation from ``size_in`` to ``size_out`` samples
    (``align_corners=False``); bilinear upsampling of a map ``X [h, w]`` is ``U_h X U_w^T``."""
    eye = torch.eye(size_in, dtype=dtype, device=device).view(size_in, 1, size_in)
    return F.interpolate(eye, size=size_out, mode="linear", align_corners=False).view(size_in, size_out).T.contiguous()


def _up(logits: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``[n, C, h, w] -> [n, C, H * W]``: bilinear upsampling as a GEMM over the columns and a batched
    matmul over the rows (``rows [H, h]``, ``columns [W, w]``: :func:`interpolation_matrix`)."""
    n, classes, h, w = logits.shape
    height, width = rows.size(0), columns.size(0)
    half = (logits.reshape(n * classes * h, w) @ columns.T).view(n * classes, h, width)
    return torch.bmm(rows.expand(n * classes, height, h), half).view(n, classes, height * width)


def _down(pixels: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """The transpose of :func:`_up`: ``[n, C, H * W] -> [n, C, h, w]``."""
    n, classes = pixels.shape[:2]
    height, h, width, w = rows.size(0), rows.size(1), columns.size(0), columns.size(1)
    half = (pixels.reshape(n * classes * height, width) @ columns).view(n * classes, height, w)
    return torch.bmm(rows.T.expand(n * classes, h, height), half).view(n, classes, h, w)


class _UpsampledLogSumExp(torch.autograd.Function):
    """``sum over heads and pixels of weight * logsumexp_c z``, ``z [G, B, C, H * W]`` the bilinearly
    upsampled logits, computed a chunk of (head, images) at a time so that the full-resolution
    logits never exist at once (nor in memory, nor in the backward pass, which recomputes
    them). Each token's logits are shifted by their maximum over the classes first, so that
    ``z - up(max) <= 0`` needs no per-pixel maximum; a chunk in which some pixel's classes all
    underflow is recomputed with the per-pixel maximum."""

    @staticmethod
    def forward(ctx, logits, weight, rows, columns, step):
        heads, batch = logits.shape[:2]
        top = logits.amax(2, keepdim=True)
        shifted = logits - top  # [G, B, C, h, w], <= 0
        tiny = torch.finfo(logits.dtype).tiny ** 0.5
        lse = logits.new_empty(heads, batch, weight.size(1))  # log sum_c exp(z - up(top)), per pixel
        fell = set()
        for g in range(heads):
            for b0 in range(0, batch, step):
                b1 = min(batch, b0 + step)
                sums = _up(shifted[g, b0:b1], rows, columns).exp_().sum(1)
                if float(sums.min()) < tiny:  # some pixel's classes all underflowed: the exact maximum there
                    fell.add((g, b0))
                    z = _up(shifted[g, b0:b1], rows, columns)
                    most = z.amax(1, keepdim=True)
                    sums = (z - most).exp_().sum(1).log_().add_(most.squeeze(1))
                else:
                    sums = sums.log_()
                lse[g, b0:b1] = sums
        # sum w * (lse + up(top)) = sum w * lse + <down(w), top>
        total = (lse * weight).sum() + (_down(weight.unsqueeze(1), rows, columns) * top).sum()
        ctx.save_for_backward(shifted, weight, rows, columns, lse)
        ctx.step, ctx.fell = step, fell
        return total

    @staticmethod
    def backward(ctx, grad):
        shifted, weight, rows, columns, lse = ctx.saved_tensors
        heads, batch = shifted.shape[:2]
        out = torch.empty_like(shifted)
        weight = weight * grad
        for g in range(heads):
            for b0 in range(0, batch, ctx.step):
                b1 = min(batch, b0 + ctx.step)
                z, w = _up(shifted[g, b0:b1], rows, columns), weight[b0:b1]
                if (g, b0) in ctx.fell:
                    p = z.sub_(lse[g, b0:b1].unsqueeze(1)).exp_().mul_(w.unsqueeze(1))
                else:
                    p = z.exp_().mul_((lse[g, b0:b1].neg().exp_() * w).unsqueeze(1))
                out[g, b0:b1] = _down(p, rows, columns)  # weight * softmax, back to the tokens
        return out, None, None, None, None


CHUNK = 1 << 18  # full-resolution logits per chunk on the CPU (1 MiB of float32: cache-sized)


def segmentation_grid_loss(logits: torch.Tensor, masks: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Sum over heads of each head's mean per-pixel cross-entropy (``logits [H, B, C, h, w]``
    upsampled bilinearly, ``align_corners=False``, to ``masks [B, H, W]``; pixels of
    ``ignore_index`` left out; 0 when every pixel is), so the gradient reaching head ``h`` is that
    of its own loss. Equal to ``F.cross_entropy(F.interpolate(logits[h], ...), masks,
    ignore_index=...)`` summed over heads (tested), computed without holding the full-resolution
    logits: the log-sum-exp term chunk by chunk (:class:`_UpsampledLogSumExp`), the target term
    at the tokens (upsampling is linear: ``sum over pixels of z[target] = <A, logits>``, ``A`` the
    one-hot masks taken back to the tokens, once for all heads). Several times faster than the
    plain form on the CPU; its memory does not grow with the number of heads."""
    if logits.dim() != 5 or masks.dim() != 3 or logits.size(1) != masks.size(0):
        raise ValueError(
            f"logits must be [H, B, C, h, w] and masks [B, H, W], got {tuple(logits.shape)} and {tuple(masks.shape)}."
        )
    batch, classes, (height, width) = masks.size(0), logits.size(2), masks.shape[-2:]
    masks = masks.long()
    valid = masks != ignore_index
    target = torch.where(valid, masks, 0)
    if target.numel() and (target.min() < 0 or target.max() >= classes):
        bad = target[(target < 0) | (target >= classes)][0]
        raise ValueError(f"a mask holds class {int(bad)}, outside 0..{classes - 1} (and not {ignore_index}).")
    rows = interpolation_matrix(logits.size(3), height, logits.dtype, logits.device)
    columns = interpolation_matrix(logits.size(4), width, logits.dtype, logits.device)
    target, weight = target.flatten(1), valid.flatten(1).to(logits.dtype)
    chunk = CHUNK if logits.device.type == "cpu" else 1 << 26
    step = max(1, chunk // (classes * height * width))
    picked = logits.new_empty(batch, classes, logits.size(3), logits.size(4))  # A: the target term's weights
    for b0 in range(0, batch, step):
        b1 = min(batch, b0 + step)
        onehot = logits.new_zeros(b1 - b0, classes, height * width)
        onehot.scatter_(1, target[b0:b1].unsqueeze(1), weight[b0:b1].unsqueeze(1))
        picked[b0:b1] = _down(onehot, rows, columns)
    total = _UpsampledLogSumExp.apply(logits, weight, rows, columns, step) - (picked * logits).sum()
    return total / max(int(valid.sum()), 1)


@torch.no_grad()
def confusion_matrices(
    predictions: torch.Tensor, masks: torch.Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """``[H, C, C]`` pixel counts (row: the mask's class, column: the predicted one) of each head's
    ``predictions [H, B, ...]`` (class ids) against ``masks [B, ...]``; pixels of ``ignore_index``
    are left out. A mask value outside ``[0, C)`` other than ``ignore_index`` is a ValueError."""
    check_range(num_classes, "num_classes", 1)
    if predictions.shape[1:] != masks.shape:
        raise ValueError(
            f"predictions must be [H, *masks.shape], got {tuple(predictions.shape)} and masks {tuple(masks.shape)}."
        )
    heads = predictions.size(0)
    masks = masks.long()
    valid = masks != ignore_index
    target = masks[valid]
    if target.numel() and (target.min() < 0 or target.max() >= num_classes):
        bad = target[(target < 0) | (target >= num_classes)][0]
        raise ValueError(f"a mask holds class {int(bad)}, outside 0..{num_classes - 1} (and not {ignore_index}).")
    predicted = predictions[:, valid].long()  # [H, V]
    offsets = torch.arange(heads, device=masks.device).unsqueeze(1) * num_classes * num_classes
    index = offsets + target.unsqueeze(0) * num_classes + predicted
    counts = torch.bincount(index.flatten(), minlength=heads * num_classes * num_classes)
    return counts.view(heads, num_classes, num_classes)


def segmentation_scores(confusion: torch.Tensor) -> dict:
    """``{"miou", "pixel_accuracy", "iou"}`` of a ``[C, C]`` confusion matrix accumulated over a
    split: each class's IoU (``None`` for a class absent from both the masks and the
    predictions), their mean over the classes present (mmseg's mIoU), and the share of pixels on
    the diagonal. A matrix of no pixels scores 0."""
    confusion = confusion.double()
    intersection = confusion.diagonal()
    union = confusion.sum(0) + confusion.sum(1) - intersection
    present = union > 0
    iou = torch.where(present, intersection / union.clamp_min(1), torch.zeros_like(union))
    total = confusion.sum()
    return {
        "miou": float(iou[present].mean()) if present.any() else 0.0,
        "pixel_accuracy": float(intersection.sum() / total) if total > 0 else 0.0,
        "iou": [float(value) if keep else None for value, keep in zip(iou.tolist(), present.tolist())],
    }


@torch.no_grad()
def grid_confusions(
    grid: nn.Module,
    features: torch.Tensor,
    masks: torch.Tensor,
    num_classes: int,
    batch_size: int,
    read: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ignore_index: int = IGNORE_INDEX,
    heads: list[int] | None = None,
) -> torch.Tensor:
    """``[H, C, C]`` confusion matrices of every head of ``grid`` (in eval mode; or of the ``heads``
    listed) on ``features [N, K, D]`` and ``masks [N, H, W]``, in batches of ``batch_size``, on the
    grid's device: the logits are upsampled to the masks' size and each pixel takes its highest
    class (of the first ``num_classes``' logits there are: ``num_classes`` may exceed the heads'
    classes, for a class only the masks hold)."""
    device = next(grid.parameters()).device
    was_training = grid.training
    grid.eval()
    total = None
    for xs, ms in zip(features.split(batch_size), masks.split(batch_size)):
        ms = ms.to(device)
        logits = grid(read(xs.to(device)))
        logits = upsample_logits(logits if heads is None else logits[heads], ms.shape[-2:])
        found = confusion_matrices(logits.argmax(2), ms, num_classes, ignore_index)
        total = found if total is None else total + found
    grid.train(was_training)
    return total


def token_majority(
    masks: torch.Tensor, grid: tuple[int, int], num_classes: int, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """``[B, h, w]``: each token's majority class of ``masks [B, H, W]`` on the ``grid = (h, w)``
    token grid (pixel row ``i`` in token row ``i * h // H``, column ``j`` in ``j * w // W``: the
    patches when ``h`` divides ``H``), ignored pixels left out, ties to the lowest class; ``-1``
    for a token whose pixels are all ignored."""
    check_range(num_classes, "num_classes", 1)
    if masks.dim() != 3 or len(grid) != 2:
        raise ValueError(f"masks must be [B, H, W] and grid (rows, columns), got {tuple(masks.shape)} and {grid}.")
    (batch, height, width), (rows, columns) = masks.shape, (int(grid[0]), int(grid[1]))
    if not (1 <= rows <= height and 1 <= columns <= width):
        raise ValueError(f"grid must be in 1..{height} x 1..{width} (the masks' size), got {tuple(grid)}.")
    masks = masks.long()
    valid = masks != ignore_index
    target = masks[valid]
    if target.numel() and (target.min() < 0 or target.max() >= num_classes):
        bad = target[(target < 0) | (target >= num_classes)][0]
        raise ValueError(f"a mask holds class {int(bad)}, outside 0..{num_classes - 1} (and not {ignore_index}).")
    device = masks.device
    token_row = torch.arange(height, device=device) * rows // height  # [H]
    token_column = torch.arange(width, device=device) * columns // width  # [W]
    token = (token_row.view(-1, 1) * columns + token_column.view(1, -1)).expand(batch, -1, -1)  # [B, H, W]
    image = torch.arange(batch, device=device).view(-1, 1, 1).expand_as(token)
    index = ((image * rows * columns + token) * num_classes)[valid] + target
    counts = torch.bincount(index, minlength=batch * rows * columns * num_classes)
    counts = counts.view(batch, rows, columns, num_classes)
    return torch.where(counts.sum(-1) > 0, counts.argmax(-1), -1)


@torch.no_grad()
def token_grid_ceiling(
    masks: torch.Tensor,
    grid: tuple[int, int],
    num_classes: int,
    ignore_index: int = IGNORE_INDEX,
    batch_size: int = 256,
) -> dict:
    """The scores (:func:`segmentation_scores`) of the best a head on the ``grid = (h, w)`` token
    grid can do when it knows each token's majority class (:func:`token_majority`) of ``masks
    [B, H, W]``: one-hot logits ``[1, B, C, h, w]`` of those classes (zeros for a token with no
    pixel to count), upsampled as the heads' logits are (:func:`upsample_logits`), each pixel's
    highest class against the masks, confusion matrices summed over the split (the protocol's
    mIoU), in batches of ``batch_size``. The ceiling of a per-token linear segmentation of the split,
    of the one-hot kind: where three tokens of one class meet one of another, bilinear upsampling
    rounds the corner off, which a head with per-token confidences could partly avoid."""
    check_range(batch_size, "batch_size", 1)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=masks.device)
    for chunk in masks.split(batch_size):
        majority = token_majority(chunk, grid, num_classes, ignore_index)  # [b, h, w]
        logits = F.one_hot(majority.clamp_min(0), num_classes).permute(0, 3, 1, 2).float()
        logits = logits * (majority >= 0).unsqueeze(1)  # [b, C, h, w]
        up = upsample_logits(logits.unsqueeze(0), chunk.shape[-2:])  # [1, b, C, H, W]
        confusion += confusion_matrices(up.argmax(2), chunk, num_classes, ignore_index)[0]
    return segmentation_scores(confusion)
