"""The k-NN probe: voting arithmetic and the DDP sharding of its loaders."""

import math

import pytest
import torch
from torch.utils.data import DataLoader

from ijepa.callbacks.knn import knn_scores
from ijepa.callbacks.probe import _shard, _unshard
from ijepa.data.datamodule import labeled_collate


def test_knn_scores_by_hand():
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1, 1])
    query = torch.tensor([[2.0, 0.0]])
    scores = knn_scores(bank, labels, query, num_classes=2, k=2, temperature=0.5)
    # nearest two by cosine: [1, 0] (cos 1) for class 0, [1, 1] (cos 1/sqrt 2) for class 1
    expected = torch.tensor([[math.exp(1 / 0.5), math.exp((1 / math.sqrt(2)) / 0.5)]])
    torch.testing.assert_close(scores, expected)
    # k larger than the bank uses the whole bank
    assert knn_scores(bank, labels, query, 2, k=10).shape == (1, 2)


@pytest.mark.parametrize("size, world", [(10, 3), (12, 4), (5, 2), (3, 4)])
def test_sharded_loaders_gather_back_to_the_dataset_order(size, world):
    dataset = [(torch.full((1, 2, 2), float(i)), i) for i in range(size)]
    loader = DataLoader(dataset, batch_size=2, collate_fn=labeled_collate)
    per_rank = []
    for rank in range(world):
        shard = _shard(loader, rank, world)
        values = torch.cat([b.images.flatten(1)[:, 0] for b in shard])
        per_rank.append(values)
    assert len({len(v) for v in per_rank}) == 1  # equal lengths: all_gather needs it
    gathered = torch.stack(per_rank)  # what all_gather returns
    assert _unshard(gathered, size).tolist() == list(range(size))
