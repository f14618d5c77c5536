"""The paper presets under configs/presets/: the four official I-JEPA recipes resolve, as ``ijepa fit``
parses them, to the official values; the schedules they run agree with the official schedulers; and
every preset trains a step at a stand-in size on the CPU.

The official values below are copied from facebookresearch/ijepa at commit
52c1ae95d05f743e000e8f10a1f3a79b10cff048: configs/<name>.yaml (data, mask, meta, optimization),
src/models/vision_transformer.py (vit_huge: 1280 x 32, 16 heads, MLP 4; vit_giant: 1408 x 40,
16 heads, MLP 48/11), src/helper.py (init_model gives the predictor the encoder's num_heads;
init_opt: warm-up int(warmup * ipe) steps, schedules over int(ipe_scale * epochs * ipe) steps),
src/train.py (EMA linear over ipe * epochs * ipe_scale) and src/utils/schedulers.py
(WarmupCosineSchedule, CosineWDSchedule, re-implemented below). The global batch 2048 is the
official configs' log folder names (bs.2048) and the README's "16 A100 80G GPUs for an effective
batch-size of 2048" for ViT-H/14; the per-GPU batch is each config's data.batch_size.
"""

import math

import pytest
import torch
from conftest import ROOT, TINY_MODEL
from helpers import cli, write_folder

from ijepa.callbacks.ema import EMATargetUpdate
from ijepa.cli import _Parsed, _ParserOnly, instantiate, main
from ijepa.data.datamodule import IJEPADataModule
from ijepa.interop import to_official
from ijepa.module import IJEPA
from ijepa.optim import OptimConfig

PRESETS = ROOT / "configs" / "presets"

# Images per epoch: ImageNet-1k's training set, and ImageNet-22k's full fall-2011 release (the
# official configs do not say which IN-22k variant they used; the presets assume this one).
DATASET_SIZE = {"in1k": 1_281_167, "in22k": 14_197_122}

# Shared by the four official configs (every key below is in each of them with this value).
COMMON = dict(
    crop_scale=[0.3, 1.0],
    use_horizontal_flip=False,
    use_color_distortion=False,
    use_gaussian_blur=False,
    num_workers=10,
    allow_overlap=False,
    aspect_ratio=[0.75, 1.5],
    enc_mask_scale=[0.85, 1.0],
    pred_mask_scale=[0.15, 0.2],
    min_keep=10,
    num_enc_masks=1,
    num_pred_masks=4,
    pred_emb_dim=384,
    use_bfloat16=True,
    ema=[0.996, 1.0],
    ipe_scale=1.0,
    lr=1e-3,
    start_lr=2e-4,
    final_lr=1e-6,
    weight_decay=0.04,
    final_weight_decay=0.4,
    global_batch=2048,
    seed=0,  # src/train.py _GLOBAL_SEED
    pred_mlp_ratio=4.0,  # src/models/vision_transformer.py VisionTransformerPredictor(mlp_ratio=4.0)
)
VIT_HUGE = dict(embed_dim=1280, depth=32, num_heads=16, mlp_ratio=4.0)
VIT_GIANT = dict(embed_dim=1408, depth=40, num_heads=16, mlp_ratio=48 / 11)
OFFICIAL = {
    "in1k_vith14_ep300": dict(
        COMMON,
        **VIT_HUGE,
        data="in1k",
        batch_size=128,
        crop_size=224,
        patch_size=14,
        pred_depth=12,
        epochs=300,
        warmup=40,
    ),
    "in1k_vith16-448_ep300": dict(
        COMMON,
        **VIT_HUGE,
        data="in1k",
        batch_size=16,
        crop_size=448,
        patch_size=16,
        pred_depth=12,
        epochs=300,
        warmup=40,
    ),
    "in22k_vith14_ep66": dict(
        COMMON,
        **VIT_HUGE,
        data="in22k",
        batch_size=32,
        crop_size=224,
        patch_size=14,
        pred_depth=12,
        epochs=66,
        warmup=3,
    ),
    "in22k_vitg16_ep44": dict(
        COMMON,
        **VIT_GIANT,
        data="in22k",
        batch_size=16,
        crop_size=224,
        patch_size=16,
        pred_depth=16,
        epochs=44,
        warmup=3,
    ),
}
SMALL = ("imagenette_vits16", "imagenet100_vits16")
ALL = (*OFFICIAL, *SMALL)


@pytest.fixture(scope="module")
def parser():
    """``ijepa fit``'s parser, links and all, with nothing built (as ijepa.cli.fit_arguments_error)."""
    try:
        _ParserOnly(IJEPA, IJEPADataModule, args=["fit"], auto_configure_optimizers=False)
    except _Parsed as parsed:
        return parsed.args[0]
    raise AssertionError("the CLI did not reach its parser")


def resolve(parser, name: str, *overrides: str):
    """The ``fit`` namespace of ``ijepa fit --config configs/presets/<name>.yaml [overrides]``."""
    return parser.parse_args(["fit", "--config", str(PRESETS / f"{name}.yaml"), *overrides]).fit


def callback(config, name: str):
    (found,) = [c for c in config.trainer.callbacks if c.class_path.rsplit(".", 1)[-1] == name]
    return found.init_args


# --- the official schedulers (src/utils/schedulers.py, src/train.py), stepped as the official loop does
class OfficialWarmupCosine:
    def __init__(self, warmup_steps, start_lr, ref_lr, T_max, final_lr=0.0):
        self.start_lr, self.ref_lr, self.final_lr = start_lr, ref_lr, final_lr
        self.warmup_steps, self.T_max, self._step = warmup_steps, T_max - warmup_steps, 0.0

    def step(self):
        self._step += 1
        if self._step < self.warmup_steps:
            progress = float(self._step) / float(max(1, self.warmup_steps))
            return self.start_lr + progress * (self.ref_lr - self.start_lr)
        progress = float(self._step - self.warmup_steps) / float(max(1, self.T_max))
        return max(
            self.final_lr, self.final_lr + (self.ref_lr - self.final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
        )


class OfficialCosineWD:
    def __init__(self, ref_wd, T_max, final_wd=0.0):
        self.ref_wd, self.final_wd, self.T_max, self._step = ref_wd, final_wd, T_max, 0.0

    def step(self):
        self._step += 1
        progress = self._step / self.T_max
        new_wd = self.final_wd + (self.ref_wd - self.final_wd) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(self.final_wd, new_wd) if self.final_wd <= self.ref_wd else min(self.final_wd, new_wd)


def official_momentum(ema, ipe, epochs, ipe_scale):
    return (
        ema[0] + i * (ema[1] - ema[0]) / (ipe * epochs * ipe_scale) for i in range(int(ipe * epochs * ipe_scale) + 1)
    )


def official_iterations_per_epoch(official) -> int:
    # DistributedSampler (drop_last False: ceil(N / world) per rank), then DataLoader(drop_last=True)
    world = official["global_batch"] // official["batch_size"]
    return math.ceil(DATASET_SIZE[official["data"]] / world) // official["batch_size"]


@pytest.mark.parametrize("name", OFFICIAL)
def test_official_presets_resolve_to_the_official_values_field_by_field(parser, name):
    official = OFFICIAL[name]
    config = resolve(parser, name)
    model, data, trainer = config.model, config.data, config.trainer
    optim = model.optim
    ipe = official_iterations_per_epoch(official)
    assert ipe == DATASET_SIZE[official["data"]] // official["global_batch"]  # floor(N / global batch)
    steps = int(official["ipe_scale"] * official["epochs"] * ipe)
    # epochs as steps, warm-up, lr and weight-decay schedules
    assert trainer.max_steps == steps
    assert optim.warmup_steps == int(official["warmup"] * ipe)
    assert (optim.lr, optim.start_lr, optim.final_lr) == (official["lr"], official["start_lr"], official["final_lr"])
    assert (optim.weight_decay, optim.final_weight_decay) == (official["weight_decay"], official["final_weight_decay"])
    ema = callback(config, "EMATargetUpdate")
    assert [ema.momentum, ema.final_momentum] == official["ema"]
    # the global batch, on GPUs in bf16 under DDP
    assert trainer.devices * trainer.num_nodes * data.batch_size == official["global_batch"]
    assert data.batch_size == official["batch_size"]
    assert (trainer.accelerator, trainer.strategy, trainer.precision) == ("gpu", "ddp", "bf16-mixed")
    assert official["use_bfloat16"] and config.seed_everything == official["seed"]
    # data: crop only, no flip (colour jitter and blur the project has none of)
    assert official["use_color_distortion"] is False and official["use_gaussian_blur"] is False
    assert list(data.crop_scale) == official["crop_scale"] and data.horizontal_flip is official["use_horizontal_flip"]
    assert data.image_size == model.image_size == official["crop_size"]
    assert data.num_workers == official["num_workers"]
    assert data.source.class_path == "ijepa.data.ImageFolderSource"
    # masks: one context block, official_targets target blocks, no overlap, min_keep
    assert official["num_enc_masks"] == 1  # the project samples one context block per mask set
    assert data.masks.class_path == "ijepa.masks.MultiBlockMasks"
    masks = data.masks.init_args
    assert masks.num_target_blocks == official["num_pred_masks"]
    assert list(masks.target_scale) == official["pred_mask_scale"]
    assert list(masks.target_aspect_ratio) == official["aspect_ratio"]
    assert list(masks.context_scale) == official["enc_mask_scale"]
    assert masks.min_keep == official["min_keep"]
    # allow_overlap false: contexts never hold a target patch under every policy; thin is the official batching
    assert official["allow_overlap"] is False and masks.context_policy == "thin" and masks.masks_per_image == 1
    # encoder
    assert data.patch_size == model.patch_size == official["patch_size"]
    assert (model.embed_dim, model.depth, model.num_heads) == (
        official["embed_dim"],
        official["depth"],
        official["num_heads"],
    )
    assert model.mlp_ratio == pytest.approx(official["mlp_ratio"], rel=1e-15)
    assert int(model.embed_dim * model.mlp_ratio) == int(official["embed_dim"] * official["mlp_ratio"])
    # predictor: pred_emb_dim wide, pred_depth deep, the encoder's num_heads (helper.init_model)
    assert model.predictor_embed_dim == official["pred_emb_dim"]
    assert model.predictor_depth == official["pred_depth"]
    assert model.predictor_num_heads == official["num_heads"]
    assert model.predictor_mlp_ratio == official["pred_mlp_ratio"]  # vit_predictor's default, never passed
    # fixed 2-D sin-cos positions, the official init (every Linear redrawn after the rescale), I-JEPA's loss
    assert (model.pos_embed, model.predictor_pos_embed) == ("sincos", "sincos")
    assert model.rescale_residuals is False
    assert (model.loss, model.target_norm, model.target_last_blocks) == ("smooth_l1", "layer", 1)
    assert (model.predictor_mode, model.drop_path_rate) == ("per_block", 0.0)
    assert not model.regularizers and not model.objectives  # the JEPA loss alone


def test_the_official_step_counts_are_the_ones_the_docs_state():
    counts = {name: official_iterations_per_epoch(o) for name, o in OFFICIAL.items()}
    assert counts == {
        "in1k_vith14_ep300": 625,
        "in1k_vith16-448_ep300": 625,
        "in22k_vith14_ep66": 6932,
        "in22k_vitg16_ep44": 6932,
    }


@pytest.mark.parametrize("name", OFFICIAL)
def test_the_schedules_a_preset_runs_are_the_official_schedulers(parser, name):
    """Learning rate and weight decay: the project's value at step s is the official scheduler's
    after s calls of step() (the official loop calls it before each update, so its iteration i
    uses the value after i + 1 calls, one step ahead of the project's). EMA: the momentum of the
    i-th update is the official generator's i-th value."""
    official, config = OFFICIAL[name], resolve(parser, name)
    m = config.model.optim
    ipe = official_iterations_per_epoch(official)
    total = int(official["ipe_scale"] * official["epochs"] * ipe)
    warmup = int(official["warmup"] * ipe)
    schedules = OptimConfig(m.lr, m.start_lr, m.final_lr, m.warmup_steps, m.weight_decay, m.final_weight_decay)
    lr = OfficialWarmupCosine(warmup, official["start_lr"], official["lr"], total, official["final_lr"])
    wd = OfficialCosineWD(official["weight_decay"], total, official["final_weight_decay"])
    checked = {1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, (warmup + total) // 2, total - 1, total}
    for step in range(1, total + 1):
        official_lr, official_wd = lr.step(), wd.step()
        if step in checked:
            assert schedules.lr_at(step, config.trainer.max_steps) == pytest.approx(official_lr, rel=1e-12, abs=1e-15)
            assert schedules.weight_decay_at(step, config.trainer.max_steps) == pytest.approx(official_wd, rel=1e-12)
    ema_args = callback(config, "EMATargetUpdate")
    ema = EMATargetUpdate(ema_args.momentum, ema_args.final_momentum)
    momenta = list(official_momentum(official["ema"], ipe, official["epochs"], official["ipe_scale"]))
    for update in (0, 1, warmup, total // 2, total - 1):
        assert ema.momentum_at(update, config.trainer.max_steps) == pytest.approx(momenta[update], rel=1e-12)


@pytest.mark.parametrize("name", SMALL)
def test_small_data_presets_are_vit_s16_at_224_on_an_image_folder_with_probes(parser, name):
    config = resolve(parser, name)
    model, data = config.model, config.data
    assert (model.patch_size, data.image_size, model.embed_dim, model.depth, model.num_heads) == (16, 224, 384, 12, 6)
    assert data.source.class_path == "ijepa.data.ImageFolderSource"
    assert {c.class_path.rsplit(".", 1)[-1] for c in config.trainer.callbacks} >= {"EMATargetUpdate", "KNNProbe"}
    # the official recipe's shape, at batch 256: the same epochs and warm-up share, lr scaled linearly
    assert model.optim.warmup_steps * 300 == config.trainer.max_steps * 40
    assert (model.optim.lr, model.optim.start_lr) == (1e-3 * 256 / 2048, 2e-4 * 256 / 2048)
    assert data.batch_size * config.trainer.devices * config.trainer.num_nodes == 256


@pytest.mark.parametrize("name", ALL)
def test_every_preset_names_its_source_and_its_published_figure_first(name):
    head = (PRESETS / f"{name}.yaml").read_text().split("seed_everything:")[0]
    assert "facebookresearch/ijepa configs/" in head and "Published" in head and "ShardsSource" in head
    figure = {"in1k_vith14_ep300": "79.3", "in1k_vith16-448_ep300": "81.1"}.get(name)
    published = head.split("Published", 1)[1][:60].lower()
    assert (figure in head and "Table 1" in head) if figure else ("none found" in published or ": no " in published)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet_layout")
    write_folder(root / "train", per_class=4, suffix="png")
    write_folder(root / "val", per_class=2, suffix="png", split="val")
    return root


STAND_IN = (
    *(f"--model.{key}={value}" for key, value in TINY_MODEL.items() if key != "image_size"),  # patch 8
    "--model.mlp_ratio=4.0",
    "--data.image_size=64",  # an 8x8 grid: the presets' masks (min_keep 10) as they are
    "--data.batch_size=4",
    "--data.num_workers=0",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
    "--trainer.num_nodes=1",
    "--trainer.strategy=auto",
    "--trainer.precision=32",
    "--trainer.max_steps=1",
    "--model.optim.warmup_steps=0",  # no warning that the warm-up outlasts the one-step run
    "--trainer.num_sanity_val_steps=0",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
)


@pytest.mark.parametrize("name", ALL)
def test_every_preset_trains_one_step_on_cpu_at_a_stand_in_size(name, image_folder, tmp_path):
    run = cli(
        "fit",
        "--config",
        str(PRESETS / f"{name}.yaml"),
        f"--data.source.root={image_folder}",
        f"--trainer.default_root_dir={tmp_path}",
        *STAND_IN,
    )
    assert run.trainer.global_step == 1
    assert math.isfinite(float(run.trainer.callback_metrics["train/loss"]))
    (last,) = tmp_path.rglob("last.ckpt")
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 1


def test_domain_adaptation_holds_the_ema_advice_and_starts_from_a_converted_checkpoint(parser, image_folder, tmp_path):
    """configs/presets/adapt_vith14.yaml over the official preset: EMA in vjepa2 issue 93's range, and at a stand-in
    size a run that starts from a converted official checkpoint's weights with a fresh schedule (not a resume)."""
    adapt = PRESETS / "adapt_vith14.yaml"
    config = resolve(parser, "in1k_vith14_ep300", "--config", str(adapt))
    ema = callback(config, "EMATargetUpdate")
    assert 0.99 <= ema.momentum <= 0.9995 and ema.final_momentum == ema.momentum
    assert callback(config, "PositionEmbeddingInterpolation").init_checkpoint == "vith14.ckpt"
    # the stand-in "published" checkpoint: the preset's model at the stand-in size, trained-looking, official format
    overrides = [f"--data.source.root={image_folder}", *STAND_IN]
    model, _ = instantiate(str(PRESETS / "in1k_vith14_ep300.yaml"), overrides)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    torch.save(to_official(model), tmp_path / "official.pth.tar")
    heads = [
        "--num_heads",
        str(model.hparams.num_heads),
        "--predictor_num_heads",
        str(model.hparams.predictor_num_heads),
    ]
    converted = tmp_path / "vith14.ckpt"
    main(["convert", str(tmp_path / "official.pth.tar"), str(converted), "ckpt", *heads])
    layered = tmp_path / "adapt.yaml"
    layered.write_text(adapt.read_text().replace("init_checkpoint: vith14.ckpt", f"init_checkpoint: {converted}"))
    run = cli(
        "fit", "--config", str(PRESETS / "in1k_vith14_ep300.yaml"), "--config", str(layered),
        f"--trainer.default_root_dir={tmp_path}", *overrides,
    )  # fmt: skip
    assert run.trainer.global_step == 1
    fitted = run.trainer.lightning_module
    start = model.target_encoder.transformer.blocks[0].attn.qkv.weight
    moved = (fitted.target_encoder.transformer.blocks[0].attn.qkv.weight - start).abs().max()
    assert moved < 1e-3, "the target encoder starts from the checkpoint's and moves by one EMA step"
    scheduler = run.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 1  # a fresh schedule, one step into its warm-up
