"""The mask ablations of configs/ablations/: scattered targets at their ratio, and multi-block
masks whose targets cover random_masks_065's share of the quickstart's 6x6 grid."""

import pytest
import torch
import yaml
from conftest import ROOT

from ijepa.masks import Masks
from ijepa.registry import from_config

ABLATIONS = ROOT / "configs" / "ablations"


def target_share(name: str, batches: int = 50) -> float:
    """The mean share of the 6x6 grid in an image's targets (their union), over seeded draws."""
    masks = from_config(yaml.safe_load((ABLATIONS / f"{name}.yaml").read_text())["data"]["masks"], Masks)
    sampler, generator, shares = masks.sampler(6), torch.Generator().manual_seed(0), []
    for _ in range(batches):
        _, targets = sampler(64, generator)
        union = torch.zeros(targets.size(0), 36, dtype=torch.bool)
        union.scatter_(1, targets.flatten(1), True)
        shares.append(union.float().mean(1))
    return float(torch.cat(shares).mean())


@pytest.mark.parametrize(
    "name, ratio", [("random_masks_050", 0.5), ("random_masks_065", 0.65), ("random_masks_075", 0.75)]
)
def test_scattered_targets_take_their_ratio_of_the_grid(name, ratio):
    assert target_share(name, batches=5) == pytest.approx(round(36 * ratio) / 36, abs=1 / 36)


def test_the_matched_block_masks_cover_what_random_masks_065_does():
    assert 0.62 <= target_share("block_masks_065") <= 0.68
    default = from_config({"class_path": "ijepa.masks.MultiBlockMasks"}, Masks).sampler(6)
    generator = torch.Generator().manual_seed(0)
    _, targets = default(512, generator)
    union = torch.zeros(targets.size(0), 36, dtype=torch.bool).scatter_(1, targets.flatten(1), True)
    assert 0.45 <= float(union.float().mean()) <= 0.53  # the quickstart's own blocks
