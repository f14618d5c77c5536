"""Input checks shared by the modules in ``ijepa.nn``.

Index range checks need the min/max of a tensor on the host, which is a device sync. They are on
by default because a wrong index silently gathers the wrong patch; a training loop whose indices
come from a validated sampler may switch them off with :func:`index_checks`.
"""

from __future__ import annotations

import contextlib
import math
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


def check_indices(indices: torch.Tensor, num_positions: int, name: str = "indices") -> None:
    """Raise ValueError unless ``indices`` is an integer ``[B, K]`` tensor in ``[0, num_positions)``."""
    if indices.dim() != 2:
        raise ValueError(f"{name} must have shape [B, K], got {tuple(indices.shape)}.")
    if indices.dtype.is_floating_point or indices.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {indices.dtype}.")
    # torch.export cannot trace a host sync on values: exported programs run without this check.
    if _INDEX_CHECKS and indices.numel() > 0 and not torch.compiler.is_exporting():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= num_positions:
            raise ValueError(
                f"{name} out of range: valid patch indices are 0..{num_positions - 1} "
                f"(row-major i = r*G + c), got min={low}, max={high}."
            )


def check_positive(value: int | float, name: str) -> None:
    """Raise ValueError unless ``value`` is > 0."""
    check_range(value, name, 0, low_open=True)


def check_range(
    value: int | float,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Raise ValueError naming ``name`` and its range unless ``value`` is a finite number from
    ``low`` to ``high`` (an end excluded when ``*_open``, none where None): the check of every
    numeric option, e.g. ``drop_path_rate must be in [0, 1), got 1.5.``. NaN and infinity fail
    every range (a comparison with NaN is always false, so a bare ``value < 0`` lets it through)."""
    above = low is None or (value > low if low_open else value >= low)
    below = high is None or (value < high if high_open else value <= high)
    if math.isfinite(value) and above and below:
        return
    if low is not None and high is not None:
        expected = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        expected = f"{'>' if low_open else '>='} {low}"
    elif high is not None:
        expected = f"{'<' if high_open else '<='} {high}"
    else:
        expected = "finite"
    raise ValueError(f"{name} must be {expected}, got {value}.")


def check_values(values, name: str, low: float, *, low_open: bool = False) -> None:
    """A sweep: at least one value, each within :func:`check_range`'s ``[low, inf)`` (``(low, inf)``
    when ``low_open``), named ``name[i]`` in the error."""
    if len(values) == 0:
        raise ValueError(f"{name} must hold at least one value, got {list(values)}.")
    for i, value in enumerate(values):
        check_range(value, f"{name}[{i}]", low, low_open=low_open)


def check_heads(num_heads: int, width: int, heads_name: str, width_name: str) -> None:
    """Raise ValueError naming both options unless ``num_heads`` divides ``width``."""
    if num_heads < 1 or width % num_heads:
        raise ValueError(
            f"{heads_name}={num_heads} must divide {width_name}={width} (each head reads width / heads channels)."
        )


def _size(count: int) -> str:
    return f"{count / 1e9:,.1f} GB" if count >= 1e9 else f"{count / 1e6:,.1f} MB"


TOKEN_ADVICE = "Use a larger patch_size or a smaller image_size, or raise model.max_tokens (null: no bound)."


def check_token_grid(
    image_size: int,
    patch_size: int,
    num_frames: int,
    tubelet_size: int,
    width: int,
    num_heads: int,
    max_tokens,
    advice: str = TOKEN_ADVICE,
) -> int:
    """The tokens of one image (clip), refused when the grid is under 2 x 2 (no context and target
    blocks to draw) or holds more than ``max_tokens`` (None: no bound), with what one image would
    cost: a grid of 512 x 512 tokens trains for hours before anything else goes wrong. ``advice``
    ends the message: what the caller's user can change."""
    if max_tokens is not None:
        check_range(max_tokens, "max_tokens", 4)
    side = image_size // patch_size
    if side < 2:
        raise ValueError(
            f"image_size={image_size} (data.image_size) is less than two patches of patch_size={patch_size} "
            f"(model.patch_size): I-JEPA needs a grid of at least 2 x 2 tokens; set image_size >= {2 * patch_size} "
            "or a smaller patch_size."
        )
    tokens = side * side * (num_frames // tubelet_size if num_frames else 1)
    if max_tokens is not None and tokens > max_tokens:
        features = tokens * width * 4  # float32 token features of one block
        scores = tokens * tokens * num_heads * 4  # one block's attention scores without a fused kernel
        raise ValueError(
            f"image_size={image_size} / patch_size={patch_size} makes {tokens:,} tokens per "
            f"{'clip' if num_frames else 'image'}, above max_tokens={max_tokens:,}: each block's token features take "
            f"{_size(features)} per image and its attention scores, without a fused kernel, {_size(scores)}. {advice}"
        )
    return tokens
