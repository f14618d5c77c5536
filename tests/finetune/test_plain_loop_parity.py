"""``ijepa finetune``'s step is the plain PyTorch loop's (``ijepa.studies.plain_finetune``, over
timm's ``VisionTransformer``): the same weights, batches and recipe give the same losses and
weights, so a gap between the two loops in the study is the data, the selection or the init, never
the optimiser; and the fair scratch's init is timm's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ijepa.finetune.mixing import smooth
from ijepa.finetune.module import SCRATCH_INITS, FineTuner
from ijepa.finetune.recipe import build_optimizer
from ijepa.interop.timm_vit import TIMM_ARCHITECTURE, encoder_to_timm
from ijepa.studies import plain_finetune

timm = pytest.importorskip("timm")

ARCH = {"image_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 3, "num_heads": 2}
OPTIM = {"lr": 3e-3, "start_lr": 1e-4, "final_lr": 1e-6, "warmup_steps": 2, "weight_decay": 0.05, "layer_decay": 0.75}
STEPS = 5


def twins(seed: int = 0):
    """A FineTuner and the timm model holding the same weights (the position table frozen in timm:
    ours is a fixed sin-cos buffer)."""
    model = FineTuner(checkpoint="random", architecture=ARCH, num_classes=3, drop_path_rate=0.0, optim=OPTIM, seed=seed)
    args, state = encoder_to_timm(model.encoder)
    vit = timm.create_model(TIMM_ARCHITECTURE, pretrained=False, **{**args, "num_classes": 3})
    missing, unexpected = vit.load_state_dict(state, strict=False)
    assert set(missing) == {"head.weight", "head.bias"} and not unexpected
    vit.head.load_state_dict(model.head.head.state_dict())
    vit.pos_embed.requires_grad_(False)
    return model, vit


def test_finetune_steps_equal_the_plain_loops_on_the_same_weights_and_batches():
    model, vit = twins()
    model.train(), vit.train()
    recipe = {**OPTIM, "steps": STEPS}
    ours = build_optimizer(model, 3, model.optim, torch.device("cpu"))
    theirs = torch.optim.AdamW(plain_finetune.param_groups(vit, 3, OPTIM["lr"], OPTIM["layer_decay"], 0.05))
    generator = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        images = torch.randn(8, 3, 16, 16, generator=generator)
        labels = torch.randint(3, (8,), generator=generator)
        factor = model.optim.factor_at(step, STEPS)
        for group in ours.param_groups:
            group["lr"] = OPTIM["lr"] * group["lr_scale"] * factor
        for group in theirs.param_groups:
            group["lr"] = plain_finetune.schedule(step, recipe) * group["lr_scale"]
        assert plain_finetune.schedule(step, recipe) == pytest.approx(OPTIM["lr"] * factor, rel=1e-9)
        loss = F.cross_entropy(model(images), smooth(F.one_hot(labels, 3).float(), 0.1))
        plain = F.cross_entropy(vit(images), labels, label_smoothing=0.1)
        torch.testing.assert_close(loss, plain, rtol=0, atol=1e-5)
        for optimizer, value in ((ours, loss), (theirs, plain)):
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
    _, state = encoder_to_timm(model.encoder)
    trained = vit.state_dict()
    for name, tensor in state.items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=1e-5, msg=name)
    torch.testing.assert_close(model.head.head.weight, vit.head.weight, rtol=0, atol=1e-5)


def test_the_plain_loops_groups_are_maes_layer_decay_over_timms_names():
    _, vit = twins()
    groups = plain_finetune.param_groups(vit, 3, 1.0, 0.5, 0.05)
    scale = {id(p): (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}
    named = dict(vit.named_parameters())
    assert scale[id(named["patch_embed.proj.weight"])] == (0.5**4, 0.05)
    assert scale[id(named["blocks.0.attn.qkv.weight"])] == (0.5**3, 0.05)
    assert scale[id(named["blocks.2.mlp.fc2.bias"])] == (0.5, 0.0)
    assert scale[id(named["norm.weight"])] == (1.0, 0.0)
    assert scale[id(named["head.weight"])] == (1.0, 0.05)


def test_the_plain_schedule_warms_up_linearly_then_decays_by_cosine():
    recipe = {"lr": 1.0, "start_lr": 0.0, "final_lr": 0.0, "warmup_steps": 10, "steps": 110}
    assert plain_finetune.schedule(0, recipe) == 0.0
    assert plain_finetune.schedule(5, recipe) == pytest.approx(0.5)
    assert plain_finetune.schedule(10, recipe) == pytest.approx(1.0)
    assert plain_finetune.schedule(60, recipe) == pytest.approx(0.5)
    assert plain_finetune.schedule(110, recipe) == pytest.approx(0.0, abs=1e-12)


def test_a_fair_scratch_has_timms_init_statistics():
    """``model.init: timm`` (the default): linear weights trunc-normal 0.02 (no residual rescaling),
    zero biases, the patch embedding under PyTorch's conv init (uniform within 1/sqrt(fan_in));
    ``ijepa``: I-JEPA's (the conv at 0.02, the last block's projections divided by sqrt(2 depth))."""
    arch = {"image_size": 32, "patch_size": 8, "embed_dim": 192, "depth": 4, "num_heads": 4}
    fair = FineTuner(checkpoint="random", architecture=arch, num_classes=3).encoder
    ijepa = FineTuner(checkpoint="random", architecture=arch, num_classes=3, init="ijepa").encoder
    fan_in = 3 * 8 * 8
    conv = fair.patch_embed.proj.weight
    assert conv.abs().max() <= 1 / math.sqrt(fan_in) + 1e-7
    assert conv.std().item() == pytest.approx(1 / math.sqrt(3 * fan_in), rel=0.1)
    assert ijepa.patch_embed.proj.weight.std().item() == pytest.approx(0.02, rel=0.1)
    last = fair.transformer.blocks[-1]
    for weight in (last.attn.qkv.weight, last.attn.proj.weight, last.mlp.fc2.weight):
        assert weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert ijepa.transformer.blocks[-1].mlp.fc2.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert all(not b.attn.proj.bias.any() for b in fair.transformer.blocks)
    assert torch.equal(fair.transformer.norm.weight, torch.ones(192))
    # a seed is a draw: the same seed the same weights, another seed others
    again = FineTuner(checkpoint="random", architecture=arch, num_classes=3).encoder
    other = FineTuner(checkpoint="random", architecture=arch, num_classes=3, seed=1).encoder
    assert torch.equal(again.patch_embed.proj.weight, conv)
    assert not torch.equal(other.patch_embed.proj.weight, conv)


def test_timms_own_init_matches_ours_in_distribution():
    """The statistics timm's ``VisionTransformer`` draws, beside ``init_timm``'s."""
    arch = {"image_size": 32, "patch_size": 8, "embed_dim": 192, "depth": 4, "num_heads": 4}
    fair = FineTuner(checkpoint="random", architecture=arch, num_classes=3).encoder
    args, _ = encoder_to_timm(fair)
    torch.manual_seed(0)
    vit = timm.create_model(TIMM_ARCHITECTURE, pretrained=False, **args)
    _, state = encoder_to_timm(fair)
    for name in ("patch_embed.proj.weight", "blocks.3.attn.proj.weight", "blocks.0.mlp.fc1.weight"):
        theirs = vit.state_dict()[name]
        assert state[name].std().item() == pytest.approx(theirs.std().item(), rel=0.1), name


def test_model_init_names_its_choices():
    with pytest.raises(ValueError, match=r"model.init must be one of timm, ijepa, got 'xavier'"):
        FineTuner(checkpoint="random", architecture=ARCH, num_classes=3, init="xavier")
    assert set(SCRATCH_INITS) == {"timm", "ijepa"}


def test_the_ijepa_init_is_the_encoder_ijepa_fit_starts_from_and_timms_is_another_draw():
    from conftest import TINY_CONFIG

    from ijepa.cli import instantiate

    model, _ = instantiate(TINY_CONFIG, ["--seed_everything=3"])
    fit_start = model.target_encoder.state_dict()
    ijepa = FineTuner(checkpoint="random", architecture=str(TINY_CONFIG), num_classes=3, seed=3, init="ijepa")
    fair = FineTuner(checkpoint="random", architecture=str(TINY_CONFIG), num_classes=3, seed=3)
    assert all(torch.equal(value, fit_start[key]) for key, value in ijepa.encoder.state_dict().items())
    assert not torch.equal(fair.encoder.patch_embed.proj.weight, fit_start["patch_embed.proj.weight"])
