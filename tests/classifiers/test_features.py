"""Sharded extraction: each process encodes every world-th item and the pieces gather back into the dataset order."""

import pytest
import torch
from torch.utils.data import DataLoader

from ijepa.classifiers import gather_in_order, shard_indices
from ijepa.data.collate import labeled_collate


@pytest.mark.parametrize("size, world", [(10, 3), (12, 4), (5, 2), (3, 4)])
def test_sharded_loaders_gather_back_to_the_dataset_order(size, world):
    dataset = [(torch.full((1, 2, 2), float(i)), i) for i in range(size)]
    loader = DataLoader(dataset, batch_size=2, collate_fn=labeled_collate)
    per_rank = []
    for rank in range(world):
        shard = DataLoader(
            loader.dataset, batch_size=2, sampler=shard_indices(size, rank, world), collate_fn=labeled_collate
        )
        values = torch.cat([b.images.flatten(1)[:, 0] for b in shard])
        per_rank.append(values)
    assert len({len(v) for v in per_rank}) == 1  # equal lengths: all_gather needs it
    gathered = torch.stack(per_rank)  # what all_gather returns
    assert gather_in_order(per_rank[rank], lambda _: gathered, world, size).tolist() == list(range(size))
