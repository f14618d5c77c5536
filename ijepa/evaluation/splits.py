"""Class-stratified validation split and class-balanced low-shot subsets of a labelled data set.

Every draw is seeded per class (:func:`ijepa.data.sampling.mix_seed`), so a class's draw depends only
on its own positions and the seed: adding or removing another class never moves it, and the result is
the same in every process and on every run. Index tensors are int64, sorted ascending, on CPU.

A fixed subset (the 1% ImageNet list of SimCLR, MSN and I-JEPA) is read from a file of image
names instead (:func:`read_subset_file`, :func:`named_indices`), matched against each item's name
(:func:`item_names`).
"""

from __future__ import annotations

import hashlib
import numbers
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset

from ijepa.data.sampling import mix_seed
from ijepa.nn.checks import check_range


def _labels(labels: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """``labels`` as a CPU int64 ``[N]`` tensor; ValueError on another shape or a negative label."""
    labels = torch.as_tensor(labels).cpu()
    if labels.dim() != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be a 1-D integer tensor [N], got shape {tuple(labels.shape)} {labels.dtype}.")
    negative = (labels < 0).nonzero().flatten()
    if len(negative):
        raise ValueError(
            f"labels must be class indices >= 0, got {len(negative)} negative (unlabelled) at positions "
            f"{negative[:10].tolist()}{' ...' if len(negative) > 10 else ''}: drop unlabelled images first."
        )
    return labels.long()


def _classes(labels: torch.Tensor, positions: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """(class, its positions ascending) for each class among ``labels[positions]``, in class order."""
    positions = positions.sort().values
    # A stable sort by label keeps each class's positions ascending, in one pass over N.
    order = positions[torch.sort(labels[positions], stable=True).indices]
    classes, counts = torch.unique(labels[order], return_counts=True)
    yield from zip(classes.tolist(), torch.split(order, counts.tolist()))


def _draw(positions: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """``k`` of ``positions`` drawn without replacement by a generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return positions[torch.randperm(len(positions), generator=generator)[:k]]


def class_counts(labels: torch.Tensor | Sequence[int]) -> dict[int, int]:
    """{class: number of images} of ``labels`` [N], in class order."""
    classes, counts = torch.unique(_labels(labels), return_counts=True)
    return dict(zip(classes.tolist(), counts.tolist()))


def validation_split(
    labels: torch.Tensor, fraction: float, seed: int, *, name: str = "val_fraction"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train_indices, val_indices)``, positions into ``labels`` [N] that partition ``range(N)``.

    Per class of ``n_c`` images, a random ``round(fraction * n_c)`` of its positions, clamped to
    ``1 .. n_c - 1``, go to validation, drawn with ``mix_seed(seed, class)``. A class of a single
    image cannot give one without leaving none to train on: it stays whole in train (no error).
    ``name`` is the option the caller exposes ``fraction`` as, for the error message.
    """
    labels = _labels(labels)
    check_range(fraction, name, 0, 1, low_open=True, high_open=True)
    val = [
        _draw(positions, max(1, min(round(fraction * len(positions)), len(positions) - 1)), mix_seed(seed, c))
        for c, positions in _classes(labels, torch.arange(len(labels)))
        if len(positions) >= 2
    ]
    in_val = torch.zeros(len(labels), dtype=torch.bool)
    in_val[torch.cat([torch.empty(0, dtype=torch.long), *val])] = True
    return in_val.logical_not().nonzero().flatten(), in_val.nonzero().flatten()


def low_shot_indices(
    labels: torch.Tensor,
    pool: torch.Tensor,
    *,
    shots: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    trial: int = 0,
) -> torch.Tensor:
    """A class-balanced subset [M] of ``pool`` [P] (positions into ``labels`` [N], e.g. the train
    indices of :func:`validation_split`, so the subset never meets validation).

    Exactly one of ``shots`` (that many images of every class in the pool) or ``fraction``
    (``max(1, round(fraction * n_c))`` of a class of ``n_c``: the paper's 1% / 10% protocols).
    Class ``c`` is drawn with ``mix_seed(seed, trial, c)``: each trial is another draw. The order
    of ``pool`` and repeats in it do not matter.
    """
    labels = _labels(labels)
    if (shots is None) == (fraction is None):
        raise ValueError(
            "give exactly one of shots (images per class, an int >= 1) or fraction (of each class, in (0, 1]), "
            f"got {'both' if shots is not None else 'neither'}."
        )
    pool = torch.unique(torch.as_tensor(pool).cpu().long())
    if len(pool) == 0 or pool[0] < 0 or pool[-1] >= len(labels):
        raise ValueError(
            f"pool must hold positions in 0..{len(labels) - 1} (into labels), got "
            f"{'none' if len(pool) == 0 else f'min={int(pool[0])}, max={int(pool[-1])}'}."
        )
    classes = list(_classes(labels, pool))
    if shots is not None:
        if not isinstance(shots, numbers.Integral) or isinstance(shots, bool):
            raise ValueError(f"shots must be an int >= 1, got {shots!r}.")
        check_range(shots, "shots", 1)
        smallest, positions = min(classes, key=lambda item: len(item[1]))
        if shots > len(positions):
            raise ValueError(
                f"shots={shots} is larger than class {smallest}, which has only {len(positions)} training "
                f"images (the smallest class); shots must be in 1..{len(positions)}."
            )
    else:
        check_range(fraction, "fraction", 0, 1, low_open=True)
    chosen = [
        _draw(positions, shots or max(1, round(fraction * len(positions))), mix_seed(seed, trial, c))
        for c, positions in classes
    ]
    return torch.cat(chosen).sort().values


def _file_names(dataset: Dataset) -> list[str] | None:
    """Each item's path relative to ``dataset.root``, '/'-separated, or None for a dataset without
    files; a :class:`~torch.utils.data.Subset` takes its items' names from the dataset under it."""
    if isinstance(dataset, Subset):
        inner = _file_names(dataset.dataset)
        return None if inner is None else [inner[i] for i in dataset.indices]
    samples = getattr(dataset, "samples", None)
    if samples is None:
        samples = getattr(dataset, "imgs", None)
    if samples is None:
        return None
    root = getattr(dataset, "root", None)
    return [Path(os.path.relpath(path, root) if root is not None else path).as_posix() for path, *_ in samples]


def item_names(dataset: Dataset) -> list[str]:
    """The name of each of the ``N`` items of ``dataset``: its path relative to the data set's root
    for an ImageFolder-style data set (``samples`` or ``imgs`` of ``(path, label)``, as
    ``n01440764/n01440764_10026.JPEG``), else its index as a string (generated data, STL-10)."""
    names = _file_names(dataset)
    return names if names is not None else [str(i) for i in range(len(dataset))]


def read_subset_file(path: str | Path, option: str = "subset_files") -> tuple[list[str], str]:
    """``(names, sha256)`` of a subset file: one image name a line (a path relative to the split's
    root, a file name, or an index); blank lines and ``#`` comments are ignored, repeats kept once.
    ValueError naming ``option`` for a file that does not exist or names no image."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{option}: subset file {str(path)!r} does not exist (one image name a line).")
    data = path.read_bytes()
    names = []
    for line in data.decode("utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("./"):
            line = line[2:]
        if line:
            names.append(line)
    if not names:
        raise ValueError(f"{option}: subset file {str(path)!r} names no image (only blank lines or # comments).")
    return list(dict.fromkeys(names)), hashlib.sha256(data).hexdigest()


def named_indices(names: Sequence[str], wanted: Sequence[str], what: str, shown: int = 5) -> torch.Tensor:
    """Positions [M] into ``names`` [N] (:func:`item_names`) of the items ``wanted`` names, int64,
    sorted ascending, no repeats. A wanted name matches the item of that name (a relative path, or
    an index for data without files) or, failing that, the item whose file name (last '/' part)
    it is. ValueError starting with ``what`` (e.g. ``subset file 1percent.txt``) listing the first
    ``shown`` names that match no item, or that match several (one file name in two folders)."""
    exact = {name: i for i, name in enumerate(names)}
    by_file: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by_file.setdefault(name.rsplit("/", 1)[-1], []).append(i)
    found, missing, ambiguous = [], [], []
    for name in wanted:
        if name in exact:
            found.append(exact[name])
        elif len(by_file.get(name, ())) == 1:
            found.append(by_file[name][0])
        else:
            (ambiguous if name in by_file else missing).append(name)
    for bad, problem in ((missing, "not in"), (ambiguous, "that match several files of")):
        if bad:
            listed = ", ".join(bad[:shown]) + (f" and {len(bad) - shown} more" if len(bad) > shown else "")
            raise ValueError(
                f"{what} names {len(bad)} image{'s' if len(bad) > 1 else ''} {problem} the train split of "
                f"data.source: {listed}"
                + (" (give their paths relative to the split's root)." if bad is ambiguous else ".")
            )
    return torch.tensor(sorted(set(found)), dtype=torch.long)
