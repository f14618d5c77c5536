"""The package's import graph: imports flow one way, from plain PyTorch up to the CLI and studies.

Every ``import ijepa...`` in every module, at the top or inside a function, is read from the
source (no import is executed) and checked against the layers below. A module may import its
own layer or any layer beneath it, never one above; within a layer the graph has no cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "ijepa"

# Bottom to top. A module belongs to the first entry that is its name or a parent package of it;
# the last entry is the package's own __init__ alone, so that a new module must be placed here.
LAYERS: list[tuple[str, ...]] = [
    # plain PyTorch: tokens, attention, positions, resizing of tensors; how members of a kind are
    # found; older formats mapped to today's (plain data)
    ("ijepa.nn", "ijepa.registry", "ijepa.legacy"),
    (
        "ijepa.regularizers",
        "ijepa.objectives",
        "ijepa.schedules",
        "ijepa.optim",
        "ijepa.masks",
        "ijepa.pictures",
        "ijepa.step",
        "ijepa.teachers",
    ),  # plain functions and modules; one step's two branches; how the target encoder moves
    # checkpoint files (and their former import path); data; the fsdp2 strategy
    ("ijepa.checkpoint", "ijepa.checkpoint_io", "ijepa.data", "ijepa.strategy"),
    ("ijepa.classifiers",),  # classifiers on frozen features: the probes' and ijepa eval's
    ("ijepa.module",),  # the LightningModule
    ("ijepa.interop",),  # other checkpoint formats, built on the module
    ("ijepa.distill",),  # a student against a frozen teacher: the module's subclass, teachers read by interop
    ("ijepa.callbacks",),
    # the commands (fit & co, eval), their errors that name the option, their checks before a launch
    # fine-tuning (ijepa finetune): an encoder opened as eval opens it, with a head, trained on labels
    (
        "ijepa.cli",
        "ijepa.launch",
        "ijepa.option_errors",
        "ijepa.preflight",
        "ijepa.config_paths",
        "ijepa.evaluation",
        "ijepa.finetune",
        "ijepa.__main__",
    ),
    ("ijepa.explore", "ijepa.studies", "ijepa.benchmark"),
    ("ijepa",),  # the package's own __init__
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(name: str) -> int:
    for index, prefixes in enumerate(LAYERS[:-1]):
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return index
    if name in LAYERS[-1]:  # the package's __init__, not its modules
        return len(LAYERS) - 1
    raise AssertionError(f"{name} is in no layer of LAYERS: add it where it belongs")


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_modules(source: str, name: str, is_package: bool = False) -> list[tuple[str, int, bool]]:
    """``(module, line, at_top)`` of every ijepa import in the source of module ``name``, relative
    imports resolved; ``at_top`` is False for an import inside a function or class."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from ijepa.nn import vit` imports the submodule ijepa.nn.vit too
            targets = [target] + [
                f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}")
            ]
        else:
            continue
        found += [(t, node.lineno, id(node) in top) for t in targets if t == "ijepa" or t.startswith("ijepa.")]
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))
GRAPH = {module_name(p): imported_modules(p.read_text(), module_name(p), p.name == "__init__.py") for p in SOURCES}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_no_module_imports_from_a_layer_above_its_own(path):
    importer = module_name(path)
    upward = [
        f"line {line}: {module} (layer {layer_of(module)} > {layer_of(importer)})"
        for module, line, _ in GRAPH[importer]
        if layer_of(module) > layer_of(importer)
    ]
    assert not upward, f"{importer} imports upward:\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycles():
    edges = {
        name: {module for module, _, _ in imports if module in GRAPH and module != name}
        for name, imports in GRAPH.items()
    }
    # a package's __init__ re-exporting its submodules is not a cycle with them
    for name in edges:
        edges[name] = {m for m in edges[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_ijepa_modules_are_imported_at_the_top_of_a_file(path):
    # a function-level import hides an edge from a reader (and often dodges a cycle)
    hidden = [f"line {line}: {module}" for module, line, at_top in GRAPH[module_name(path)] if not at_top]
    assert not hidden, f"{module_name(path)} imports inside a function:\n" + "\n".join(hidden)


def test_the_checker_finds_upward_hidden_and_relative_imports():
    source = "from . import vit\n\ndef f():\n    from ijepa.module import IJEPA\n"
    found = imported_modules(source, "ijepa.nn.probe")
    assert ("ijepa.nn.vit", 1, True) in found and ("ijepa.module", 4, False) in found
    assert layer_of("ijepa.nn.position") < layer_of("ijepa.masks") < layer_of("ijepa.module") < layer_of("ijepa.cli")
    assert layer_of("ijepa") == len(LAYERS) - 1
    with pytest.raises(AssertionError, match="add it where it belongs"):
        layer_of("ijepa.a_new_module")  # the last entry is the package's __init__ alone: no catch-all


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_no_module_imports_another_modules_private_names(path):
    private = [
        f"line {node.lineno}: {node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ijepa")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert not private, f"{module_name(path)} imports private names:\n" + "\n".join(private)
