"""The batches the collators hand the model: one record per kind, so that code reads a batch's
fields by name and dispatches on its type, never on which keys a dict holds.

Kinds (shapes: ``B`` images, ``R`` mask sets per image, ``M`` target blocks of ``Kt`` patches,
contexts of ``Kc`` patches, ``T`` frames):

* :class:`GridBatch`: masked images on one patch grid (:class:`~ijepa.data.collate.MaskCollator`);
* :class:`ClipBatch`: the same for clips, with their frame times;
* :class:`PackedBatch`: native-resolution images packed into sequences
  (:class:`~ijepa.data.native.PackedMaskCollator`);
* :class:`LabeledBatch` / :class:`LabeledClipBatch`: labelled images or clips for the probes,
  ``predict`` and evaluation;
* :class:`DenseBatch`: labelled images with per-pixel class masks and object counts, for the
  dense (segmentation, counting) evaluations (:func:`~ijepa.data.collate.dense_collate`).

The records are dataclasses: Lightning moves every tensor field to the device
(``apply_to_collection`` walks dataclasses), and the DataLoader's ``pin_memory`` calls their
:meth:`Record.pin_memory`. ``len(batch)`` is the number of images, the size Lightning weights a
logged epoch mean by (pass it as ``self.log(..., batch_size=len(batch))``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from ijepa.nn.packing import Packed

IGNORE_INDEX = 255
"""The mask value of pixels a dense loss or metric ignores (the ADE20K / VOC convention)."""


class Record:
    """What every batch record shares: pinning for the DataLoader's ``pin_memory`` (which only
    pins tensors, mappings, sequences and objects with this method), and ``len`` in images."""

    def pin_memory(self):
        """The same record with every tensor in page-locked memory."""
        return apply_to_collection(self, torch.Tensor, torch.Tensor.pin_memory)

    def to(self, device: torch.device | str):
        """The same record with every tensor on ``device`` (outside a Lightning loop)."""
        return apply_to_collection(self, torch.Tensor, lambda tensor: tensor.to(device, non_blocking=True))

    def __len__(self) -> int:
        """The number of images (or clips)."""
        return self.images.size(0)


@dataclass
class LabeledBatch(Record):
    """Labelled images: ``images [B, C, H, W]`` (float, normalised), ``labels [B]`` (``-1``:
    unlabelled)."""

    images: torch.Tensor
    labels: torch.Tensor
    frame_times = None  # images have no timestamps; LabeledClipBatch has a field of this name


@dataclass
class LabeledClipBatch(LabeledBatch):
    """Labelled clips: ``images [B, C, T, H, W]``, ``labels [B]``, and ``frame_times [B, T]``
    (seconds) when the source has them."""

    frame_times: torch.Tensor | None = None


@dataclass
class DenseBatch(LabeledBatch):
    """Labelled images with dense targets: ``images [B, C, H, W]`` (float, normalised), ``labels
    [B]`` (image class, ``-1``: unlabelled), ``masks [B, H, W]`` (int64 per-pixel class: ``0``
    background, shape classes from ``1``; :data:`IGNORE_INDEX` marks pixels to ignore) and
    ``counts [B]`` (int64 objects in the image, ``-1``: unknown)."""

    masks: torch.Tensor
    counts: torch.Tensor


@dataclass
class GridBatch(Record):
    """A masked pretraining batch on one patch grid.

    Attributes:
        images: ``[B, C, H, W]``.
        context_indices: ``[R * B, Kc]`` patch indices of each context; row ``r * B + i`` is the
            ``r``-th mask set of image ``i``.
        target_indices: ``[R * B, M, Kt]`` patch indices of each target block.
        labels: ``[B]``, or None (synthetic batches of the benchmarks and tests).
        context_mask: ``[R * B, Kc]`` True for real context tokens, when contexts of different
            lengths are padded (``context_policy`` ``pad`` or ``static``); else None.
        target_mask: ``[R * B, M, Kt]`` True for real target tokens, when blocks are padded to one
            size (``static``); padded slots are left out of the loss. Else None.
        patch_size: FlexiViT (``data.train_patch_sizes``): the patch size the batch is cut at,
            its masks on that size's grid; None: the model's own.
    """

    images: torch.Tensor
    context_indices: torch.Tensor
    target_indices: torch.Tensor
    labels: torch.Tensor | None = None
    context_mask: torch.Tensor | None = None
    target_mask: torch.Tensor | None = None
    patch_size: int | None = None
    frame_times = None  # images have no timestamps; ClipBatch has a field of this name


@dataclass
class ClipBatch(GridBatch):
    """A masked batch of clips: :class:`GridBatch` with ``images [B, C, T, H, W]`` and masks on the
    ``(T / tubelet, H / p, W / p)`` grid of tubelets, flattened; ``frame_times [B, T]`` (seconds)
    when the source has them, which time-aware encodings (``mrope``) read."""

    frame_times: torch.Tensor | None = None


@dataclass
class PackedBatch(Record):
    """A native-resolution batch (:class:`~ijepa.data.native.PackedMaskCollator`): each image on
    its own grid, the tokens of several images packed into sequences.

    Attributes:
        labels: ``[B]``.
        full: every patch of every image, for the target encoder: ``values [S_f, L_f, C p p]``,
            ``positions`` (canvas positions on the model's grid) and ``image_ids`` (``-1``:
            padding) ``[S_f, L_f]``.
        context: the context patches, for the context encoder, ``[S_c, L_c, ...]`` likewise.
        pred: the predictor's layout, no values: ``positions``, ``image_ids`` and ``groups``
            ``[S_p, L_p]`` (per image its context slots, group 0, then each target block,
            groups ``1..M``).
        pred_context_slot: ``[S_p, L_p]`` each group-0 slot's context token, a flat index into
            ``[S_c * L_c]``; ``-1`` elsewhere.
        pred_target_slot: ``[S_p, L_p]`` each block slot's target token, a flat index into
            ``[S_f * L_f]``; ``-1`` elsewhere.
    """

    labels: torch.Tensor
    full: Packed
    context: Packed
    pred: Packed
    pred_context_slot: torch.Tensor
    pred_target_slot: torch.Tensor

    def __len__(self) -> int:
        return self.labels.size(0)
