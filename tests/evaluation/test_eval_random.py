"""``ijepa eval --checkpoint random``: an architecture's fresh initialisation as the from-scratch baseline."""

import pytest
import torch
from conftest import TINY_CONFIG

from ijepa.cli import instantiate
from ijepa.data.sources import ShapesSource
from ijepa.evaluation import EvalData, Evaluation, KNNProtocol
from ijepa.evaluation.encoders import open_encoder
from ijepa.evaluation.runner import main

ARCH = {"image_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}


def test_random_builds_the_encoder_ijepa_fit_would_start_from_at_that_seed():
    model, _ = instantiate(TINY_CONFIG, ["--seed_everything=3"])
    frozen, described = open_encoder("random", architecture=str(TINY_CONFIG), seed=3)
    fit_start = model.target_encoder.state_dict()
    assert frozen.network.state_dict().keys() == fit_start.keys()
    assert all(torch.equal(value, fit_start[key]) for key, value in frozen.network.state_dict().items())
    assert described["format"] == "random" and described["seed"] == 3
    again, _ = open_encoder("random", architecture=str(TINY_CONFIG), seed=3)
    other, _ = open_encoder("random", architecture=str(TINY_CONFIG), seed=4)
    weights = lambda e: list(e.network.state_dict().values())  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(weights(frozen), weights(again)))
    assert not all(torch.equal(a, b) for a, b in zip(weights(frozen), weights(other)))


def test_random_without_an_architecture_and_an_architecture_with_a_file_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="checkpoint=random needs an architecture"):
        open_encoder("random")
    with pytest.raises(ValueError, match="architecture: unknown options \\['width'\\]"):
        open_encoder("random", architecture={"width": 3})
    with pytest.raises(ValueError, match="architecture is for checkpoint=random"):
        Evaluation(str(tmp_path / "x.ckpt"), [KNNProtocol()], architecture=ARCH, output_dir=str(tmp_path))


def test_ijepa_eval_scores_a_random_encoder_and_names_it_in_the_results(tmp_path):
    out = tmp_path / "out"
    config = tmp_path / "eval.yaml"
    config.write_text(
        "data:\n  source:\n    class_path: ijepa.data.ShapesSource\n    init_args: {train_size: 120, val_size: 40}\n"
        "  batch_size: 40\n  num_workers: 0\n  val_fraction: 0.2\nprotocols:\n"
        "  - class_path: ijepa.evaluation.KNNProtocol\n    init_args: {ks: [5]}\n"
    )
    (result,) = main(
        ["--config", str(config), "--checkpoint", "random", "--architecture", str(TINY_CONFIG)]
        + ["--output_dir", str(out), "--accelerator", "cpu"]
    )
    assert result["checkpoint"]["format"] == "random" and result["checkpoint"]["architecture"]["depth"] >= 1
    assert 0 <= result["test_top1"] <= 1
    data = EvalData(source=ShapesSource(train_size=120, val_size=40), batch_size=40, num_workers=0, val_fraction=0.2)
    (again,) = Evaluation(
        "random", [KNNProtocol(ks=[5])], data=data, architecture=ARCH, output_dir=str(tmp_path / "b"), accelerator="cpu"
    ).run()
    assert again["checkpoint"]["architecture"] == ARCH
