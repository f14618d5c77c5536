"""k-NN probe of frozen encoder features (cosine-weighted voting, as in DINO): a schedule over\n:func:`ijepa.classifiers.knn_scores`, the vote of ``ijepa eval``'s ``KNNProtocol``."""

from __future__ import annotations

from ijepa.callbacks.probe import Probe
from ijepa.classifiers import knn_scores, top1
from ijepa.nn.checks import check_range


class KNNProbe(Probe):
    """Score mean-pooled encoder features with a cosine-weighted k-NN classifier.

    The bank is the labeled train split (``datamodule.probe_train_dataloader()``), the queries the
    held-out split (``datamodule.probe_test_dataloader()``); images labelled ``-1`` (unlabeled) never
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
        return top1(knn_scores(bank, bank_labels, queries, num_classes, self.k, self.temperature), query_labels)
