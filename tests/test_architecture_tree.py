"""``docs/architecture.md``'s tree names every top-level module of the package: each
``ijepa/*.py`` and each package folder, so that a new one cannot go undocumented."""

from __future__ import annotations

import re

from conftest import ROOT

PACKAGE = ROOT / "ijepa"


def top_level_modules() -> set[str]:
    """``name.py`` of each top-level module (but the package's ``__init__``), ``name/`` of each package."""
    modules = {path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    return modules | {f"{path.parent.name}/" for path in PACKAGE.glob("*/__init__.py")}


def tree_entries() -> set[str]:
    """The names in the first column of the tree's top level (two spaces in, under ``ijepa/``),
    e.g. ``cli.py, __main__.py`` -> ``cli.py``, ``__main__.py``."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    tree = re.search(r"```\nijepa/\n(.*?)```", text, re.S)
    assert tree, "docs/architecture.md has no ```ijepa/ ...``` tree"
    entries = set()
    for line in tree.group(1).splitlines():
        match = re.match(r"^  (\S.*?)(?:\s{2,}|$)", line)  # the top level only: nested entries are deeper
        if match:
            entries |= {name.strip() for name in match.group(1).split(",")}
    return entries


def test_the_architecture_tree_names_every_top_level_module():
    missing = sorted(top_level_modules() - tree_entries())
    assert not missing, f"add to docs/architecture.md's tree (one line each, what it is for): {missing}"


def test_the_tree_reader_sees_the_top_level_only():
    entries = tree_entries()
    assert {"cli.py", "__main__.py", "nn/", "module.py"} <= entries
    assert "vit.py" not in entries  # nested under nn/
