"""The configuration reference, generated from the CLI's own parser (type hints + docstrings).

    python -m ijepa.studies.config_reference > docs/configuration.md

The ``model.*`` and ``data.*`` options come from the parser; data sources, regularisers,
objectives and the callbacks (every class :mod:`ijepa.callbacks` exports) from their
signatures and docstrings.

``tests/test_studies.py`` regenerates it and fails if ``docs/configuration.md`` is out of step
with the code, so the reference always matches ``ijepa fit --help``.
"""

from __future__ import annotations

import argparse
import inspect
import re
from unittest import mock

from lightning.pytorch import Callback

import ijepa.callbacks
from ijepa.cli import LINKS, build_cli
from ijepa.data.sources import DataSource, source_kinds
from ijepa.objectives import Objective, objective_kinds
from ijepa.regularizers import Regularizer, regularizer_kinds

# Every concrete source and regulariser the CLI has imported, in definition order.
SOURCES: tuple[type[DataSource], ...] = source_kinds()
REGULARIZERS: tuple[type[Regularizer], ...] = regularizer_kinds()
OBJECTIVES: tuple[type[Objective], ...] = objective_kinds()

HEADER = """# Configuration reference

Generated from the CLI's parser (the type hints and docstrings of `IJEPA` and
`IJEPADataModule`) by `python -m ijepa.studies.config_reference > docs/configuration.md`;
a test keeps it in step with `ijepa fit --help`. Any option can be set in a config's YAML
(`model:` / `data:` sections) or on the command line (`--model.depth 6`). Trainer options are
Lightning's (`ijepa fit --help`); callbacks (`trainer.callbacks`) are at the end, from their
signatures and docstrings.
"""


def _type_name(action) -> str:
    kind = getattr(action, "_typehint", None) or getattr(action, "type", None)
    text = getattr(kind, "__name__", None) if not hasattr(kind, "__args__") else None
    text = text or str(kind)
    return re.sub(r"\b(typing|builtins)\.", "", text).replace("NoneType", "None")


def argument_docs(cls: type) -> dict[str, str]:
    """``{name: text}`` from the ``Args:`` sections of ``cls``'s docstring and its bases' (the
    class's own text first)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if base.__module__.startswith("ijepa") and base.__doc__:
            docs.update(_own_argument_docs(base))
    return docs


def _own_argument_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    name = None
    in_args = False
    for line in inspect.cleandoc(cls.__doc__).splitlines():
        if line.strip() == "Args:":
            in_args = True
            continue
        if not in_args:
            continue
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            name = match.group(1)
            docs[name] = match.group(2)
        elif line.startswith("        ") and name:
            docs[name] += " " + line.strip()
        elif line.strip():
            break
    return docs


def prose_docs(cls: type) -> dict[str, str]:
    """``{name: sentence}``: for each ``__init__`` option, the first sentence of ``cls``'s docstring
    that names it as ````name```` (for classes whose docstring has no ``Args:`` section)."""
    text = re.sub(r"\n\s*\* ", "\n\n", inspect.getdoc(cls))  # a bullet is a sentence of its own
    sentences = [
        sentence.strip().rstrip(":") + ("" if sentence.strip().endswith((".", ";")) else ".")
        for paragraph in text.split("\n\n")
        for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z`(])", " ".join(paragraph.split()))
    ]
    docs = {}
    for name in inspect.signature(cls.__init__).parameters:
        named = re.compile(rf"``{name}``|``[^`]*\b{name}\b[^`]*``")  # ``name``, or in a formula
        found = [sentence for sentence in sentences if named.search(sentence)]
        if found:
            docs[name] = found[0]
    return docs


def _options(cls: type) -> list[tuple[str, inspect.Parameter]]:
    """``__init__``'s named options (not ``self``, ``*args``, ``**kwargs``)."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        (name, parameter)
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and parameter.kind not in variadic
    ]


def member_sections(title: str, intro: list[str], kinds, prose: bool = False) -> list[str]:
    """One table per member of a family chosen by ``class_path``: its own options (with ``prose``,
    an option the ``Args:`` section lacks is described by the docstring's sentence naming it)."""
    out = [title, "", *intro, ""]
    for cls in kinds:
        docs = {**prose_docs(cls), **argument_docs(cls)} if prose else argument_docs(cls)
        summary = " ".join(inspect.getdoc(cls).split("\n\n")[0].split()).replace("|", "\\|")
        out += [f"### `{cls.__name__}`", "", summary, ""]
        if not _options(cls):
            out += ["No options.", ""]
            continue
        out += ["| option | type | default | description |", "|---|---|---|---|"]
        for name, parameter in _options(cls):
            kind = re.sub(r"\b(typing|builtins)\.", "", str(parameter.annotation)).replace("NoneType", "None")
            text = " ".join(docs.get(name, "").split()).replace("|", "\\|")
            kind = kind.replace("|", "\\|")  # a union's bar would end the table cell
            out.append(f"| `{cls.__name__}.{name}` | `{kind}` | `{parameter.default!r}` | {text} |")
        out.append("")
    return out


def source_sections() -> list[str]:
    """One table per data source (``data.source.<option>`` once chosen)."""
    intro = [
        "Chosen by `class_path` (`ijepa.data.<Source>`); each owns the options below, set under",
        "`init_args` in YAML or as `--data.source.<option>` after `--data.source=<Source>`.",
    ]
    return member_sections("## Data sources (`data.source`, `data.probe_source`)", intro, SOURCES)


def regularizer_sections() -> list[str]:
    """One table per regulariser (an entry of ``model.regularizers``)."""
    intro = [
        "Each entry of the list is chosen by `class_path` (`ijepa.regularizers.<Regularizer>`) with",
        "the options below under `init_args`; the entries join the JEPA loss in list order.",
    ]
    return member_sections("## Regularisers (`model.regularizers`)", intro, REGULARIZERS)


def objective_sections() -> list[str]:
    """One table per objective (an entry of ``model.objectives``)."""
    intro = [
        "Each entry of the list is chosen by `class_path` (`ijepa.objectives.<Objective>`) with",
        'the options below under `init_args` (docs/training.md, "The levers").',
    ]
    return member_sections("## Objectives (`model.objectives`)", intro, OBJECTIVES)


def callback_kinds() -> tuple[tuple[type, ...], tuple[type, ...], tuple]:
    """What :mod:`ijepa.callbacks` exports (its ``__all__``): ``(callbacks, helper classes, functions)``."""
    exported = [getattr(ijepa.callbacks, name) for name in ijepa.callbacks.__all__]
    classes = [item for item in exported if inspect.isclass(item)]
    callbacks = tuple(cls for cls in classes if issubclass(cls, Callback))
    helpers = tuple(cls for cls in classes if not issubclass(cls, Callback))
    return callbacks, helpers, tuple(item for item in exported if not inspect.isclass(item))


def callback_sections() -> list[str]:
    """One table per class :mod:`ijepa.callbacks` exports, and a line per function it exports."""
    callbacks, helpers, functions = callback_kinds()
    intro = [
        "Each entry of `trainer.callbacks` is chosen by `class_path` (`ijepa.callbacks.<Callback>`) with",
        "the options below under `init_args`; remove an entry to switch it off. What each is for and",
        'when it acts: docs/training.md, "Callbacks".',
    ]
    out = member_sections("## Callbacks (`trainer.callbacks`)", intro, callbacks, prose=True)
    intro = ["Classes the callbacks are built of, exported for code (not entries of `trainer.callbacks`)."]
    out += member_sections("## Callback helpers (`ijepa.callbacks`)", intro, helpers, prose=True)
    out += ["Functions `ijepa.callbacks` exports:", "", "| function | what it does |", "|---|---|"]
    for function in functions:
        summary = " ".join(inspect.getdoc(function).split("\n\n")[0].split()).replace("|", "\\|")
        signature = str(inspect.signature(function)).replace("'", "").replace("|", "\\|")
        out.append(f"| `{function.__name__}{signature}` | {summary} |")
    out.append("")
    return out


def reference() -> str:
    """The Markdown reference of every ``model.*`` and ``data.*`` option."""
    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["--trainer.logger=false"], run=False)
    sections = {"model": [], "data": []}
    linked = {target: f"linked from `{source}`" for source, target in LINKS}
    for action in cli.parser._actions:
        dest = getattr(action, "dest", "")
        prefix = dest.split(".")[0]
        if prefix not in sections or "." not in dest or dest.endswith((".help", ".class_path", ".init_args")):
            continue
        if action.default == argparse.SUPPRESS:  # a group's own action (a config for it), not an option
            continue
        help_text = " ".join((action.help or "").split()).replace("|", "\\|")
        default = linked.get(dest) or f"`{action.default!r}`"
        kind = _type_name(action).replace("|", "\\|")  # a union's bar would end the table cell
        sections[prefix].append(f"| `{dest}` | `{kind}` | {default} | {help_text} |")
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
    out += source_sections()
    out += regularizer_sections()
    out += objective_sections()
    out += callback_sections()
    return "\n".join(out)


def main() -> None:
    print(reference(), end="")


if __name__ == "__main__":
    main()
