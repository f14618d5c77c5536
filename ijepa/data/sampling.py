"""Reproducible, resumable sampling: every random draw of the data pipeline is a function of
``(seed, epoch, sample index)``.

* :class:`EpochSampler` shuffles with a permutation seeded by ``(seed, epoch)`` and shards it
  over the DDP ranks (it is a ``DistributedSampler``, so Lightning keeps it);
  :class:`ResumableDataLoader` saves its position in the checkpoint, so a run resumed in the
  middle of an epoch skips exactly the batches that were already trained.
* :class:`SeededSamples` runs each sample's augmentation under a generator seeded by
  ``(seed, epoch, index)`` and hands that seed on, so :class:`ijepa.data.collate.MaskCollator` seeds the
  batch's masks from the seeds of its samples.

Nothing therefore depends on the worker a batch lands in, the number of workers, or the global
RNG: a resumed run sees exactly the images, augmentations and masks an uninterrupted run sees,
and different ranks and batches (hence workers) get different draws.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def mix_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (NumPy's ``SeedSequence``), the same in every process."""
    return int(
        np.random.SeedSequence([int(p) & 0xFFFFFFFFFFFFFFFF for p in parts]).generate_state(1, np.uint64)[0] >> 1
    )


class EpochSampler(DistributedSampler):
    """Yields ``(index, epoch)`` keys: a ``(seed, epoch)``-seeded shuffle of this rank's share.

    Args:
        dataset: the dataset to sample.
        batch_size: the loader's batch size (to skip whole batches on resume).
        num_replicas, rank: DDP world size and this process's rank.
        seed, shuffle, drop_last: as ``DistributedSampler``.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.batch_size = batch_size
        self._resume: tuple[int, int] | None = None

    def resume(self, epoch: int, batches_done: int) -> None:
        """Make the next iteration continue ``epoch`` after its first ``batches_done`` batches
        (the next epoch from its start when they were all done)."""
        if batches_done >= len(self) // self.batch_size:
            epoch, batches_done = epoch + 1, 0
        self._resume = (epoch, batches_done)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        skip = 0
        if self._resume is not None:
            (self.epoch, skip), self._resume = self._resume, None
        indices = list(super().__iter__())[skip * self.batch_size :]
        return iter([(index, self.epoch) for index in indices])


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over an :class:`EpochSampler` whose position Lightning saves in the
    checkpoint (``state_dict``) and restores before iterating (``load_state_dict``).

    The position is ``(epoch, batches of it trained)``: the epoch is the sampler's, the one the
    batches are drawn from, and ``progress()`` returns the batches trained, read from the trainer
    at save time (the loader's own count would be ahead by the batches Lightning prefetches).
    Lightning's epoch counter would not do: at the end of a run stopped by ``max_steps``
    mid-epoch it counts that epoch as completed, though only some of its batches were trained.
    """

    def __init__(self, *args, progress: Callable[[], int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.progress = progress

    def state_dict(self) -> dict[str, int]:
        batches = self.progress() if self.progress is not None else 0
        return {"epoch": int(self.sampler.epoch), "batches": int(batches)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.resume(state["epoch"], state["batches"])


class SeededSamples(Dataset):
    """Wraps a ``(image, label)`` dataset (or ``(clip, label, frame_times)``):
    ``dataset[(index, epoch)]`` runs under a generator seeded by ``(seed, epoch, index)`` and
    returns the sample with ``sample_seed`` (an ``int``) appended: ``(image, label, sample_seed)``.

    Plain integer keys mean epoch 0 (evaluation loaders: the same masks at every validation).
    """

    def __init__(self, dataset: Dataset, seed: int = 0):
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | tuple[int, int]):
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        sample_seed = mix_seed(self.seed, epoch, index)
        # fork_rng keeps the caller's global RNG untouched (num_workers=0 runs this in the main process).
        with torch.random.fork_rng(devices=[]):
            # The CPU generator alone: torch.manual_seed also queues seeds for every accelerator
            # and, before CUDA is initialised, records a stack trace per call (~4 ms a sample).
            torch.default_generator.manual_seed(sample_seed)
            sample = self.dataset[index]
        return (*sample, sample_seed)
