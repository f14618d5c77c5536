"""Frozen features of a labelled split, extracted once, sharded over the processes.

Each of ``world`` processes encodes the items ``rank, rank + world, ...`` (padded with the last
item so every process runs the same batches) and the pieces are gathered back into the dataset's
order, so every process holds what one process would. The in-fit probes gather with
``LightningModule.all_gather``, ``ijepa eval`` with ``Fabric.all_gather``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset

from ijepa.data.batch import LabeledBatch
from ijepa.data.collate import labeled_collate


class Features(NamedTuple):
    """``features [N, ...]`` and ``labels [N]`` of a split's labelled items, and each row's index
    in the dataset, ``positions [N]``; ``extras``: the per-item tensors asked for besides (dense
    masks and counts), by name, in the same rows."""

    features: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    extras: dict[str, torch.Tensor] | None = None


def shard_indices(size: int, rank: int, world: int) -> list[int]:
    """This process's items of a dataset of ``size``: ``rank, rank + world, ...``, padded with the
    last item to ``ceil(size / world)`` so every process runs the same number of batches."""
    return [min(j * world + rank, size - 1) for j in range(math.ceil(size / world))]


def gather_in_order(
    tensor: torch.Tensor, all_gather: Callable[[torch.Tensor], torch.Tensor] | None, world: int, size: int | None = None
) -> torch.Tensor:
    """Every process's ``[L, ...]`` (from :func:`shard_indices`, or a ``DistributedSampler``) ->
    ``[world * L, ...]`` in the one-process order (row ``j * world + rank``), cut to ``size``."""
    if world > 1:
        tensor = all_gather(tensor).transpose(0, 1).flatten(0, 1)
    return tensor if size is None else tensor[:size]


@torch.no_grad()
def extract_features(
    dataset: Dataset,
    encode: Callable[[LabeledBatch], torch.Tensor],
    device: torch.device | str,
    batch_size: int,
    num_workers: int = 0,
    collate_fn: Callable = labeled_collate,
    rank: int = 0,
    world: int = 1,
    all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    pin_memory: bool = False,
    what: str = "the data",
    extras: dict[str, Callable[[LabeledBatch], torch.Tensor]] | None = None,
) -> Features:
    """``encode(batch)`` (``[B, ...]`` features of a :class:`~ijepa.data.batch.LabeledBatch` on
    ``device``; clips carry ``frame_times``) of every labelled item of ``dataset`` (label ``>= 0``),
    as float32 on ``device``, in the dataset's order. ``batch_size`` is per process. Unlabelled
    items never enter a classifier; a split without any is a ValueError naming ``what``.
    ``extras`` (name -> ``fn(batch) -> [B, ...]``, e.g. a dense batch's masks) are gathered
    alongside the labels into :attr:`Features.extras`."""
    size = len(dataset)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=shard_indices(size, rank, world),
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
    )
    features, labels = [], []
    found = {name: [] for name in extras or {}}
    for batch in loader:
        batch = batch.to(device)
        features.append(encode(batch).float())
        labels.append(batch.labels.to(device))
        for name, take in (extras or {}).items():
            found[name].append(take(batch))
    features = gather_in_order(torch.cat(features), all_gather, world, size)
    labels = gather_in_order(torch.cat(labels), all_gather, world, size)
    keep = labels >= 0
    if not keep.any():
        raise ValueError(f"{what} gave no labelled images (labels >= 0).")
    gathered = {
        name: gather_in_order(torch.cat(values), all_gather, world, size)[keep] for name, values in found.items()
    }
    return Features(features[keep], labels[keep], torch.nonzero(keep).flatten(), gathered if extras else None)
