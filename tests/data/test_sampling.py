"""Seeded, sharded, resumable sampling of the pretraining data."""

from dataclasses import fields

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms import v2

from ijepa.data.collate import MaskCollator
from ijepa.data.sampling import EpochSampler, SeededSamples, mix_seed
from ijepa.masks import MultiBlockMaskSampler


class Augmented(torch.utils.data.Dataset):
    """index -> (randomly cropped image, label): the crop uses torch's global RNG, like v2."""

    def __init__(self, n=40):
        self.images = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        self.crop = v2.RandomResizedCrop(16, scale=(0.3, 1.0), antialias=True)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.crop(self.images[index]), index % 4


def batches(num_workers, epoch=0, rank=0, world=1, resume=None):
    dataset = Augmented()
    sampler = EpochSampler(dataset, batch_size=8, num_replicas=world, rank=rank, seed=7)
    sampler.set_epoch(epoch)
    if resume is not None:
        sampler.resume(*resume)
    collate = MaskCollator(MultiBlockMaskSampler(4, target_scale=(0.1, 0.2), min_keep=2))
    loader = DataLoader(
        SeededSamples(dataset, seed=7),
        batch_size=8,
        sampler=sampler,
        collate_fn=collate,
        num_workers=num_workers,
        drop_last=True,
        generator=torch.Generator().manual_seed(7),
    )
    return list(loader)


def same(a, b):
    tensors = [f.name for f in fields(a[0]) if torch.is_tensor(getattr(a[0], f.name))]
    return all(torch.equal(getattr(x, k), getattr(y, k)) for x, y in zip(a, b) for k in tensors) and len(a) == len(b)


def test_mix_seed_is_stable_and_sensitive():
    assert mix_seed(1, 2, 3) == mix_seed(1, 2, 3)
    assert len({mix_seed(1, 2, 3), mix_seed(1, 3, 2), mix_seed(1, 2, 4), mix_seed(2, 2, 3)}) == 4
    assert 0 <= mix_seed(2**70, -1) < 2**63


def test_images_augmentations_and_masks_do_not_depend_on_workers_or_global_rng():
    torch.manual_seed(0)
    in_process = batches(num_workers=0)
    torch.manual_seed(123)  # the global RNG plays no part
    assert same(in_process, batches(num_workers=2))
    # and the seeded pipeline leaves the caller's global RNG untouched
    torch.manual_seed(5)
    batches(num_workers=0)
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_epochs_reshuffle_reaugment_and_remask():
    first, second = batches(0, epoch=0), batches(0, epoch=1)
    assert not torch.equal(first[0].labels, second[0].labels) or not torch.equal(first[0].images, second[0].images)
    # the same image gets a different crop in another epoch
    assert not any(torch.equal(a.images, b.images) for a in first for b in second)
    assert not all(torch.equal(a.context_indices, b.context_indices) for a, b in zip(first, second))


def test_ranks_get_disjoint_shares_and_different_masks():
    dataset = Augmented()
    shares = [list(EpochSampler(dataset, batch_size=8, num_replicas=2, rank=r, seed=7)) for r in (0, 1)]
    indices = [{i for i, _ in share} for share in shares]
    assert not indices[0] & indices[1] and len(indices[0] | indices[1]) == len(dataset)
    rank0, rank1 = batches(0, rank=0, world=2), batches(0, rank=1, world=2)
    assert not torch.equal(rank0[0].target_indices, rank1[0].target_indices)


def test_resume_skips_exactly_the_trained_batches():
    whole_epoch = batches(0, epoch=3)
    assert len(whole_epoch) == 5
    assert same(batches(0, resume=(3, 2)), whole_epoch[2:])
    # all batches of epoch 3 done: continue with epoch 4 from its start
    assert same(batches(0, resume=(3, 5)), batches(0, epoch=4))


def test_plain_integer_keys_mean_epoch_zero():
    samples = SeededSamples(TensorDataset(torch.arange(5.0), torch.arange(5)), seed=1)
    assert samples[2][:2] == samples[(2, 0)][:2] and samples[2][2] == samples[(2, 0)][2]
    assert samples[(2, 1)][2] != samples[(2, 0)][2]
