"""Frozen features of a whole split, extracted once and cached to a file.

Extraction is sharded over the processes (each encodes every ``world``-th image) and gathered
back into the dataset's order, so every process holds what one process would. The cache file is
named by a hash of everything the features depend on (the checkpoint's SHA-256, the encoder, the
data source, the transform, the image size, the split and the kind of feature): another
checkpoint or transform is another file, never a stale one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, Dataset

from ijepa.checkpoint import atomic_save
from ijepa.evaluation.data import image_label_collate
from ijepa.evaluation.encoders import FrozenEncoder

KINDS = ("blocks", "tokens")  # block_means [N, n, D]; tokens [N, K, D]


def gather_batches(fabric: Fabric, tensor: torch.Tensor) -> torch.Tensor:
    """Every process's ``[L, ...]`` -> ``[world * L, ...]`` in the interleaved order of a
    ``DistributedSampler`` (position ``j * world + rank``), which is the one-process order."""
    if fabric.world_size == 1:
        return tensor
    return fabric.all_gather(tensor).transpose(0, 1).flatten(0, 1)


def encode(
    fabric: Fabric, encoder: FrozenEncoder, images: torch.Tensor, kind: str, last_blocks: int = 1
) -> torch.Tensor:
    """One batch through the frozen encoder, under the run's precision, as float32."""
    with torch.no_grad(), fabric.autocast():
        out = encoder.tokens(images) if kind == "tokens" else encoder.block_means(images, last_blocks)
    return out.float()


@torch.no_grad()
def extract(
    fabric: Fabric,
    encoder: FrozenEncoder,
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    kind: str,
    last_blocks: int = 1,
) -> dict[str, torch.Tensor]:
    """``{"features", "labels", "positions"}`` of every labelled item of ``dataset`` (label ``>= 0``),
    on the CPU: features ``[N, last_blocks, D]`` (``blocks``) or ``[N, K, D]`` (``tokens``), labels
    ``[N]``, and each row's position in the dataset ``[N]``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    world, rank, size = fabric.world_size, fabric.global_rank, len(dataset)
    per_rank = -(-size // world)
    # padded with the last item so every process runs the same batches; the padding is cut after gathering
    indices = [min(j * world + rank, size - 1) for j in range(per_rank)]
    loader = DataLoader(
        dataset,
        batch_size=max(1, batch_size // world),
        sampler=indices,
        num_workers=num_workers,
        collate_fn=image_label_collate,
    )
    features, labels = [], []
    for batch in loader:
        features.append(encode(fabric, encoder, batch.images.to(fabric.device), kind, last_blocks))
        labels.append(batch.labels.to(fabric.device))
    features, labels = torch.cat(features), torch.cat(labels)
    features, labels = gather_batches(fabric, features)[:size].cpu(), gather_batches(fabric, labels)[:size].cpu()
    keep = labels >= 0  # unlabelled items never enter an evaluation
    if not keep.any():
        raise ValueError("data.source gave no labelled images (labels >= 0) in this split.")
    return {"features": features[keep], "labels": labels[keep], "positions": torch.nonzero(keep).flatten()}


class FeatureCache:
    """Features of the splits of one evaluation, kept in memory and (with a ``folder``) in files
    that the next ``ijepa eval`` on the same checkpoint, data and transform reuses.

    ``identity`` is what every split's features depend on (checkpoint SHA-256, encoder, data
    description). Block features are stored for the most blocks asked for so far: a request for
    fewer reuses them, a request for more extracts again and replaces the file.
    """

    def __init__(self, folder: str | Path | None, identity: dict):
        self.folder = Path(folder) if folder is not None else None
        self.identity = identity
        self.memory: dict[tuple[str, str], dict] = {}
        self.extracted: list[tuple[str, str]] = []  # what had to be encoded (for the log and the tests)
        self.reused: list[tuple[str, str]] = []  # what came from a file

    def key(self, split: str, kind: str) -> str:
        text = json.dumps({**self.identity, "split": split, "kind": kind}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def path(self, split: str, kind: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{split}-{kind}-{self.key(split, kind)}.pt"

    def get(self, fabric: Fabric, split: str, kind: str, last_blocks: int, make) -> dict[str, torch.Tensor]:
        """The split's features (``make()`` extracts them), with block features cut to the last
        ``last_blocks`` blocks, flattened to ``[N, last_blocks * D]``."""
        entry = self.memory.get((split, kind))
        if entry is None and self.folder is not None and self.path(split, kind).is_file():
            entry = torch.load(self.path(split, kind), map_location="cpu", weights_only=True)
            if entry.get("identity") != json.loads(json.dumps(self.identity, default=str)):
                entry = None  # a hash collision or a hand-edited file: never trust it
            else:
                self.reused.append((split, kind))
        if entry is None or (kind == "blocks" and entry["last_blocks"] < last_blocks):
            entry = {
                **make(),
                "last_blocks": last_blocks,
                "identity": json.loads(json.dumps(self.identity, default=str)),
            }
            self.extracted.append((split, kind))
            if self.folder is not None and fabric.is_global_zero:
                atomic_save(entry, self.path(split, kind))
            fabric.barrier()
        self.memory[(split, kind)] = entry
        features = entry["features"]
        if kind == "blocks":
            features = features[:, features.size(1) - last_blocks :].flatten(1)
        return {"features": features, "labels": entry["labels"], "positions": entry["positions"]}
