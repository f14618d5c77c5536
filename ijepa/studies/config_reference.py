"""The configuration reference, generated from the CLI's own parser (type hints + docstrings).

    python -m ijepa.studies.config_reference > docs/configuration.md

``tests/test_studies.py`` regenerates it and fails if ``docs/configuration.md`` is out of step
with the code, so the reference always matches ``ijepa fit --help``.
"""

from __future__ import annotations

import re
from unittest import mock

from ijepa.cli import LINKS, build_cli

HEADER = """# Configuration reference

Generated from the CLI's parser (the type hints and docstrings of `IJEPA` and
`IJEPADataModule`) by `python -m ijepa.studies.config_reference > docs/configuration.md`;
a test keeps it in step with `ijepa fit --help`. Any option can be set in a config's YAML
(`model:` / `data:` sections) or on the command line (`--model.depth 6`). Trainer options are
Lightning's (`ijepa fit --help`); callbacks are documented in `docs/training.md`.
"""


def _type_name(action) -> str:
    kind = getattr(action, "_typehint", None) or getattr(action, "type", None)
    text = getattr(kind, "__name__", None) if not hasattr(kind, "__args__") else None
    text = text or str(kind)
    return re.sub(r"\b(typing|builtins)\.", "", text).replace("NoneType", "None")


def reference() -> str:
    """The Markdown reference of every ``model.*`` and ``data.*`` option."""
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["--trainer.logger=false"], run=False)
    sections = {"model": [], "data": []}
    linked = {target: f"linked from `{source}`" for source, target in LINKS}
    for action in cli.parser._actions:
        dest = getattr(action, "dest", "")
        prefix = dest.split(".")[0]
        if prefix not in sections or dest.count(".") != 1 or dest.endswith((".help", ".class_path", ".init_args")):
            continue
        help_text = " ".join((action.help or "").split()).replace("|", "\\|")
        default = linked.get(dest) or f"`{action.default!r}`"
        sections[prefix].append(f"| `{dest}` | `{_type_name(action)}` | {default} | {help_text} |")
    for dest, note in linked.items():  # linked options are not parser actions of their own
        prefix = dest.split(".")[0]
        if not any(row.startswith(f"| `{dest}`") for row in sections[prefix]):
            sections[prefix].append(f"| `{dest}` | `int` | {note} | set once, on the other side of the link |")
    out = [HEADER]
    for prefix, title in (("model", "Model (`IJEPA`)"), ("data", "Data (`IJEPADataModule`)")):
        out += [
            f"## {title}",
            "",
            "| option | type | default | description |",
            "|---|---|---|---|",
            *sorted(sections[prefix]),
            "",
        ]
    return "\n".join(out)


def main() -> None:
    print(reference(), end="")


if __name__ == "__main__":
    main()
