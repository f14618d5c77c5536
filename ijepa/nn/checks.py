"""Input checks shared by the modules in ``ijepa.nn``.

Index range checks need the min/max of a tensor on the host, which is a device sync. They are on
by default because a wrong index silently gathers the wrong patch; a training loop whose indices
come from a validated sampler may switch them off with :func:`index_checks`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_INDEX_CHECKS = True


@contextlib.contextmanager
def index_checks(enabled: bool) -> Iterator[None]:
    """Temporarily enable or disable the host-syncing index range checks."""
    global _INDEX_CHECKS
    previous, _INDEX_CHECKS = _INDEX_CHECKS, enabled
    try:
        yield
    finally:
        _INDEX_CHECKS = previous


def index_checks_enabled() -> bool:
    """Whether index range checks are currently on."""
    return _INDEX_CHECKS


def check_indices(indices: torch.Tensor, num_positions: int, name: str = "indices") -> None:
    """Raise ValueError unless ``indices`` is an integer ``[B, K]`` tensor in ``[0, num_positions)``."""
    if indices.dim() != 2:
        raise ValueError(f"{name} must have shape [B, K], got {tuple(indices.shape)}.")
    if indices.dtype.is_floating_point or indices.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {indices.dtype}.")
    if _INDEX_CHECKS and indices.numel() > 0:
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= num_positions:
            raise ValueError(
                f"{name} out of range: valid patch indices are 0..{num_positions - 1} "
                f"(row-major i = r*G + c), got min={low}, max={high}."
            )


def check_positive(value: int | float, name: str) -> None:
    """Raise ValueError unless ``value`` is > 0."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}.")
