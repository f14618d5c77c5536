"""Linear probe of frozen encoder features: the standard measure for masked-prediction methods
(k-NN alone misleads: MAE ViT-B is 46.0 linear but 11.2 k-NN on ImageNet)."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from ijepa.callbacks.probe import Probe
from ijepa.nn.checks import check_range


def train_linear_classifier(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, weight_decay: float = 1e-4, max_iter: int = 200
) -> torch.nn.Linear:
    """A linear classifier ``[N, D] -> [N, C]`` fitted in memory on standardised features.

    Full-batch L-BFGS on cross-entropy plus ``weight_decay * |W|^2`` (convex, so the result does
    not depend on a learning rate or an epoch count). The returned layer includes the
    standardisation, so it applies to raw features.
    """
    with torch.inference_mode(False), torch.enable_grad():  # validate/test run under inference mode
        return _fit(features.float().clone(), labels.clone(), num_classes, weight_decay, max_iter)


def _fit(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, weight_decay: float, max_iter: int
) -> torch.nn.Linear:
    mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
    x = (features - mean) / std
    linear = torch.nn.Linear(x.size(1), num_classes).to(x.device)
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    optimizer = torch.optim.LBFGS(linear.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(linear(x), labels) + weight_decay * linear.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():  # fold the standardisation into the layer: W (x - m) / s + b
        weight = linear.weight / std
        linear.bias -= (weight * mean).sum(1)
        linear.weight.copy_(weight)
    return linear


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
        weight_decay: L2 penalty of the classifier.
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
        classifier = train_linear_classifier(bank, bank_labels, num_classes, self.weight_decay, self.max_iter)
        with torch.no_grad():
            logits = classifier(queries.float())
        accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro").to(logits.device)
        return float(accuracy(logits, query_labels))
