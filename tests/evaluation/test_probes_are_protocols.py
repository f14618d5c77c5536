"""One code under the in-fit probes and ``ijepa eval``: on the same features, each probe scores
exactly what the matching protocol reports for its selected (only) head."""

import pytest
import torch
from conftest import TINY_MODEL
from lightning.fabric import Fabric

from ijepa.callbacks import AttentiveProbe, KNNProbe, LinearProbe
from ijepa.classifiers.logistic import l2_of_C
from ijepa.data.sources import ShapesSource
from ijepa.evaluation import AttentiveProtocol, EvalData, KNNProtocol, LogRegProtocol
from ijepa.evaluation.cache import FeatureCache
from ijepa.evaluation.context import EvalContext
from ijepa.evaluation.encoders import open_encoder
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> EvalContext:
    torch.manual_seed(0)
    path = save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("same") / "tiny.ckpt")
    encoder, _ = open_encoder(str(path))
    data = EvalData(ShapesSource(train_size=320, val_size=96), batch_size=32, num_workers=0, val_fraction=0.2, seed=3)
    return EvalContext(
        Fabric(accelerator="cpu", devices=1), encoder, data, FeatureCache(None, {}), encoder.image_size, 3
    )


def bank_and_queries(ctx: EvalContext, kind: str):
    x_train, y_train, _, _ = ctx.train_val(kind, 1)
    x_test, y_test = ctx.features("test", kind, 1)
    return x_train, y_train, x_test, y_test


def test_the_knn_probe_scores_what_the_knn_protocol_tests(ctx):
    result = KNNProtocol(ks=[20], temperature=0.07).run(ctx)
    probe = KNNProbe(k=20, temperature=0.07).score(*bank_and_queries(ctx, "blocks"), ctx.num_classes)
    assert probe == result["test_top1"]


def test_the_linear_probe_scores_what_logistic_regression_of_the_same_penalty_tests(ctx):
    x_train, y_train, x_test, y_test = bank_and_queries(ctx, "blocks")
    C = 0.05
    result = LogRegProtocol(Cs=[C], max_iter=300).run(ctx)
    probe = LinearProbe(weight_decay=l2_of_C(C, len(x_train)), max_iter=300)
    assert probe.score(x_train, y_train, x_test, y_test, ctx.num_classes) == result["test_top1"]


def test_the_attentive_probe_scores_what_a_one_head_attentive_protocol_on_cached_tokens_tests(ctx):
    x_train, y_train, x_test, y_test = bank_and_queries(ctx, "tokens")
    epochs, batch_size = 2, 32
    protocol = AttentiveProtocol(
        lrs=[1e-3], weight_decays=[0.01], depth=1, num_heads=4, epochs=epochs, batch_size=batch_size, augment=False
    )
    result = protocol.run(ctx)
    steps = epochs * (len(x_train) // batch_size)
    probe = AttentiveProbe(num_heads=4, steps=steps, batch_size=batch_size, lr=1e-3, weight_decay=0.01, seed=ctx.seed)
    assert probe.score(x_train, y_train, x_test, y_test, ctx.num_classes) == result["test_top1"]
    assert result["steps"] == steps
