"""``ijepa eval``'s grids: every head of a grid trained in one pass scores as that head trained
alone (ten evaluations of a random-init tiny encoder, so an end-to-end run)."""

from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.data.sources import ShapesSource
from ijepa.evaluation import AttentiveProtocol, EvalData, Evaluation, LinearProtocol
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA

pytestmark = pytest.mark.slow

SOURCE = {"train_size": 320, "val_size": 96}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("eval") / "tiny.ckpt")


def evaluate(checkpoint, protocols, tmp_path, **options) -> list[dict]:
    data = EvalData(source=ShapesSource(**SOURCE), batch_size=32, num_workers=0, val_fraction=0.2)
    options = {"data": data, "output_dir": str(tmp_path / "out"), "accelerator": "cpu", **options}
    return Evaluation(str(checkpoint), protocols, **options).run()


def test_a_grid_trained_in_one_pass_scores_as_each_head_trained_alone(checkpoint, tmp_path):
    for protocol in (LinearProtocol, AttentiveProtocol):
        extra = {"num_heads": 2} if protocol is AttentiveProtocol else {}
        grid = evaluate(
            checkpoint,
            [protocol(lrs=[1e-3, 1e-2], weight_decays=[0.0, 0.05], epochs=2, **extra)],
            tmp_path / "grid",
            cache=False,
        )[0]
        for head in grid["heads"]:
            lr, wd = head["settings"]["lr"], head["settings"]["weight_decay"]
            alone = evaluate(
                checkpoint, [protocol(lrs=[lr], weight_decays=[wd], epochs=2, **extra)], tmp_path / "alone", cache=False
            )[0]
            assert alone["heads"][0]["val_top1"] == pytest.approx(head["val_top1"], abs=1e-9), head["name"]
