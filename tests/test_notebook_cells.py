"""The marimo notebooks' cells, run in this process with their UI elements stood in for."""

import importlib.util
import types

import pytest
import torch
from conftest import ROOT, TINY_CONFIG, TINY_MODEL, save_tiny_checkpoint

from ijepa.module import IJEPA
from ijepa.nn.position import POSITION_ENCODINGS, AdditivePosition, position_names

NOTEBOOKS = ROOT / "docs" / "notebooks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"notebook_{name}", NOTEBOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


def ui(value):
    """Stands in for a marimo UI element: the notebook only reads ``.value``."""
    return types.SimpleNamespace(value=value)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = IJEPA(**{**TINY_MODEL, "pos_embed": "learned"})
    return str(save_tiny_checkpoint(model, tmp_path_factory.mktemp("notebooks") / "tiny.ckpt"))


@pytest.mark.parametrize("kind", position_names(2))
def test_positions_notebook_for_every_type(kind):
    _, defs = load("positions").run(
        defs={"kind": ui(kind), "grid": ui(5), "width": ui(32), "heads": ui(2), "checkpoint": ui("")}
    )
    assert type(defs["position"]) is POSITION_ENCODINGS[kind]
    has_table = issubclass(POSITION_ENCODINGS[kind], AdditivePosition)
    assert ("Image" in repr(defs["table_view"]) or "img" in str(defs["table_view"].text)) == has_table
    has_relation = "attention_positions" in POSITION_ENCODINGS[kind].hooks()
    assert ("<img" in defs["relation_view"].text) == has_relation


def test_positions_notebook_shows_a_checkpoints_table(checkpoint):
    _, defs = load("positions").run(
        defs={"kind": ui("sincos"), "grid": ui(6), "width": ui(64), "heads": ui(4), "checkpoint": ui(checkpoint)}
    )
    assert type(defs["position"]).__name__ == "LearnedPosition" and defs["position"].grid_height == 4


def test_patches_and_masks_notebook_samples_the_chosen_masks():
    _, defs = load("patches_and_masks").run()
    assert defs["grid_size"] == 6 and defs["targets"].shape[1] == 4
    assert not set(defs["context"].flatten().tolist()) & set(defs["targets"].flatten().tolist())
    assert defs["stats"]["target_frequency"].shape == (6, 6)


def test_encoder_debug_notebook_on_a_checkpoint(checkpoint):
    _, defs = load("encoder_debug").run()
    assert defs["on_all"]["output_shape"] == (8, 36, 128) and torch.isfinite(defs["loss"])
    tiny = str(TINY_CONFIG)
    _, defs = load("encoder_debug").run(
        defs={
            "config": ui(tiny),
            "overrides": ui("--data.num_workers=0"),
            "checkpoint": ui(checkpoint),
            "device": ui("cpu"),
            "batch_size": ui(4),
        }
    )
    assert defs["on_all"]["output_shape"] == (4, 16, 32)
    assert all(value > 0 for value in defs["on_context"]["grad_norms"].values())
