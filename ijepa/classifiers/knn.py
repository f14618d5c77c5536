"""The k-NN vote of DINO: cosine similarity to a bank of labelled features, each of the ``k``
nearest rows voting ``exp(similarity / temperature)`` for its class."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ijepa.nn.checks import check_range, check_values


def knn_sweep(
    bank_x: torch.Tensor,
    bank_y: torch.Tensor,
    query_x: torch.Tensor,
    num_classes: int,
    ks: list[int],
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> dict[int, torch.Tensor]:
    """Class scores ``[Q, num_classes]`` of ``query_x [Q, D]`` for each k of ``ks``, keyed by k,
    from one top-``max(ks)`` cosine search of the whole bank ``bank_x [N, D]`` (labels ``[N]``) per
    chunk of ``chunk_size`` queries; each of a query's ``k`` nearest rows votes
    ``exp(similarity / temperature)`` for its class.

    The neighbours come sorted by similarity, so the first k of the top-``max(ks)`` are the top k
    (where the k-th and (k+1)-th similarities tie exactly, either may vote). A k larger than the
    bank is clamped to the bank size; the entry keeps the requested k as its key.
    """
    check_values(ks, "ks", 1, low_open=False)
    check_range(temperature, "temperature", 0, low_open=True)
    check_range(chunk_size, "chunk_size", 1)
    bank = F.normalize(bank_x.float(), dim=1)
    queries = F.normalize(query_x.float(), dim=1)
    widest = min(max(ks), bank.size(0))
    scores = {k: [] for k in ks}  # a repeated k is scored once
    for chunk in queries.split(chunk_size):
        similarity, neighbours = (chunk @ bank.T).topk(widest, dim=1)
        weights, classes = (similarity / temperature).exp(), bank_y[neighbours]
        for k in scores:
            kept = min(k, widest)
            votes = torch.zeros(chunk.size(0), num_classes, device=chunk.device)
            votes.scatter_add_(1, classes[:, :kept], weights[:, :kept])
            scores[k].append(votes)
    return {k: torch.cat(parts) for k, parts in scores.items()}


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
    rows of ``bank_features [N, D]`` (labels ``[N]``): :func:`knn_sweep` of the one ``k``."""
    return knn_sweep(bank_features, bank_labels, query_features, num_classes, [k], temperature, chunk_size)[k]
