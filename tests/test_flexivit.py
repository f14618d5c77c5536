"""FlexiViT training: a patch size per batch, the kernel and position encoding resized on the fly
by the same functions a checkpoint load applies."""

import pytest
import torch
from conftest import TINY_MODEL

from ijepa.checkpoint import resize_state_dict
from ijepa.data import IJEPADataModule, ShapesSource
from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA
from ijepa.nn.patch import PatchEmbed
from ijepa.nn.position import build_position_encoding, position_names
from ijepa.step import step_patch_size

IMAGE_MODEL = {**TINY_MODEL, "image_size": 48, "patch_size": 8}  # grids 6 (p 8), 4 (p 12), 3 (p 16), 8 (p 6)
SIZES = (6, 12, 16)


def flexi_model(pos_embed: str, seed: int = 0) -> IJEPA:
    torch.manual_seed(seed)
    predictor_pos = pos_embed if pos_embed != "peg" else "sincos"
    model = IJEPA(**IMAGE_MODEL, pos_embed=pos_embed, predictor_pos_embed=predictor_pos).eval()
    with torch.no_grad():  # away from the init, so every table and kernel entry matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def resized_single_model(model: IJEPA, patch_size: int) -> IJEPA:
    """The model rebuilt at ``patch_size`` with its checkpoint resized, as a load at that size does."""
    other = IJEPA(**{**model.hparams, "patch_size": patch_size}).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grid = model.hparams.image_size // model.hparams.patch_size
    resize_state_dict(other, state, (grid, grid), model.hparams.patch_size)
    other.load_state_dict(state)
    return other


@pytest.mark.parametrize("pos_embed", position_names(2))
def test_a_flexivit_model_at_each_patch_size_equals_the_kernel_resized_single_model(pos_embed):
    model = flexi_model(pos_embed)
    images = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    for patch_size in SIZES:
        single = resized_single_model(model, patch_size)
        side = 48 // patch_size
        context = torch.tensor([[0, 1, 2, side + 1], [1, 2, side, side + 2]])
        targets = torch.tensor([[[side * 2, side * 2 + 1]], [[side * 2 + 1, side * 2 + 2]]])
        with torch.no_grad():
            torch.testing.assert_close(
                model.target_encoder(images, patch_size=patch_size), single.target_encoder(images), rtol=0, atol=0
            )
            features = model.encoder(images, context, patch_size=patch_size)
            torch.testing.assert_close(features, single.encoder(images, context), rtol=0, atol=0)
            torch.testing.assert_close(
                model.predictor(features, context, targets, grid=(side, side)),
                single.predictor(features, context, targets),
                rtol=0,
                atol=0,
            )
            torch.testing.assert_close(
                model.target_encoder.pooled_features(images, patch_size=patch_size),
                single.target_encoder.pooled_features(images),
                rtol=0,
                atol=0,
            )


@pytest.mark.parametrize("pos_embed", position_names(2))
def test_a_position_view_follows_its_member_and_passes_gradient_back(pos_embed):
    member = build_position_encoding(pos_embed, (6, 6), 32, 2)
    assert member.at_grid((6, 6)) is member
    view = member.at_grid((4, 4))
    own = {id(p) for p in member.parameters()}
    assert view.grid == (4, 4) and all(id(p) in own for p in view.parameters())  # no parameter of its own
    indices, tokens = torch.arange(16).expand(2, -1), torch.randn(2, 16, 32)

    def output(encoding):
        out = encoding.after_block(0, encoding.add_to_tokens(tokens, indices), indices).sum()
        positions = encoding.attention_positions(indices)
        if positions is not None:
            out = out + sum(t.sum() for t in (*(positions.rope or ()), positions.bias) if t is not None)
        return out

    resized = set(view.state_resizers((6, 6)))  # the grid-dependent tensors a load would resize
    first = output(view)
    if not resized:
        return
    first.backward()
    for name in resized:
        assert member.get_parameter(name).grad.abs().sum() > 0, name
    with torch.no_grad():  # an optimizer step: the next view call sees the new values
        for parameter in member.parameters():
            parameter.mul_(2.0)
    assert member.at_grid((4, 4)) is view
    assert output(view).item() != pytest.approx(first.item())


def test_the_patch_embedding_resizes_its_kernel_with_gradient_and_names_bad_sizes():
    embed = PatchEmbed(48, 8, 3, 16)
    images = torch.randn(2, 3, 48, 48)
    tokens = embed(images, patch_size=12)
    assert tokens.shape == (2, 16, 16)
    tokens.sum().backward()
    assert embed.proj.weight.grad is not None and embed.proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="image_size=48 must be divisible by patch_size=10"):
        embed(images, patch_size=10)


def test_each_batch_draws_its_patch_size_and_samples_its_masks_on_that_grid():
    samplers = {p: MultiBlockMaskSampler(48 // p) for p in SIZES}
    collate = MaskCollator(MultiBlockMaskSampler(6), patch_samplers=samplers)
    seen = {}
    for seed in range(40):
        samples = [(torch.zeros(3, 48, 48), 0, seed * 8 + i) for i in range(4)]
        batch = collate(samples)
        size = batch.patch_size
        seen[size] = seen.get(size, 0) + 1
        patches = (48 // size) ** 2
        assert int(batch.target_indices.max()) < patches and int(batch.context_indices.max()) < patches
        again = collate(samples)  # the same samples: the same patch size and masks
        assert again.patch_size == size and torch.equal(again.target_indices, batch.target_indices)
    assert set(seen) == set(SIZES) and min(seen.values()) >= 5, seen


def test_train_patch_sizes_are_checked_when_the_data_is_built():
    with pytest.raises(ValueError, match="train_patch_sizes: image_size=48 must be divisible by patch_size=10"):
        IJEPADataModule(ShapesSource(), image_size=48, patch_size=8, train_patch_sizes=[8, 10])
    with pytest.raises(ValueError, match="train_patch_sizes must be a non-empty list"):
        IJEPADataModule(ShapesSource(), image_size=48, patch_size=8, train_patch_sizes=[])


def test_the_loss_of_a_batch_cut_at_another_patch_size_reaches_every_parameter_it_should():
    model = IJEPA(**IMAGE_MODEL, pos_embed="learned_2d", predictor_pos_embed="learned")
    samplers = {12: MultiBlockMaskSampler(4, num_target_blocks=2, min_keep=2)}
    batch = MaskCollator(MultiBlockMaskSampler(6), patch_samplers=samplers)(
        [(torch.randn(3, 48, 48), 0, i) for i in range(3)]
    )
    assert batch.patch_size == 12
    loss = model.jepa_loss(batch)
    loss.backward()
    for name in (
        "encoder.patch_embed.proj.weight",
        "encoder.transformer.position.row",
        "predictor.transformer.position.embedding.weight",
    ):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    assert model.get_parameter("target_encoder.patch_embed.proj.weight").grad is None  # the EMA copy learns no gradient
    with pytest.raises(ValueError, match="per-batch patch sizes"):
        step_patch_size(4, TINY_MODEL["patch_size"], 4)
