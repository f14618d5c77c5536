"""The marimo notebooks in docs/notebooks run headless, as scripts do, on generated data."""

import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow  # end-to-end runs: `pytest -m "not slow"` skips them

NOTEBOOKS = ROOT / "docs" / "notebooks"


def test_every_notebook_runs_as_a_script():
    for name in ("positions", "patches_and_masks", "encoder_debug"):
        result = subprocess.run(
            [sys.executable, str(NOTEBOOKS / f"{name}.py")], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-2000:]
