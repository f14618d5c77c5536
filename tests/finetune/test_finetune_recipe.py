"""Layer-wise lr decay, the no-decay set, stochastic depth and freezing, as specified by MAE's recipe."""

import pytest
import torch

from ijepa.finetune import FinetuneOptim, FineTuner
from ijepa.finetune.recipe import build_optimizer, drop_path_rates, layer_id

ARCH = {"image_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 2}


def tiny(**options) -> FineTuner:
    return FineTuner(architecture=ARCH, num_classes=4, **options)


def lr_of_each_parameter(model: FineTuner) -> dict[str, float]:
    optimizer = build_optimizer(model, model.depth, model.optim, torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: group["lr"] for group in optimizer.param_groups for p in group["params"]}


def weight_decay_of_each_parameter(model: FineTuner) -> dict[str, float]:
    optimizer = build_optimizer(model, model.depth, model.optim, torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}


def test_each_block_trains_at_the_peak_lr_times_decay_to_the_depth_minus_its_index():
    lr, decay, depth = 2e-3, 0.6, ARCH["depth"]
    model = tiny(optim={"lr": lr, "layer_decay": decay})
    lrs = lr_of_each_parameter(model)
    for name, value in lrs.items():
        if ".blocks." in name:
            index = int(name.split(".blocks.")[1].split(".")[0])
            expected = lr * decay ** (depth - index)
        elif "patch_embed" in name or ".position." in name:
            expected = lr * decay ** (depth + 1)  # the deepest decay
        else:  # the final norm and the head
            expected = lr
        assert value == pytest.approx(expected, rel=1e-12), name
    assert any("patch_embed" in name for name in lrs) and any(name.startswith("head.") for name in lrs)


def test_layer_ids_follow_mae_embedding_zero_blocks_one_up_the_rest_on_top():
    assert layer_id("encoder.patch_embed.proj.weight", 12) == 0
    assert layer_id("encoder.transformer.position.table", 12) == 0
    assert layer_id("encoder.transformer.blocks.0.attn.qkv.weight", 12) == 1
    assert layer_id("encoder.transformer.blocks.11.mlp.fc2.lora_B.default.weight", 12) == 12
    assert layer_id("encoder.transformer.norm.weight", 12) == 13
    assert layer_id("head.head.weight", 12) == 13


def test_norms_biases_and_position_tables_get_no_weight_decay_and_weights_do():
    model = FineTuner(architecture={**ARCH, "pos_embed": "learned"}, num_classes=4, optim={"weight_decay": 0.05})
    decays = weight_decay_of_each_parameter(model)
    tables = [name for name in decays if ".position." in name]
    assert tables, "a learned position table is trained"
    for name, value in decays.items():
        param = dict(model.named_parameters())[name]
        exempt = param.ndim < 2 or name in tables
        assert value == (0.0 if exempt else 0.05), name


def test_the_schedule_warms_up_linearly_then_decays_by_cosine_to_the_final_lr():
    optim = FinetuneOptim(lr=1.0, start_lr=0.0, final_lr=0.0, warmup_steps=10)
    assert optim.factor_at(0, 110) == 0.0
    assert optim.factor_at(5, 110) == pytest.approx(0.5)
    assert optim.factor_at(10, 110) == pytest.approx(1.0)
    assert optim.factor_at(60, 110) == pytest.approx(0.5)
    assert optim.factor_at(110, 110) == pytest.approx(0.0, abs=1e-12)


def test_drop_path_rises_linearly_over_the_blocks_and_is_off_in_eval():
    model = tiny(drop_path_rate=0.3)
    rates = [block.drop_path.p for block in model.encoder.transformer.blocks]
    assert rates == drop_path_rates(3, 0.3)
    assert rates == pytest.approx([0.0, 0.15, 0.3])
    images = torch.randn(4, 3, 16, 16)
    model.eval()
    first = model(images)
    assert torch.equal(first, model(images)), "eval mode drops no path"
    for block in model.encoder.transformer.blocks:
        block.drop_path.p = 0.0
    assert torch.equal(first, model(images))


def test_freezing_keeps_every_frozen_weight_bit_identical_after_steps():
    model = tiny(trainable_blocks=1, drop_path_rate=0.0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = build_optimizer(model, model.depth, FinetuneOptim(lr=1e-2, warmup_steps=0), torch.device("cpu"))
    for _ in range(3):
        loss = model(torch.randn(8, 3, 16, 16)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for name, param in model.named_parameters():
        trainable = ".blocks.2." in name or "transformer.norm" in name or name.startswith("head.")
        assert param.requires_grad == trainable, name
        if trainable:
            assert not torch.equal(param, before[name]), f"{name} should have moved"
        else:
            assert torch.equal(param, before[name]), f"{name} moved though frozen"


def test_no_trainable_parameter_is_one_line():
    model = tiny(trainable_blocks=0)
    model.head.requires_grad_(False)
    with pytest.raises(ValueError, match="nothing to train"):
        build_optimizer(model, model.depth, model.optim, torch.device("cpu"))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"optim": {"layer_decay": 0.0}}, "model.optim.layer_decay"),
        ({"optim": {"layer_decay": 1.5}}, "model.optim.layer_decay"),
        ({"drop_path_rate": 1.0}, "model.drop_path_rate"),
        ({"trainable_blocks": 4}, "model.trainable_blocks"),
        ({"num_classes": 1}, "model.num_classes"),
    ],
)
def test_out_of_range_options_name_themselves_and_their_range(options, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        FineTuner(architecture=ARCH, **{"num_classes": 4, **options})
