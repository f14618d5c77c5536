"""FineTuner: where its encoder comes from, what it refuses, and that a run resumes exactly."""

from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, save_tiny_checkpoint

from ijepa.cli import instantiate
from ijepa.data.sources import ShapesSource
from ijepa.finetune import FinetuneData, FineTuner, load_finetuned
from ijepa.finetune.module import network_spec

ARCH = {"image_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}


def tiny_data(**overrides) -> FinetuneData:
    options = dict(image_size=16, batch_size=8, num_workers=0, randaugment_ops=0, erasing=0.0)
    return FinetuneData(source=ShapesSource(train_size=120, val_size=30), **{**options, **overrides})


def tiny_fit_checkpoint(tmp_path: Path) -> Path:
    model, _ = instantiate(TINY_CONFIG)
    return save_tiny_checkpoint(model, tmp_path / "fit.ckpt")


def test_random_gives_a_fresh_encoder_of_the_configs_shape_drawn_from_the_seed():
    first = FineTuner(architecture=ARCH, num_classes=3, seed=1)
    again = FineTuner(architecture=ARCH, num_classes=3, seed=1)
    other = FineTuner(architecture=ARCH, num_classes=3, seed=2)
    spec = network_spec(first.encoder)
    assert {key: spec[key] for key in ARCH} == ARCH
    same = [torch.equal(a, b) for a, b in zip(first.encoder.state_dict().values(), again.encoder.state_dict().values())]
    assert all(same)
    assert not torch.equal(first.encoder.patch_embed.proj.weight, other.encoder.patch_embed.proj.weight)


def test_random_reads_the_architecture_of_an_ijepa_fit_config():
    model = FineTuner(architecture="configs/quickstart.yaml", num_classes=10)
    spec = network_spec(model.encoder)
    assert (spec["image_size"], spec["patch_size"], spec["embed_dim"], spec["depth"]) == (48, 8, 128, 4)


def test_random_without_an_architecture_is_one_line():
    with pytest.raises(ValueError, match="checkpoint=random needs an architecture"):
        FineTuner(num_classes=3)


def test_a_fit_checkpoint_starts_from_its_target_encoder_or_its_online_one(tmp_path):
    path = tiny_fit_checkpoint(tmp_path)
    state = torch.load(path, weights_only=True)["state_dict"]
    for which, prefix in (("target", "target_encoder."), ("online", "encoder.")):
        model = FineTuner(checkpoint=str(path), encoder=which, num_classes=3)
        for key, value in model.encoder.state_dict().items():
            assert torch.equal(value, state[prefix + key]), (which, key)
        assert all(p.requires_grad for p in model.encoder.parameters())


def test_a_checkpoint_of_another_architecture_is_one_line_naming_each_difference(tmp_path):
    path = tiny_fit_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"another architecture.*embed_dim=64 \(checkpoint: "):
        FineTuner(checkpoint=str(path), architecture={"embed_dim": 64}, num_classes=3)


def test_a_class_count_that_disagrees_with_the_data_is_one_line(tmp_path):
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match=r"model\.num_classes=7 disagrees with the data, which has 10 classes"):
        trainer.fit(FineTuner(architecture=ARCH, num_classes=7), datamodule=tiny_data())


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"label_fraction": 0.0}, r"data\.label_fraction"),
        ({"shots": 0}, r"data\.shots"),
        ({"val_fraction": 1.0}, r"data\.val_fraction"),
    ],
)
def test_an_empty_label_fraction_or_split_is_one_line(options, named):
    with pytest.raises(ValueError, match=named):
        tiny_data(**options)


def test_the_label_fraction_takes_that_share_of_each_class_and_never_a_validation_image():
    data = tiny_data(label_fraction=0.25, val_fraction=0.25)
    data.setup("fit")
    train, val = data.indices["train"], data.indices["val"]
    assert not set(train.tolist()) & set(val.tolist())
    counts = torch.bincount(data.labels[train], minlength=10)
    assert counts.tolist() == [2] * 10  # 12 a class, 3 to validation, a quarter of the other 9 rounds to 2


def fit(root: Path, max_steps: int, ckpt_path: str | None = None, every: int | None = None) -> FineTuner:
    L.seed_everything(0)
    model = FineTuner(architecture=ARCH, num_classes=10, drop_path_rate=0.2, optim={"warmup_steps": 2})
    callbacks = (
        [L.pytorch.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=every, save_top_k=-1)] if every else []
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(every),
        callbacks=callbacks,
        limit_val_batches=0,
        default_root_dir=root,
    )
    trainer.fit(model, datamodule=tiny_data(mixup_alpha=0.8, cutmix_alpha=1.0, randaugment_ops=2), ckpt_path=ckpt_path)
    return model


def test_a_run_resumed_mid_epoch_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    whole = fit(tmp_path / "whole", 10, every=5)  # 12 batches an epoch: step 5 is mid-epoch
    (checkpoint,) = (tmp_path / "whole").glob("*step=5.ckpt")
    resumed = fit(tmp_path / "resumed", 10, ckpt_path=str(checkpoint))
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_finetuned_checkpoint_reads_back_with_the_same_logits_without_its_source(tmp_path):
    source = tiny_fit_checkpoint(tmp_path)
    model = FineTuner(checkpoint=str(source), num_classes=10, drop_path_rate=0.0)
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_progress_bar=False, default_root_dir=tmp_path, limit_val_batches=0
    )
    trainer.fit(model, datamodule=tiny_data(image_size=32))
    trainer.save_checkpoint(tmp_path / "tuned.ckpt")
    source.unlink()  # the fine-tuned checkpoint describes its own network
    back = load_finetuned(tmp_path / "tuned.ckpt")
    images = torch.randn(3, 3, 32, 32)
    assert torch.allclose(back(images), model.eval()(images), atol=1e-6)


def test_lightnings_ema_of_the_weights_averages_the_fine_tuners_weights(tmp_path):
    from lightning.pytorch.callbacks import EMAWeightAveraging

    def trained(callbacks) -> FineTuner:
        L.seed_everything(0)
        model = FineTuner(architecture=ARCH, num_classes=10, drop_path_rate=0.0)
        trainer = L.Trainer(
            max_steps=4, logger=False, enable_progress_bar=False, enable_checkpointing=False, limit_val_batches=0,
            callbacks=callbacks, default_root_dir=tmp_path,
        )  # fmt: skip
        trainer.fit(model, datamodule=tiny_data())
        return model

    plain, averaged = trained([]), trained([EMAWeightAveraging(decay=0.5)])
    weight = "encoder.transformer.blocks.0.attn.qkv.weight"
    assert not torch.equal(plain.state_dict()[weight], averaged.state_dict()[weight]), (
        "the average replaces the weights"
    )
