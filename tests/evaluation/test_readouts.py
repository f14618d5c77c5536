"""Readouts: how the pooled-feature protocols read tokens. The mean-pool and a spatial readout
(the token grid pooled to ``g x g`` cells, or every token) have exact shapes and values, read
raw pixels as they read an encoder, key their own cached features, and refuse a grid the
encoder's tokens cannot hold in one line naming ``readout.grid``."""

import json

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.data.sources import ShapesSource
from ijepa.evaluation import (
    EvalData,
    Evaluation,
    GridReadout,
    KNNProtocol,
    LinearProtocol,
    LogRegProtocol,
    MeanReadout,
    readout_kinds,
)
from ijepa.evaluation.encoders import PixelEncoder, ViTEncoder, random_encoder
from ijepa.evaluation.runner import main

SOURCE = {"train_size": 120, "val_size": 40}
ARCH = {key: TINY_MODEL[key] for key in ("image_size", "patch_size", "embed_dim", "depth", "num_heads")}


def test_the_mean_readout_averages_every_token_of_each_block():
    tokens = torch.randn(2, 3, 36, 5)
    assert torch.equal(MeanReadout().pool(tokens, (6, 6)), tokens.mean(2))
    assert MeanReadout().width(5, (6, 6)) == 5 and MeanReadout().kind == "blocks"


def test_a_grid_readout_is_each_cells_mean_in_row_major_order():
    tokens = torch.randn(2, 3, 36, 5)  # [B, L, K, D] on a 6x6 grid
    pooled = GridReadout(2).pool(tokens, (6, 6))
    assert pooled.shape == (2, 3, 4 * 5) and GridReadout(2).width(5, (6, 6)) == 20
    maps = tokens.view(2, 3, 6, 6, 5)
    for cell, (r, c) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        expected = maps[:, :, 3 * r : 3 * r + 3, 3 * c : 3 * c + 3].mean(dim=(2, 3))
        torch.testing.assert_close(pooled[..., cell * 5 : cell * 5 + 5], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(GridReadout(1).pool(tokens, (6, 6)), tokens.mean(2), rtol=0, atol=1e-6)
    assert torch.equal(GridReadout(None).pool(tokens, (6, 6)), tokens.flatten(2))
    assert GridReadout(None).width(5, (6, 6)) == 180
    assert [GridReadout(2).kind, GridReadout(None).kind] == ["blocks:grid2", "blocks:tokens"]


def test_a_side_the_grid_does_not_divide_gets_adaptive_cells():
    tokens = torch.randn(1, 1, 25, 2)
    pooled = GridReadout(2).pool(tokens, (5, 5))
    maps = tokens.view(5, 5, 2)
    torch.testing.assert_close(pooled[0, 0, :2], maps[:3, :3].mean(dim=(0, 1)), rtol=0, atol=1e-6)  # cells 0-2, 2-4


def test_pixels_are_read_as_an_encoder_is_their_patches_pooled_alike():
    encoder = PixelEncoder(16, 8)
    images = torch.randn(3, 3, 16, 16)
    patches = encoder.tokens(images)  # [B, 4, 192]
    assert torch.equal(encoder.block_means(images, 1)[:, 0], patches.mean(1)) and encoder.width == 192
    whole = GridReadout(None).pool(encoder.block_tokens(images, 1), encoder.token_shape)[:, 0]
    assert whole.shape == (3, 3 * 16 * 16)
    assert torch.equal(whole.sort(1).values, images.flatten(1).sort(1).values)  # the image, its values reordered
    torch.testing.assert_close(GridReadout(2).pool(encoder.block_tokens(images, 1), (2, 2))[:, 0], whole)


def test_an_encoders_mean_readout_is_its_block_means():
    encoder = ViTEncoder(random_encoder(ARCH))
    images = torch.randn(2, 3, 32, 32)
    grid = encoder.token_shape
    torch.testing.assert_close(
        MeanReadout().pool(encoder.block_tokens(images, 2), grid), encoder.block_means(images, 2)
    )


@pytest.mark.parametrize(
    "grid, match",
    [
        (0, r"readout.grid must be >= 1, got 0"),
        (5, r"readout.grid must be in 1..4 \(the encoder's token grid is 4x4\), got 5"),
    ],
)
def test_a_grid_the_tokens_cannot_hold_is_one_line(grid, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        readout = GridReadout(grid)
        data = EvalData(ShapesSource(**SOURCE), image_size=32, batch_size=40, num_workers=0, val_fraction=0.25)
        Evaluation("pixels", [KNNProtocol(ks=[5], readout=readout)], data=data, output_dir=str(tmp_path)).run()


def test_each_readout_keys_its_own_features_and_is_recorded(tmp_path):
    data = EvalData(ShapesSource(**SOURCE), image_size=32, batch_size=40, num_workers=0, val_fraction=0.25)
    protocols = [
        KNNProtocol(ks=[5]),
        KNNProtocol(ks=[5], readout=GridReadout(2), name="knn_grid"),
        LogRegProtocol(Cs=[1.0], readout=GridReadout(None), name="logreg_tokens"),
        LinearProtocol(
            lrs=[0.1], weight_decays=[0.0], epochs=1, augment=False, readout=GridReadout(2), name="linear_grid"
        ),
    ]
    results = Evaluation("random", protocols, data=data, output_dir=str(tmp_path), architecture=ARCH).run()
    extracted = [
        {split for split, _ in r["features"]["extracted"]} | {kind for _, kind in r["features"]["extracted"]}
        for r in results
    ]
    assert extracted[0] == {"train", "test", "blocks"}
    assert extracted[1] == {"train", "test", "blocks:grid2"}
    assert extracted[2] == {"train", "test", "blocks:tokens"}
    assert results[3]["features"]["extracted"] == []  # the grid features of knn_grid, reused
    assert results[1]["settings"]["readout"] == {
        "class_path": "ijepa.evaluation.readouts.GridReadout",
        "init_args": {"grid": 2},
    }
    assert results[0]["settings"]["readout"]["class_path"].endswith("MeanReadout")
    saved = json.loads((tmp_path / "knn_grid.json").read_text())
    assert saved["settings"]["readout"]["init_args"] == {"grid": 2}


def test_the_cli_takes_a_readout_by_class_path(tmp_path):
    results = main(
        [
            "--checkpoint", "pixels", "--pixel_patch_size", "8", "--output_dir", str(tmp_path),
            "--data.source", "ijepa.data.ShapesSource", "--data.source.train_size", "120", "--data.source.val_size", "40",
            "--data.image_size", "32", "--data.num_workers", "0", "--data.val_fraction", "0.25",
            "--protocols", json.dumps([
                {"class_path": "ijepa.evaluation.KNNProtocol", "init_args": {"ks": [5], "name": "knn_tokens",
                 "readout": {"class_path": "ijepa.evaluation.GridReadout", "init_args": {"grid": None}}}},
            ]),
        ]
    )  # fmt: skip
    assert results[0]["settings"]["readout"]["init_args"] == {"grid": None}
    assert {kind for _, kind in results[0]["features"]["extracted"]} == {"blocks:tokens"}


def test_the_readout_registry_lists_the_kinds():
    assert {kind.__name__ for kind in readout_kinds()} >= {"MeanReadout", "GridReadout"}
