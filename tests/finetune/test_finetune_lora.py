"""LoRA through peft: only the adapters and the head train, and merged equals unmerged."""

import sys

import pytest
import torch

from ijepa.finetune import FineTuner
from ijepa.finetune.lora import LoraOptions, add_lora, has_lora, merge_lora
from ijepa.nn.vit import VisionTransformer

ARCH = {"image_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}


def test_lora_trains_only_the_adapters_and_the_head():
    model = FineTuner(architecture=ARCH, num_classes=3, lora={"rank": 4})
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name or name.startswith("head.") for name in trainable)
    adapted = {name.split(".lora_")[0] for name in trainable if "lora_" in name}
    assert len(adapted) == 4 * ARCH["depth"]  # qkv, proj, fc1, fc2 of every block


def test_a_fresh_adapter_changes_nothing_and_merged_equals_unmerged():
    torch.manual_seed(0)
    network = VisionTransformer.for_images(**ARCH)
    images = torch.randn(2, 3, 16, 16)
    plain = network.eval()(images)
    add_lora(network, LoraOptions(rank=4, alpha=8.0))
    assert torch.allclose(network(images), plain, atol=1e-6), "B = 0 at the start"
    with torch.no_grad():
        for name, param in network.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    unmerged = network(images)
    assert not torch.allclose(unmerged, plain, atol=1e-3)
    merge_lora(network)
    assert not has_lora(network)
    assert all(type(m).__module__.startswith(("torch.", "ijepa.")) for m in network.modules())
    assert torch.allclose(network(images), unmerged, atol=1e-5)
    assert set(network.state_dict()) == set(VisionTransformer.for_images(**ARCH).state_dict())


def test_lora_and_trainable_blocks_together_are_one_line():
    with pytest.raises(ValueError, match="model.lora and model.trainable_blocks"):
        FineTuner(architecture=ARCH, num_classes=3, lora={"rank": 2}, trainable_blocks=1)


def test_unknown_lora_targets_name_the_valid_ones():
    with pytest.raises(ValueError, match=r"model\.lora\.targets must be a non-empty subset of \['qkv'"):
        LoraOptions(targets=("q",))


def test_lora_without_peft_installed_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(ImportError, match=r"model\.lora needs the peft package.*pip install 'ijepa-lightning\[lora\]'"):
        FineTuner(architecture=ARCH, num_classes=3, lora={"rank": 2})
