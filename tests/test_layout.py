"""The test suite's own layout, read from the source: ``pytest -m "not slow"`` is exactly the suite
without tests/end_to_end/, and no test module imports another."""

import ast
from pathlib import Path

import pytest
import torch
from conftest import TESTS

END_TO_END = TESTS / "end_to_end"
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def is_slow_mark(node: ast.expr) -> bool:
    """``pytest.mark.slow``, also inside a list of marks."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(is_slow_mark(element) for element in node.elts)
    return ast.unparse(node) == "pytest.mark.slow"


def module_is_slow(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and is_slow_mark(node.value)
        for node in tree.body
    )


def functions_of(tree: ast.Module):
    """Test functions, at module level and in ``Test*`` classes, with whether each is marked slow."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            functions = [(item, node.decorator_list) for item in node.body]
        else:
            functions = [(node, [])]
        for function, outer in functions:
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and function.name.startswith("test"):
                yield function.name, any(is_slow_mark(d) for d in [*outer, *function.decorator_list])


def test_every_slow_test_is_an_end_to_end_test_and_every_end_to_end_test_is_slow():
    misplaced, unmarked = [], []
    for path in TEST_FILES:
        tree = ast.parse(path.read_text(), filename=str(path))
        whole_module = module_is_slow(tree)
        in_end_to_end = END_TO_END in path.parents
        for name, marked in functions_of(tree):
            slow = whole_module or marked
            where = f"{path.relative_to(TESTS)}::{name}"
            if slow and not in_end_to_end:
                misplaced.append(where)
            if in_end_to_end and not whole_module:
                unmarked.append(where)
    assert not misplaced, f"slow tests belong in tests/end_to_end/: {misplaced}"
    assert not unmarked, f"tests/end_to_end/ modules mark every test: pytestmark = pytest.mark.slow: {unmarked}"


def test_test_file_basenames_are_unique_and_no_test_module_imports_another():
    names = [path.name for path in TEST_FILES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    modules = {Path(name).stem for name in names}
    imports = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            imports += [f"{path.relative_to(TESTS)}: {name}" for name in imported if name.split(".")[-1] in modules]
    assert not imports, f"shared helpers go to tests/helpers.py or tests/conftest.py: {imports}"


@pytest.mark.parametrize(
    "source, slow",
    [
        ("pytestmark = pytest.mark.slow\ndef test_a(): pass", True),
        ("pytestmark = [pytest.mark.slow]\ndef test_a(): pass", True),
        ("@pytest.mark.slow\ndef test_a(): pass", True),
        ("class TestA:\n    @pytest.mark.slow\n    def test_a(self): pass", True),
        ("@pytest.mark.parametrize('x', [1])\ndef test_a(x): pass", False),
    ],
    ids=["module", "module-list", "function", "method", "another-mark"],
)
def test_the_layout_check_reads_a_slow_mark_wherever_it_is_written(source, slow):
    tree = ast.parse(source)
    assert [module_is_slow(tree) or marked for _, marked in functions_of(tree)] == [slow]


def test_a_deprecation_met_by_the_projects_own_code_fails_the_test(tmp_path):
    # pyproject's filterwarnings: error::DeprecationWarning:ijepa.* (the next deprecation is seen the day it appears)
    import warnings

    with pytest.raises(DeprecationWarning, match="old API"):
        warnings.warn_explicit("old API", DeprecationWarning, filename="ijepa/x.py", lineno=1, module="ijepa.x")
    with pytest.warns(DeprecationWarning, match="theirs"):  # a library's: warned, not raised
        warnings.warn_explicit("theirs", DeprecationWarning, filename="lib.py", lineno=1, module="somelib")
    # the studies' image folders are written without one (torchvision's encoders: deprecated since 0.29)
    from ijepa.studies.learning import write_png

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_png(torch.zeros(3, 4, 4, dtype=torch.uint8), tmp_path / "a.png")
        write_png(torch.zeros(1, 4, 4, dtype=torch.uint8), tmp_path / "m.png")
    from PIL import Image

    assert Image.open(tmp_path / "a.png").mode == "RGB" and Image.open(tmp_path / "m.png").mode == "L"
