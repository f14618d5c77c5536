"""The family's one registry: config name -> class. Tests, studies, docs and the CLI read it;
a new member is its own file plus one line here."""

from __future__ import annotations

import warnings

from ijepa.nn.position.base import NonePosition, PositionEncoding
from ijepa.nn.position.convolution import PegPosition
from ijepa.nn.position.relative import RelativeBiasPosition
from ijepa.nn.position.rotary import MropePosition, RopeAxialPosition, RopeMixedPosition
from ijepa.nn.position.tables import (
    Learned2DPosition,
    LearnedFlat3DPosition,
    LearnedPosition,
    Sincos3DPosition,
    SincosPosition,
)
from ijepa.nn.resize import Grid

POSITION_ENCODINGS: dict[str, type[PositionEncoding]] = {
    cls.name: cls
    for cls in (
        NonePosition,
        LearnedPosition,
        Learned2DPosition,
        SincosPosition,
        RopeAxialPosition,
        RopeMixedPosition,
        PegPosition,
        RelativeBiasPosition,
        LearnedFlat3DPosition,
        Sincos3DPosition,
        MropePosition,
    )
}

# Former config names -> today's, so that configs and checkpoints' hyper_parameters written
# before a rename build the same member (same state-dict keys, same weights).
RENAMED_POSITIONS = {"learned_3d": "learned_flat_3d"}


def position_names(dims: int | None = None) -> tuple[str, ...]:
    """Registered config names, in registry order; only those for ``dims``-axis grids if given
    (2: images, 3: clips)."""
    return tuple(name for name, cls in POSITION_ENCODINGS.items() if dims is None or cls.dims == dims)


def packable_positions() -> tuple[str, ...]:
    """Registered members that NaViT packing can use (``packable``), in registry order."""
    return tuple(name for name, cls in POSITION_ENCODINGS.items() if cls.packable)


def build_position_encoding(
    name: str, grid: Grid, embed_dim: int, num_heads: int = 1, options: dict | None = None
) -> PositionEncoding:
    """The member called ``name`` over ``grid`` (``(H, W)`` or ``(T, H, W)``) for an attention
    of ``num_heads`` heads; ``options`` (``model.pos_options``) go to its constructor and are
    checked against what it accepts. A former name (:data:`RENAMED_POSITIONS`) builds today's
    member with a FutureWarning."""
    if name in RENAMED_POSITIONS:
        warnings.warn(
            f"position encoding {name!r} is now called {RENAMED_POSITIONS[name]!r} (the same module: state-dict "
            "keys and weights unchanged); the old name will be removed.",
            FutureWarning,
            stacklevel=2,
        )
        name = RENAMED_POSITIONS[name]
    if name not in POSITION_ENCODINGS:
        raise ValueError(f"unknown position encoding {name!r}; valid names: {', '.join(POSITION_ENCODINGS)}.")
    cls = POSITION_ENCODINGS[name]
    if len(grid) != cls.dims:
        kind = {2: "image grids (H, W)", 3: "clip grids (T, H, W)"}
        raise ValueError(
            f"position encoding {name!r} works on {kind[cls.dims]}, not on the grid {tuple(grid)}; "
            f"members for this grid: {', '.join(position_names(len(grid)))}."
        )
    options = dict(options or {})
    accepted = cls.options()
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = ", ".join(f"{key} (default {value!r})" for key, value in accepted.items()) or "none"
        raise ValueError(f"unknown options {unknown} for position encoding {name!r}; its options: {valid}.")
    return cls(grid, embed_dim, num_heads, **options)
