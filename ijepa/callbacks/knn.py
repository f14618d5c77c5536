"""k-NN probe of frozen encoder features (cosine-weighted voting, as in DINO)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from ijepa.callbacks.probe import Probe
from ijepa.nn.checks import check_range


def knn_scores(
    bank_features: torch.Tensor,
    bank_labels: torch.Tensor,
    query_features: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Class scores ``[Q, C]`` of ``query_features [Q, D]`` from their ``k`` most cosine-similar
    rows of ``bank_features [N, D]`` (labels ``[N]``), each voting ``exp(similarity / temperature)``."""
    bank = F.normalize(bank_features.float(), dim=1)
    queries = F.normalize(query_features.float(), dim=1)
    k = min(k, bank.size(0))
    scores = []
    for chunk in queries.split(chunk_size):
        similarity, neighbours = (chunk @ bank.T).topk(k, dim=1)
        votes = torch.zeros(chunk.size(0), num_classes, device=chunk.device)
        votes.scatter_add_(1, bank_labels[neighbours], (similarity / temperature).exp())
        scores.append(votes)
    return torch.cat(scores)


class KNNProbe(Probe):
    """Score mean-pooled encoder features with a cosine-weighted k-NN classifier.

    The bank is the labeled train split (``datamodule.knn_train_dataloader()``), the queries the
    held-out split (``datamodule.knn_test_dataloader()``); images labelled ``-1`` (unlabeled) never
    enter. When it runs, what it logs (``val/knn_top1``, ``test/knn_top1``) and its standing down
    on unlabelled data: :class:`ijepa.callbacks.probe.Probe` (the default ``every_n_epochs: 1``
    probes at every validation, whatever ``check_val_every_n_epoch`` is).

    Args:
        k: neighbours that vote.
        temperature: each neighbour votes ``exp(cosine / temperature)``.
        every_n_epochs: during ``fit``, probe at validations that end a training epoch whose number
            is a multiple of this (training epochs, not validations).
        encoder: ``target`` (default) or ``online``.
        probe_at_start: also probe the random-init encoder when ``fit`` starts.
    """

    metric = "knn_top1"
    title = "k-NN probe"

    def __init__(
        self,
        k: int = 20,
        temperature: float = 0.07,
        every_n_epochs: int = 1,
        encoder: str = "target",
        probe_at_start: bool = True,
    ):
        super().__init__(every_n_epochs=every_n_epochs, encoder=encoder, probe_at_start=probe_at_start)
        check_range(k, "k", 1)
        check_range(temperature, "temperature", 0, low_open=True)
        self.k = k
        self.temperature = temperature

    def score(self, bank, bank_labels, queries, query_labels, num_classes: int) -> float:
        scores = knn_scores(bank, bank_labels, queries, num_classes, self.k, self.temperature)
        accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro").to(scores.device)
        return float(accuracy(scores, query_labels))
