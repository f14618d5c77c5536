"""The family's registry: config name -> class, found from the classes themselves
(:func:`ijepa.registry.concrete_subclasses` over every file of ``ijepa.nn.position``), image
members first, then clip members, each group by name. A new member is a class with a ``name``
in a file of this package; nothing else lists it."""

from __future__ import annotations

from ijepa.legacy import position_name
from ijepa.nn.position.base import AdditivePosition, PositionEncoding
from ijepa.nn.resize import Grid
from ijepa.registry import concrete_subclasses, import_modules

import_modules("ijepa.nn.position")
POSITION_ENCODINGS: dict[str, type[PositionEncoding]] = {
    cls.name: cls for cls in sorted(concrete_subclasses(PositionEncoding), key=lambda c: (c.dims, c.name)) if cls.name
}


def position_names(dims: int | None = None) -> tuple[str, ...]:
    """Registered config names, in registry order; only those for ``dims``-axis grids if given
    (2: images, 3: clips)."""
    return tuple(name for name, cls in POSITION_ENCODINGS.items() if dims is None or cls.dims == dims)


def additive_positions(dims: int = 2) -> tuple[str, ...]:
    """Registered members that add a table to the tokens (``AdditivePosition``), for ``dims``-axis grids."""
    return tuple(name for name in position_names(dims) if issubclass(POSITION_ENCODINGS[name], AdditivePosition))


def packable_positions() -> tuple[str, ...]:
    """Registered members that NaViT packing can use (``packable``), in registry order."""
    return tuple(name for name, cls in POSITION_ENCODINGS.items() if cls.packable)


def build_position_encoding(
    name: str, grid: Grid, embed_dim: int, num_heads: int = 1, options: dict | None = None
) -> PositionEncoding:
    """The member called ``name`` over ``grid`` (``(H, W)`` or ``(T, H, W)``) for an attention
    of ``num_heads`` heads; ``options`` (``model.pos_options``) go to its constructor and are
    checked against what it accepts. A former name (:data:`ijepa.legacy.RENAMED_POSITIONS`)
    builds today's member with a FutureWarning."""
    name = position_name(name)
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
