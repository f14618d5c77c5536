"""MixUp / CutMix and label smoothing in the collate: soft targets that sum to 1, seeded by the samples."""

import pytest
import torch
import torch.nn.functional as F

from ijepa.finetune.mixing import MixCollate, smooth


def samples(count: int = 8, classes: int = 5, seed: int = 0) -> list:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(count, 3, 16, 16, generator=generator)
    return [(images[i], i % classes, 1000 + i) for i in range(count)]


@pytest.mark.parametrize(("mixup", "cutmix"), [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixed_targets_sum_to_one_and_weigh_at_most_two_labels_per_image(mixup, cutmix):
    collate = MixCollate(5, mixup_alpha=mixup, cutmix_alpha=cutmix, label_smoothing=0.1)
    images, targets = collate(samples())
    assert images.shape == (8, 3, 16, 16) and targets.shape == (8, 5)
    assert torch.allclose(targets.sum(-1), torch.ones(8))
    unsmoothed = (targets - 0.1 / 5) / 0.9
    assert ((unsmoothed > 1e-6).sum(-1) <= 2).all()
    assert (unsmoothed > -1e-6).all()


def test_mixup_mixes_images_and_targets_with_one_lambda():
    collate = MixCollate(5, mixup_alpha=0.8)
    batch = samples()
    images, targets = collate(batch)
    plain = torch.stack([item[0] for item in batch])
    labels = torch.tensor([item[1] for item in batch])
    lam = float(targets[0, labels[0]])  # torchvision mixes image i with image i - 1 (the batch rolled by one)
    assert 0 < lam < 1
    assert torch.allclose(images, lam * plain + (1 - lam) * plain.roll(1, 0), atol=1e-6)


def test_the_same_samples_give_the_same_batch_and_other_samples_another():
    collate = MixCollate(5, mixup_alpha=0.8, cutmix_alpha=1.0)
    first, again, other = collate(samples()), collate(samples()), collate(samples(seed=0)[::-1])
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])


def test_label_smoothing_alone_trains_what_cross_entropy_with_label_smoothing_trains():
    labels = torch.tensor([0, 3, 1, 4])
    logits = torch.randn(4, 5)
    targets = smooth(F.one_hot(labels, 5).float(), 0.2)
    assert torch.allclose(F.cross_entropy(logits, targets), F.cross_entropy(logits, labels, label_smoothing=0.2))
    _, collated = MixCollate(5, label_smoothing=0.2)(samples(4))
    assert torch.allclose(collated, smooth(F.one_hot(torch.tensor([0, 1, 2, 3]), 5).float(), 0.2))


def test_a_label_outside_the_class_count_is_one_line_naming_num_classes():
    with pytest.raises(ValueError, match=r"label 7 lies outside 0\.\.4 \(model\.num_classes=5\)"):
        MixCollate(5)([(torch.zeros(3, 4, 4), 7, 1), (torch.zeros(3, 4, 4), 1, 2)])


@pytest.mark.parametrize(
    ("option", "value"),
    [("mixup_alpha", -1.0), ("cutmix_alpha", -0.5), ("switch_prob", 1.5), ("label_smoothing", 1.0)],
)
def test_out_of_range_mixing_options_name_themselves(option, value):
    with pytest.raises(ValueError, match=f"data.{option}"):
        MixCollate(5, **{option: value})
