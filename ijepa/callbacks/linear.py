"""Linear probe of frozen encoder features: the standard measure for masked-prediction methods
(k-NN alone misleads: MAE ViT-B is 46.0 linear but 11.2 k-NN on ImageNet)."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics.classification import MulticlassAccuracy

from ijepa.callbacks.knn import Probe, extract_features


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

    Features are extracted once per probe (sharded over DDP ranks and gathered, like
    :class:`KNNProbe`), the classifier is fitted in memory on the module's device. Like
    :class:`KNNProbe` it runs once when ``fit`` starts (the random-init baseline, logged at step
    0), at each validation of ``fit`` that ends a training epoch whose number is a multiple of
    ``every_n_epochs``, at the end of ``fit`` if the last
    step was not probed, and in ``validate`` / ``test``. On unlabelled data (``num_classes``
    below 2) it logs nothing and warns once (:class:`ijepa.callbacks.knn.Probe`).

    Args:
        every_n_epochs: during ``fit``, probe at validations that end a training epoch whose number
            is a multiple of this (training epochs, not validations).
        weight_decay: L2 penalty of the classifier.
        max_iter: L-BFGS iterations.
        encoder: ``target`` (default) or ``online``.
        last_blocks: probe on the concatenated mean-pooled outputs of the encoder's last this
            many blocks (each through the final norm); 1 is the last block alone.
        probe_at_start: also probe the random-init encoder when ``fit`` starts.
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        weight_decay: float = 1e-4,
        max_iter: int = 200,
        encoder: str = "target",
        last_blocks: int = 1,
        probe_at_start: bool = True,
    ):
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}.")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
        if max_iter < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter}.")
        if encoder not in ("target", "online"):
            raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
        if last_blocks < 1:
            raise ValueError(f"last_blocks must be >= 1 (and at most the encoder depth), got {last_blocks}.")
        self.every_n_epochs = every_n_epochs
        self.weight_decay = weight_decay
        self.max_iter = max_iter
        self.encoder = encoder
        self.last_blocks = last_blocks
        self.probe_at_start = probe_at_start
        self._last_probed_step: int | None = None

    # What this probe logs and prints; AttentiveProbe overrides them.
    metric = "linear_top1"
    title = "Linear probe"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        depth = len(pl_module.encoder.transformer.blocks)
        if self.last_blocks > depth:
            raise ValueError(
                f"LinearProbe last_blocks must be in 1..{depth} (the encoder depth), got {self.last_blocks}."
            )

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """Top-1 accuracy in [0, 1] of a linear classifier on the current encoder's features."""
        datamodule = trainer.datamodule
        was_training = pl_module.training
        pl_module.eval()
        train_x, train_y = extract_features(
            trainer, pl_module, datamodule.knn_train_dataloader(), self.encoder, self.last_blocks
        )
        test_x, test_y = extract_features(
            trainer, pl_module, datamodule.knn_test_dataloader(), self.encoder, self.last_blocks
        )
        pl_module.train(was_training)
        num_classes = datamodule.num_classes
        classifier = train_linear_classifier(train_x, train_y, num_classes, self.weight_decay, self.max_iter)
        with torch.no_grad():
            logits = classifier(test_x.float())
        accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro").to(logits.device)
        return float(accuracy(logits, test_y))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.skipped(trainer):
            return
        in_fit = trainer.state.fn == "fit"
        if in_fit and (trainer.current_epoch + 1) % self.every_n_epochs != 0:
            return
        top1 = self.evaluate(trainer, pl_module)
        self._last_probed_step = trainer.global_step
        pl_module.log(f"val/{self.metric}", top1)
        if in_fit:
            rank_zero_info(f"{self.title} (step {trainer.global_step}): val/{self.metric} = {top1:.4f}")

    def _probe_and_log_direct(self, trainer: L.Trainer, pl_module: L.LightningModule, when: str) -> None:
        # Outside the validation loop self.log is not available, so write to the loggers directly.
        if self.skipped(trainer):
            return
        top1 = self.evaluate(trainer, pl_module)
        self._last_probed_step = trainer.global_step
        for logger in trainer.loggers:
            logger.log_metrics({f"val/{self.metric}": top1}, step=trainer.global_step)
        rank_zero_info(f"{self.title} ({when}, step {trainer.global_step}): val/{self.metric} = {top1:.4f}")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.probe_at_start and trainer.global_step == 0:
            self._probe_and_log_direct(trainer, pl_module, "random init")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_probed_step != trainer.global_step:
            self._probe_and_log_direct(trainer, pl_module, "end of training")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.skipped(trainer):
            pl_module.log(f"test/{self.metric}", self.evaluate(trainer, pl_module))
