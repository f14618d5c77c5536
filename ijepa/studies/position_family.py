"""The family table of ``docs/position_embeddings.md``, read from the registry.

``python -m ijepa.studies.position_family`` prints one row per member of
``ijepa.nn.position.POSITION_ENCODINGS``: config name, class, grid, the hooks it acts through,
its own options (``model.pos_options``) with their defaults, its parameter count on the
ViT-Tiny/8 grid at 96 px (12 x 12, or 4 x 12 x 12 for clips; width 192, 3 heads) and its
docstring; ``--write`` puts it between the markers of ``docs/position_embeddings.md``. A test
keeps the docs' copy equal to this output.
"""

from __future__ import annotations

import inspect

from ijepa.nn.position import POSITION_ENCODINGS

BEGIN = "<!-- family table: python -m ijepa.studies.position_family -->"
END = "<!-- end of family table -->"
ACTS = {"add_to_tokens": "added to the tokens", "attention_positions": "attention", "after_block": "after a block"}


def describe(cls) -> str:
    return " ".join(inspect.getdoc(cls).split()).replace("``", "`").replace("|", "\\|")


def table() -> str:
    lines = [
        "| `pos_embed` | class | grid | acts | `pos_options` (defaults) | parameters at 12x12, D=192, 3 heads | what it is |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, cls in POSITION_ENCODINGS.items():
        grid = (4, 12, 12)[-cls.dims :]
        count = sum(p.numel() for p in cls(grid, 192, 3).parameters())
        options = ", ".join(f"`{key}: {value}`" for key, value in cls.options().items()) or "-"
        acts = ", ".join(ACTS[hook] for hook in cls.hooks()) or "-"
        kind = "image (H, W)" if cls.dims == 2 else "clip (T, H, W)"
        lines.append(f"| `{name}` | `{cls.__name__}` | {kind} | {acts} | {options} | {count:,} | {describe(cls)} |")
    return "\n".join(lines)


def block() -> str:
    """The table between its markers, as it stands in the docs."""
    return f"{BEGIN}\n{table()}\n{END}"


def write(path: str = "docs/position_embeddings.md") -> None:
    """Replace the table between its markers in ``path``."""
    with open(path) as f:
        text = f.read()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    with open(path, "w") as f:
        f.write(text[:start] + block() + text[end:])


if __name__ == "__main__":
    import sys

    write() if "--write" in sys.argv[1:] else print(block())
