"""The fine-tuning presets carry MAE's published ImageNet-1k fine-tuning values, each named here
beside ours (facebookresearch/mae FINETUNE.md, main_finetune.py's defaults), and parse."""

import pytest
import yaml
from conftest import ROOT

from ijepa.finetune.cli import SUBCOMMANDS, FinetuneCLI
from ijepa.finetune.data import FinetuneData
from ijepa.finetune.module import FineTuner

IMAGENET_TRAIN = 1_281_167
EFFECTIVE_BATCH = 1024  # MAE: 32 a GPU x 32 GPUs (ViT-B), 16 x 64 (ViT-H)
STEPS_PER_EPOCH = IMAGENET_TRAIN // EFFECTIVE_BATCH

# MAE's command lines and defaults: (blr, epochs, layer_decay, drop_path), then what every size shares
MAE = {
    "in1k_vitb16.yaml": {
        "blr": 5e-4,
        "epochs": 100,
        "layer_decay": 0.65,
        "drop_path": 0.1,
        "patch": 16,
        "width": 768,
        "depth": 12,
        "heads": 12,
    },
    "in1k_vith14.yaml": {
        "blr": 1e-3,
        "epochs": 50,
        "layer_decay": 0.75,
        "drop_path": 0.3,
        "patch": 14,
        "width": 1280,
        "depth": 32,
        "heads": 16,
    },
}
SHARED = {
    "warmup_epochs": 5,
    "min_lr": 1e-6,
    "weight_decay": 0.05,
    "betas": [0.9, 0.999],
    "mixup": 0.8,
    "cutmix": 1.0,
    "mixup_switch_prob": 0.5,
    "mixup_prob": 1.0,
    "smoothing": 0.1,
    "reprob": 0.25,
    "randaug_ops": 2,  # timm's rand-m9: 2 ops (num_layers default) of magnitude 9
    "randaug_magnitude": 9,
    "crop_scale": [0.08, 1.0],
    "input_size": 224,
}


@pytest.mark.parametrize("name", sorted(MAE))
def test_each_preset_holds_maes_published_value_beside_ours(name):
    config = yaml.safe_load((ROOT / "configs" / "finetune" / name).read_text())
    model, data, optim = config["model"], config["data"], config["model"]["optim"]
    official = {**SHARED, **MAE[name]}
    ours_vs_theirs = [
        (optim["lr"], official["blr"] * EFFECTIVE_BATCH / 256),
        (config["trainer"]["max_steps"], official["epochs"] * STEPS_PER_EPOCH),
        (optim["warmup_steps"], official["warmup_epochs"] * STEPS_PER_EPOCH),
        (optim["final_lr"], official["min_lr"]),
        (optim["layer_decay"], official["layer_decay"]),
        (optim["weight_decay"], official["weight_decay"]),
        (optim["betas"], official["betas"]),
        (model["drop_path_rate"], official["drop_path"]),
        (data["batch_size"], EFFECTIVE_BATCH),
        (data["mixup_alpha"], official["mixup"]),
        (data["cutmix_alpha"], official["cutmix"]),
        (data["switch_prob"], official["mixup_switch_prob"]),
        (data["mix_prob"], official["mixup_prob"]),
        (data["label_smoothing"], official["smoothing"]),
        (data["erasing"], official["reprob"]),
        (data["randaugment_ops"], official["randaug_ops"]),
        (data["randaugment_magnitude"], official["randaug_magnitude"]),
        (data["crop_scale"], official["crop_scale"]),
        (data["image_size"], official["input_size"]),
        (model["architecture"]["patch_size"], official["patch"]),
        (model["architecture"]["embed_dim"], official["width"]),
        (model["architecture"]["depth"], official["depth"]),
        (model["architecture"]["num_heads"], official["heads"]),
    ]
    for ours, theirs in ours_vs_theirs:
        assert ours == pytest.approx(theirs), (name, ours, theirs)


class _Parsed(Exception):
    pass


class _ParserOnly(FinetuneCLI):
    def parse_arguments(self, parser, args):
        raise _Parsed(parser)


@pytest.mark.parametrize("name", ["quickstart.yaml", "digits.yaml", *sorted(MAE)])
def test_every_finetune_config_parses_with_the_finetune_command(name):
    with pytest.raises(_Parsed) as parsed:
        _ParserOnly(FineTuner, FinetuneData, args=["fit"])
    parser = parsed.value.args[0]
    config = parser.parse_args(["fit", "--config", str(ROOT / "configs" / "finetune" / name)])
    assert config.subcommand in SUBCOMMANDS
    assert config.fit.data.image_size == config.fit.model.image_size  # linked
