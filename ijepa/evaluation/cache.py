"""Frozen features of a whole split (:func:`ijepa.classifiers.extract_features`), cached to a file.

The cache file is named by a hash of everything the features depend on (the checkpoint's SHA-256, the encoder, the
data source, the transform, the image size, the split and the kind of feature): another
checkpoint or transform is another file, never a stale one. A file that cannot be read, or holds
non-finite features, is treated as absent (a warning names it); what a killed write left behind is
removed by the next evaluation; non-finite features are never written.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch
from lightning.fabric import Fabric

from ijepa.checkpoint import atomic_save, stale_temporaries
from ijepa.evaluation.readouts import is_pooled

KINDS = ("blocks", "tokens", "patches")  # block_means [N, n, D]; tokens [N, K, D]; block_tokens [N, n, K, D]
TARGETS = ("masks", "counts")  # what dense data adds to an entry besides its labels


def last_blocks_of(features: torch.Tensor, kind: str, last_blocks: int) -> torch.Tensor:
    """``blocks`` (and a readout's ``blocks:<key>``) ``[N, n, D] -> [N, last_blocks * D]``; ``patches`` ``[N, n, K, D] -> [N, K,
    last_blocks * D]`` (each token's last blocks concatenated, oldest first); ``tokens`` unchanged."""
    if is_pooled(kind):  # the mean's or another readout's pooled blocks, [N, n, F]
        return features[:, features.size(1) - last_blocks :].flatten(1)
    if kind == "patches":
        return features[:, features.size(1) - last_blocks :].transpose(1, 2).flatten(2)
    return features


class FeatureCache:
    """Features of the splits of one evaluation, kept in memory and (with a ``folder``) in files
    that the next ``ijepa eval`` on the same checkpoint, data and transform reuses.

    ``identity`` is what every split's features depend on (checkpoint SHA-256, encoder, data
    description). Block features are stored for the most blocks asked for so far: a request for
    fewer reuses them, a request for more extracts again and replaces the file.
    """

    def __init__(self, folder: str | Path | None, identity: dict, is_global_zero: bool = True):
        self.folder = Path(folder) if folder is not None else None
        self.identity = identity
        if self.folder is not None and is_global_zero:
            for path in stale_temporaries(self.folder):  # a write killed midway: never renamed into place
                path.unlink(missing_ok=True)
        self.memory: dict[tuple[str, str], dict] = {}
        self.extracted: list[tuple[str, str]] = []  # what had to be encoded (for the log and the tests)
        self.reused: list[tuple[str, str]] = []  # what came from a file

    def read(self, path: Path) -> dict | None:
        """The entry cached at ``path``, or None (with a warning naming the file) when it cannot be
        read, is not this evaluation's (a hash collision or a hand-edited file) or holds non-finite
        features: then the split is extracted again and the file replaced."""
        try:
            entry = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # truncated, unreadable, not a torch file: any of them means "absent"
            warnings.warn(
                f"the feature cache {path} cannot be read ({type(error).__name__}: {error}); extracting again.",
                stacklevel=3,
            )
            return None
        identity = json.loads(json.dumps(self.identity, default=str))
        if not isinstance(entry, dict) or entry.get("identity") != identity or "features" not in entry:
            return None
        if not torch.isfinite(entry["features"]).all():
            warnings.warn(f"the feature cache {path} holds non-finite features; extracting again.", stacklevel=3)
            return None
        return entry

    def key(self, split: str, kind: str) -> str:
        text = json.dumps({**self.identity, "split": split, "kind": kind}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def path(self, split: str, kind: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{split}-{kind}-{self.key(split, kind)}.pt"

    def get(self, fabric: Fabric, split: str, kind: str, last_blocks: int, make) -> dict[str, torch.Tensor]:
        """The split's features (``make()`` extracts them), with block features cut to the last
        ``last_blocks`` blocks (:func:`last_blocks_of`), and, for dense data, its ``masks`` and
        ``counts``."""
        entry = self.memory.get((split, kind))
        if entry is None and self.folder is not None and self.path(split, kind).is_file():
            entry = self.read(self.path(split, kind))
            if entry is not None:
                self.reused.append((split, kind))
        if entry is None or (kind != "tokens" and entry["last_blocks"] < last_blocks):
            entry = {
                **make(),
                "last_blocks": last_blocks,
                "identity": json.loads(json.dumps(self.identity, default=str)),
            }
            bad = int((~torch.isfinite(entry["features"])).sum())
            if bad:  # a score of NaN features is no score; a cached one would be reused
                raise FloatingPointError(
                    f"the {split} split's {kind} features hold {bad} non-finite values (NaN or inf) out of "
                    f"{entry['features'].numel()}; nothing was cached. The encoder's weights are finite, so it overflows "
                    "on these images (under --precision 16-mixed, try bf16-mixed or 32-true)."
                )
            self.extracted.append((split, kind))
            if self.folder is not None and fabric.is_global_zero:
                advice = "point --cache_dir at a disk with room, or evaluate without a cache (--cache false)."
                atomic_save(entry, self.path(split, kind), what="the feature cache", advice=advice)
            fabric.barrier()
        self.memory[(split, kind)] = entry
        found = {"features": last_blocks_of(entry["features"], kind, last_blocks)}
        found.update({key: entry[key] for key in ("labels", "positions", *TARGETS) if key in entry})
        return found
