import warnings
from dataclasses import replace

import lightning as L
import pytest
import torch
from conftest import TINY_MODEL, tiny_trainer
from helpers import random_loader

from ijepa.callbacks import EMATargetUpdate, ema_update_
from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA
from ijepa.nn.position import position_names
from ijepa.optim import OptimConfig, parameter_groups
from ijepa.step import normalize_targets


def test_ema_update_arithmetic():
    target = [torch.tensor([1.0, 2.0]), torch.tensor([[0.0]])]
    online = [torch.tensor([3.0, -2.0]), torch.tensor([[10.0]])]
    ema_update_(target, online, momentum=0.75)
    # 0.75 * 1 + 0.25 * 3 = 1.5 ; 0.75 * 2 + 0.25 * -2 = 1.0 ; 0.25 * 10 = 2.5
    assert torch.allclose(target[0], torch.tensor([1.5, 1.0]))
    assert torch.allclose(target[1], torch.tensor([[2.5]]))


def test_loss_target_branch_has_no_gradient():
    model = IJEPA(**TINY_MODEL)
    batch = next(iter(random_loader()))
    loss = model.jepa_loss(batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is None for p in model.target_encoder.parameters())
    assert all(not p.requires_grad for p in model.target_encoder.parameters())
    assert all(p.grad is not None for p in model.encoder.parameters())
    assert all(p.grad is not None for p in model.predictor.parameters())


@pytest.mark.parametrize("predictor_mode", ["per_block", "one_pass"])
def test_both_predictor_modes_train(predictor_mode):
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL, predictor_mode=predictor_mode)
    optimizer = model.build_optimizer()
    batch = next(iter(random_loader()))
    losses = []
    for _ in range(5):  # the same batch: the loss must fall
        loss = model.jepa_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_online_encoder_never_sees_a_target_patch():
    model = IJEPA(**TINY_MODEL).eval()
    batch = next(iter(random_loader(batch_size=2)))
    seen = []
    handle = model.encoder.register_forward_pre_hook(lambda mod, args: seen.append(args[1]))
    model.jepa_loss(batch)
    handle.remove()
    (context_seen,) = seen
    assert torch.equal(context_seen, batch.context_indices)
    for b in range(2):
        assert not set(context_seen[b].tolist()) & set(batch.target_indices[b].flatten().tolist())


def test_smooth_l1_and_mse_losses_match_hand_computation():
    for loss in ("smooth_l1", "mse"):
        model = IJEPA(**TINY_MODEL, loss=loss).eval()
        batch = next(iter(random_loader(batch_size=2)))
        with torch.no_grad():
            h = model.target_encoder(batch.images)
            h = torch.nn.functional.layer_norm(h, h.shape[-1:])
            t = batch.target_indices
            targets = torch.stack([h[b][t[b]] for b in range(2)])  # [B, M, Kt, D]
            pred = model.predictor(model.encoder(batch.images, batch.context_indices), batch.context_indices, t)
            diff = pred - targets
            expected = (
                diff.pow(2).mean()
                if loss == "mse"
                else torch.where(diff.abs() < 1, 0.5 * diff.pow(2), diff.abs() - 0.5).mean()
            )
            assert torch.allclose(model.jepa_loss(batch), expected, atol=1e-6)
    with pytest.raises(ValueError, match="loss must be one of"):
        IJEPA(**TINY_MODEL, loss="l3")


class _Snapshot(L.Callback):
    def __init__(self, store, key):
        self.store, self.key = store, key

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.store.append(
            (
                self.key,
                trainer.global_step,
                [p.detach().clone() for p in pl_module.target_encoder.parameters()],
                [p.detach().clone() for p in pl_module.encoder.parameters()],
            )
        )


def test_target_moves_only_by_ema_once_per_optimizer_step(tmp_path):
    """With gradient accumulation 2, the EMA runs after every second batch with the scheduled
    momentum, and target = m * target + (1 - m) * online, exactly."""
    model = IJEPA(**TINY_MODEL, optim=OptimConfig(warmup_steps=1))
    initial_target = [p.detach().clone() for p in model.target_encoder.parameters()]
    records = []
    ema = EMATargetUpdate(momentum=0.9, final_momentum=0.98)
    trainer = tiny_trainer(
        tmp_path,
        max_steps=3,
        accumulate_grad_batches=2,
        callbacks=[_Snapshot(records, "before"), ema, _Snapshot(records, "after")],
    )
    trainer.fit(model, train_dataloaders=random_loader(num_images=24))
    assert trainer.global_step == 3
    befores = [r for r in records if r[0] == "before"]
    afters = [r for r in records if r[0] == "after"]
    assert len(befores) == len(afters) == 6
    # the target starts equal to the online encoder's init
    assert all(torch.equal(a, b) for a, b in zip(initial_target, befores[0][2]))
    for batch_idx, ((_, step, target_before, online), (_, _, target_after, _)) in enumerate(zip(befores, afters)):
        stepped = batch_idx % 2 == 1  # the optimizer steps after every second batch
        assert step == (batch_idx + 1) // 2
        if stepped:
            m = ema.momentum_at(step - 1, 3)
            for tb, o, ta in zip(target_before, online, target_after):
                assert torch.allclose(ta, m * tb + (1 - m) * o, atol=1e-7)
            assert any(not torch.equal(tb, ta) for tb, ta in zip(target_before, target_after))
        else:
            assert all(torch.equal(tb, ta) for tb, ta in zip(target_before, target_after))
    assert ema.momentum_at(0, 3) == pytest.approx(0.9)


def test_optimizer_groups_and_schedules_follow_global_step(tmp_path):
    optim = OptimConfig(lr=1e-3, start_lr=0.0, final_lr=0.0, warmup_steps=2, weight_decay=0.04, final_weight_decay=0.4)
    model = IJEPA(**TINY_MODEL, optim=optim)
    seen = []

    class Recorder(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            groups = optimizer.param_groups
            seen.append((trainer.global_step, groups[0]["lr"], groups[0]["weight_decay"], groups[1]["weight_decay"]))

    trainer = tiny_trainer(tmp_path, max_steps=4, callbacks=[Recorder()])
    trainer.fit(model, train_dataloaders=random_loader(num_images=16))
    steps = [s for s, *_ in seen]
    assert steps == [0, 1, 2, 3]
    for step, lr, wd, wd_none in seen:
        assert lr == pytest.approx(optim.lr_at(step, 4))
        assert wd == pytest.approx(optim.weight_decay_at(step, 4))
        assert wd_none == 0.0
    assert seen[0][1] == pytest.approx(0.0) and seen[2][1] == pytest.approx(1e-3)
    assert seen[0][2] == pytest.approx(0.04)
    # norms, biases, position tables and the mask token get no weight decay
    no_decay = trainer.optimizers[0].param_groups[1]["params"]
    assert any(p is model.predictor.mask_token for p in no_decay)
    assert all(p.ndim >= 2 for p in trainer.optimizers[0].param_groups[0]["params"])


def test_rescale_residuals_divides_output_projections_only_when_asked():
    torch.manual_seed(0)
    rescaled = IJEPA(**{**TINY_MODEL, "depth": 4}, rescale_residuals=True)
    torch.manual_seed(0)
    official = IJEPA(**{**TINY_MODEL, "depth": 4}, rescale_residuals=False)
    for layer, (a, b) in enumerate(
        zip(rescaled.encoder.transformer.blocks, official.encoder.transformer.blocks), start=1
    ):
        assert torch.allclose(a.attn.proj.weight * (2.0 * layer) ** 0.5, b.attn.proj.weight)
        assert torch.allclose(a.mlp.fc2.weight * (2.0 * layer) ** 0.5, b.mlp.fc2.weight)
        assert torch.equal(a.attn.qkv.weight, b.attn.qkv.weight)
    # official training's init: every Linear trunc-normal(0.02), whatever its depth
    stds = [float(block.mlp.fc2.weight.std()) for block in official.encoder.transformer.blocks]
    assert all(0.015 < s < 0.021 for s in stds)


def test_targets_average_the_last_blocks_each_layer_normed(monkeypatch):
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL, target_last_blocks=2).eval()
    batch = next(iter(random_loader(batch_size=2)))
    captured = {}
    original = torch.nn.functional.smooth_l1_loss

    def spy(predictions, targets, *args, **kwargs):
        captured["targets"] = targets
        return original(predictions, targets, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "smooth_l1_loss", spy)
    model.jepa_loss(batch)
    transformer = model.target_encoder.transformer
    indices = model.target_encoder.all_indices(2, batch.images.device)
    tokens = model.target_encoder.position.add_to_tokens(model.target_encoder.patch_embed(batch.images), indices)
    first = transformer.norm(transformer.blocks[0](tokens))
    second = transformer.norm(transformer.blocks[1](transformer.blocks[0](tokens)))
    expected = (torch.nn.functional.layer_norm(first, (32,)) + torch.nn.functional.layer_norm(second, (32,))) / 2
    flat = batch.target_indices.flatten(1)
    expected = torch.stack([expected[b, flat[b]] for b in range(2)]).view(captured["targets"].shape)
    torch.testing.assert_close(captured["targets"], expected)
    with pytest.raises(ValueError, match=r"target_last_blocks must be in \[1, 2\]"):
        IJEPA(**TINY_MODEL, target_last_blocks=3)


def test_instance_normed_targets_are_unit_per_feature_and_blind_to_what_all_patches_share():
    torch.manual_seed(0)
    features = torch.randn(3, 16, 8) * 2.0 + 0.5
    normed = normalize_targets(features, "instance")
    torch.testing.assert_close(normed.mean(dim=1), torch.zeros(3, 8), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.var(dim=1, unbiased=False), torch.ones(3, 8), atol=1e-3, rtol=0)
    # a per-image offset on every token (a background colour every patch carries) is no target ...
    shifted = features + torch.randn(3, 1, 8) * 5.0
    torch.testing.assert_close(normalize_targets(shifted, "instance"), normed, atol=1e-4, rtol=0)
    # ... while layer norm keeps it
    assert not torch.allclose(normalize_targets(shifted, "layer"), normalize_targets(features, "layer"), atol=1e-2)
    torch.testing.assert_close(normalize_targets(features), torch.nn.functional.layer_norm(features, (8,)))


def test_target_norm_reaches_the_loss_and_bad_names_are_refused(monkeypatch):
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL, target_norm="instance").eval()
    batch = next(iter(random_loader(batch_size=2)))
    captured = {}
    original = torch.nn.functional.smooth_l1_loss

    def spy(predictions, targets, *args, **kwargs):
        captured["targets"] = targets
        return original(predictions, targets, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "smooth_l1_loss", spy)
    model.jepa_loss(batch)
    with torch.no_grad():
        expected = normalize_targets(model.target_encoder(batch.images), "instance")
    flat = batch.target_indices.flatten(1)
    expected = torch.stack([expected[b, flat[b]] for b in range(2)]).view(captured["targets"].shape)
    torch.testing.assert_close(captured["targets"], expected)
    with pytest.raises(ValueError, match=r"target_norm must be one of \('layer', 'instance'\), got 'batch'"):
        IJEPA(**TINY_MODEL, target_norm="batch")


def test_several_mask_sets_per_image_average_their_losses_over_one_target_pass():
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL)
    images = torch.randn(4, 3, 32, 32)
    sampler = MultiBlockMaskSampler(4, target_scale=(0.1, 0.15), min_keep=2)
    double = MaskCollator(sampler, masks_per_image=2)([(image, 0) for image in images])
    rows = [slice(r * 4, (r + 1) * 4) for r in range(2)]
    single = [
        replace(double, context_indices=double.context_indices[r], target_indices=double.target_indices[r])
        for r in rows
    ]
    passes = []
    handle = model.target_encoder.register_forward_hook(lambda mod, args, out: passes.append(args[0].size(0)))
    loss = model.jepa_loss(double)
    handle.remove()
    assert passes == [4]  # one pass over the 4 images serves both mask sets
    expected = (model.jepa_loss(single[0]) + model.jepa_loss(single[1])) / 2
    assert torch.allclose(loss, expected, atol=1e-6)
    with pytest.raises(ValueError, match="masks_per_image"):
        model.jepa_loss(
            replace(double, context_indices=double.context_indices[:6], target_indices=double.target_indices[:6])
        )


@pytest.mark.parametrize("with_ema", [False, True])
def test_fit_warns_when_no_callback_moves_the_target_encoder(tmp_path, with_ema):
    trainer = tiny_trainer(tmp_path, max_steps=1, callbacks=[EMATargetUpdate()] if with_ema else [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(IJEPA(**TINY_MODEL), train_dataloaders=random_loader(num_images=8))
    warned = any("target encoder will stay at its initial weights" in str(w.message) for w in caught)
    assert warned != with_ema


@pytest.mark.parametrize("pos_embed", position_names(2))
def test_weight_decay_spares_biases_norms_tables_and_the_mask_token_not_kernels(pos_embed):
    model = IJEPA(**{**TINY_MODEL, "pos_embed": pos_embed, "predictor_pos_embed": pos_embed})
    decay, no_decay = parameter_groups(model)
    params = dict(model.named_parameters())
    assert sorted(decay + no_decay) == sorted(n for n, p in params.items() if p.requires_grad)
    for name in decay:
        assert params[name].ndim >= 2 and name != "predictor.mask_token"
    for name in no_decay:
        assert params[name].ndim < 2 or ".position." in name or name == "predictor.mask_token", name
    # each member names the parameters it keeps from decay (tables); the rest decay as weights
    for network in ("encoder", "predictor"):
        position = getattr(model, network).transformer.position
        spared = position.no_weight_decay()
        for name, param in position.named_parameters():
            full = f"{network}.transformer.position.{name}"
            assert (full in no_decay) == (name in spared or param.ndim < 2), full
    if pos_embed == "peg":  # a convolution's kernel is a weight
        assert "encoder.transformer.position.conv.weight" in decay


@pytest.mark.parametrize("predictor_mode", ["per_block", "one_pass"])
@pytest.mark.parametrize("every", [1, 2])
def test_activation_checkpointing_keeps_losses_and_gradients_and_recomputes_the_chosen_blocks(every, predictor_mode):
    options = {**TINY_MODEL, "depth": 4, "predictor_depth": 2, "drop_path_rate": 0.2, "predictor_mode": predictor_mode}
    batch = next(iter(random_loader()))
    results = {}
    for setting in (0, every):
        torch.manual_seed(0)
        model = IJEPA(**options, activation_checkpointing=setting)
        calls = {"encoder": 0, "target": 0, "predictor": 0}

        def counter(name, calls=calls):
            def hook(module, args):
                calls[name] += 1

            return hook

        for name, network in (
            ("encoder", model.encoder),
            ("target", model.target_encoder),
            ("predictor", model.predictor),
        ):
            for block in network.transformer.blocks:
                block.register_forward_pre_hook(counter(name))
        torch.manual_seed(1)  # stochastic depth draws from the global RNG: the same draws for both runs
        loss = model.jepa_loss(batch)
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results[setting] = (loss.detach(), grads, dict(calls))
    loss, grads, calls = results[every]
    plain_loss, plain_grads, plain_calls = results[0]
    torch.testing.assert_close(loss, plain_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == plain_grads.keys() and any(k.startswith("predictor.") for k in grads)
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-6, atol=1e-6, msg=name)
    # the checkpointed blocks (0, every, 2*every, ...) run again in the backward pass; the target never
    assert calls["encoder"] == plain_calls["encoder"] + 4 // every
    assert calls["predictor"] == plain_calls["predictor"] + 2 // every
    assert calls["target"] == plain_calls["target"]


def test_activation_checkpointing_is_off_at_evaluation_and_refuses_a_negative_interval():
    model = IJEPA(**TINY_MODEL, activation_checkpointing=1)
    with torch.no_grad():
        assert not model.encoder.transformer.checkpoints_block(0)  # nothing to recompute without a backward
    assert model.encoder.transformer.checkpoints_block(0) and model.predictor.transformer.checkpoints_block(0)
    assert model.target_encoder.transformer.checkpoint_every == 0
    with pytest.raises(ValueError, match="activation_checkpointing must be >= 0"):
        IJEPA(**TINY_MODEL, activation_checkpointing=-1)
