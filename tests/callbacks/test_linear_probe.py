"""The linear probe: separable features are classified, shuffled labels are not."""

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.callbacks import LinearProbe
from ijepa.classifiers import fit_logistic
from ijepa.module import IJEPA

CENTRES = torch.randn(5, 16, generator=torch.Generator().manual_seed(0)) * 3


def separable(n, seed):
    """Five well-separated Gaussian classes, offset from 0 (so standardisation matters)."""
    labels = torch.arange(n) % 5
    return CENTRES[labels] + 0.5 * torch.randn(n, 16, generator=torch.Generator().manual_seed(seed)) + 10.0, labels


def accuracy(layer, x, y):
    with torch.no_grad():
        return (layer(x).argmax(1) == y).float().mean().item()


def test_linearly_separable_features_are_classified_almost_perfectly():
    x, y = separable(500, seed=1)
    test_x, test_y = separable(500, seed=2)
    layer = fit_logistic(x, y, 5, l2=1e-4, max_iter=200)
    assert accuracy(layer, x, y) > 0.99 and accuracy(layer, test_x, test_y) > 0.98


def test_shuffled_labels_give_chance_on_held_out_data():
    x, y = separable(600, seed=1)
    shuffled = y[torch.randperm(600, generator=torch.Generator().manual_seed(3))]
    layer = fit_logistic(x[:400], shuffled[:400], 5, l2=1e-4, max_iter=200)
    assert accuracy(layer, x[400:], shuffled[400:]) < 0.35  # chance is 0.2


def test_probe_callback_reports_val_linear_top1(make_datamodule, make_trainer):
    data = make_datamodule(train_size=200, val_size=100)
    trainer = make_trainer(callbacks=[LinearProbe(max_iter=50)], limit_val_batches=1)
    metrics = trainer.validate(IJEPA(**TINY_MODEL), datamodule=data, verbose=False)[0]
    assert 0.0 <= metrics["val/linear_top1"] <= 1.0
    metrics = trainer.test(IJEPA(**TINY_MODEL), datamodule=data, verbose=False)[0]
    assert "test/linear_top1" in metrics


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_n_epochs": 0}, "every_n_epochs"),
        ({"encoder": "ema"}, "encoder"),
        ({"last_blocks": 0}, "last_blocks must be >= 1"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearProbe(**kwargs)


def test_pooled_features_of_the_last_blocks():
    from ijepa.nn import VisionTransformer

    encoder = VisionTransformer.for_images(32, 8, embed_dim=32, depth=3, num_heads=2, pos_embed="rope_mixed").eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        last = encoder.pooled_features(images)
        three = encoder.pooled_features(images, last_blocks=3)
        torch.testing.assert_close(last, encoder(images).mean(1))
        assert three.shape == (2, 96)
        torch.testing.assert_close(three[:, 64:], last)  # oldest block first, the last block last
        assert not torch.allclose(three[:, :32], last)
    with pytest.raises(ValueError, match=r"count must be in 1\.\.3"):
        encoder.pooled_features(images, last_blocks=4)


def test_probe_runs_at_start_and_end_of_fit_on_several_blocks(tmp_path, make_datamodule, make_trainer):
    from lightning.pytorch.loggers import CSVLogger

    data = make_datamodule()
    logger = CSVLogger(tmp_path)
    trainer = make_trainer(
        callbacks=[LinearProbe(max_iter=20, last_blocks=2)], logger=logger, max_steps=2, limit_val_batches=0
    )
    trainer.fit(IJEPA(**TINY_MODEL), datamodule=data)
    import csv

    with open(f"{logger.log_dir}/metrics.csv") as file:
        steps = [int(row["step"]) for row in csv.DictReader(file) if row.get("val/linear_top1")]
    assert steps == [0, 2]
    with pytest.raises(ValueError, match=r"last_blocks must be in 1\.\.2 \(the encoder depth\), got 3"):
        make_trainer(callbacks=[LinearProbe(last_blocks=3)], max_steps=1, limit_val_batches=0).fit(
            IJEPA(**TINY_MODEL), datamodule=data
        )


def test_knn_and_linear_probes_encode_the_data_once_per_weights(make_datamodule, make_trainer):
    from unittest import mock

    from ijepa.callbacks import KNNProbe

    data = make_datamodule(train_size=100, val_size=50, batch_size=50)
    model = IJEPA(**TINY_MODEL)
    trainer = make_trainer(callbacks=[KNNProbe(), LinearProbe(max_iter=20)], limit_val_batches=1)
    with mock.patch.object(IJEPA, "features", autospec=True, side_effect=IJEPA.features) as features:
        first = trainer.validate(model, datamodule=data, verbose=False)[0]
        assert features.call_count == 2  # one bank batch + one query batch, shared by the two probes
        again = trainer.validate(model, datamodule=data, verbose=False)[0]
        assert features.call_count == 2 and again == first  # same weights: same features, not re-encoded
        with torch.no_grad():
            model.target_encoder.patch_embed.proj.weight.mul_(0.5)  # other weights at the same step
        trainer.validate(model, datamodule=data, verbose=False)
        assert features.call_count == 4
