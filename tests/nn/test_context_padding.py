"""Padded contexts (``context_policy: pad``): padding changes no real token's output, for every
position encoding, in the encoder and in both predictor modes."""

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.data.batch import GridBatch
from ijepa.masks import MultiBlockMaskSampler, context_padding_mask
from ijepa.module import IJEPA
from ijepa.nn.position import position_names
from ijepa.regularizers import ContextTokens, SIGReg, pooled_tokens, sample_tokens


def padded_batch(batch_size=6, grid=4, seed=0):
    sampler = MultiBlockMaskSampler(
        grid, num_target_blocks=3, target_scale=(0.1, 0.15), min_keep=2, context_policy="pad"
    )
    generator = torch.Generator().manual_seed(seed)
    for _ in range(50):  # a batch whose contexts differ in length
        context, targets = sampler(batch_size, generator)
        mask = context_padding_mask(context)
        if not mask.all():
            return context, targets, mask
    raise AssertionError("no batch with padding")


# one_pass refuses peg in the predictor (a convolution over the grid would mix the blocks)
CASES = [
    (pos, mode) for pos in position_names(2) for mode in ("per_block", "one_pass") if (pos, mode) != ("peg", "one_pass")
]


@pytest.mark.parametrize("pos_embed, predictor_mode", CASES)
def test_padding_changes_no_real_output(pos_embed, predictor_mode):
    torch.manual_seed(0)
    model = IJEPA(
        **TINY_MODEL, pos_embed=pos_embed, predictor_pos_embed=pos_embed, predictor_mode=predictor_mode
    ).eval()
    context, targets, mask = padded_batch()
    images = torch.randn(context.size(0), 3, 32, 32)
    with torch.no_grad():
        encoded = model.encoder(images, context, token_mask=mask)
        predicted = model.predictor(encoded, context, targets, context_mask=mask)
        for i in range(context.size(0)):
            keep = int(mask[i].sum())
            alone = model.encoder(images[i : i + 1], context[i : i + 1, :keep])
            torch.testing.assert_close(encoded[i, :keep], alone[0], atol=1e-5, rtol=1e-5)
            alone_prediction = model.predictor(alone, context[i : i + 1, :keep], targets[i : i + 1])
            torch.testing.assert_close(predicted[i], alone_prediction[0], atol=1e-5, rtol=1e-5)


def test_padded_loss_trains_and_sigreg_sees_only_real_tokens():
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL, regularizers=[SIGReg(weight=0.1, input="pooled")])
    context, targets, mask = padded_batch()
    images = torch.randn(context.size(0), 3, 32, 32)
    batch = GridBatch(images, context, targets, context_mask=mask)
    optimizer = model.build_optimizer()
    losses = []
    for _ in range(5):
        loss = model.jepa_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    encoded = torch.randn(*context.shape, 32)
    pooled = pooled_tokens(ContextTokens(encoded, mask))
    for i in range(context.size(0)):
        assert torch.allclose(pooled[i], encoded[i][mask[i]].mean(0), atol=1e-6)
    tokens = sample_tokens(ContextTokens(encoded, mask), count=10_000, step=0, rank=0)
    assert tokens.shape == (int(mask.sum()), 32)  # every real token, no padding
    assert torch.equal(tokens.sort(0).values, encoded[mask].sort(0).values)
