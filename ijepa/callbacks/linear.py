"""Linear probe of frozen encoder features: the standard measure for masked-prediction methods
(k-NN alone misleads: MAE ViT-B is 46.0 linear but 11.2 k-NN on ImageNet). A schedule over
:func:`ijepa.classifiers.fit_logistic`, the classifier of ``ijepa eval``'s ``LogRegProtocol``."""

from __future__ import annotations

import lightning as L
import torch

from ijepa.callbacks.probe import Probe
from ijepa.classifiers import fit_logistic, top1
from ijepa.nn.checks import check_range


class LinearProbe(Probe):
    """Train a linear classifier on frozen, mean-pooled features of the labelled train split and
    report top-1 on the held-out split as ``val/linear_top1`` (``test/linear_top1``).

    Features come from :func:`ijepa.callbacks.probe.extract_features` (shared with the k-NN probe
    of the same validation); the classifier is fitted in memory on the module's device. When it
    runs and its standing down on unlabelled data: :class:`~ijepa.callbacks.probe.Probe`.

    Args:
        every_n_epochs: during ``fit``, probe at validations that end a training epoch whose number
            is a multiple of this (training epochs, not validations).
        encoder: ``target`` (default) or ``online``.
        probe_at_start: also probe the random-init encoder when ``fit`` starts.
        weight_decay: L2 penalty on the mean loss, ``mean CE + weight_decay * |W|^2`` (scikit-learn's
            ``C`` is ``1 / (2 * weight_decay * N)`` for a bank of ``N`` images).
        max_iter: L-BFGS iterations.
        last_blocks: probe on the concatenated mean-pooled outputs of the encoder's last this
            many blocks (each through the final norm); 1 is the last block alone.
    """

    metric = "linear_top1"
    title = "Linear probe"

    def __init__(
        self,
        every_n_epochs: int = 1,
        weight_decay: float = 1e-4,
        max_iter: int = 200,
        encoder: str = "target",
        last_blocks: int = 1,
        probe_at_start: bool = True,
    ):
        super().__init__(every_n_epochs=every_n_epochs, encoder=encoder, probe_at_start=probe_at_start)
        check_range(weight_decay, "weight_decay", 0)
        check_range(max_iter, "max_iter", 1)
        check_range(last_blocks, "last_blocks", 1)  # its upper end, the encoder depth, is checked at setup
        self.weight_decay = weight_decay
        self.max_iter = max_iter
        self.last_blocks = last_blocks

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        depth = len(pl_module.encoder.transformer.blocks)
        if self.last_blocks > depth:
            raise ValueError(
                f"LinearProbe last_blocks must be in 1..{depth} (the encoder depth), got {self.last_blocks}."
            )

    def feature_options(self) -> dict:
        return {"last_blocks": self.last_blocks}

    def score(self, bank, bank_labels, queries, query_labels, num_classes: int) -> float:
        classifier = fit_logistic(bank, bank_labels, num_classes, self.weight_decay, self.max_iter)
        with torch.no_grad():
            return top1(classifier(queries.float()), query_labels)
