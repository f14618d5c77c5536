"""Attentive probe of frozen token features (V-JEPA's protocol): learned queries cross-attend over
every token of an image or clip, and a linear layer classifies the result. Mean pooling averages
away what sits in a few tokens or in how tokens differ; attention pooling can keep it.

A schedule over one :class:`ijepa.classifiers.AttentiveHead`, trained as ``ijepa eval``'s
``AttentiveProtocol`` trains a head on cached tokens.
"""

from __future__ import annotations

import lightning as L
import torch

from ijepa.callbacks.probe import Probe
from ijepa.classifiers import AttentiveHeadGrid, HeadGridTrainer, feature_batches, grid_scores
from ijepa.nn.checks import check_range


class AttentiveProbe(Probe):
    """Train one :class:`~ijepa.classifiers.AttentiveHead` (one cross-attention block, one query)
    on the frozen token features of the labelled train split and report top-1 on the held-out
    split as ``val/attentive_top1`` (``test/attentive_top1``). When it runs and its standing down
    on unlabelled data: :class:`~ijepa.callbacks.probe.Probe`.

    The head trains with AdamW for ``steps`` minibatches of cached tokens under a cosine schedule,
    exactly as ``AttentiveProtocol(lrs=[lr], weight_decays=[weight_decay], depth=1,
    num_queries=1, augment=false)`` trains its head on the same features. Token features of the
    whole bank are held in memory, ``N x K x D`` floats (1,920 clips x 32 tokens x 96 in the video
    quickstart; 5,000 STL-10 images x 144 x 384 is 1.1 GB).

    Args:
        every_n_epochs: during ``fit``, probe at validations that end a training epoch whose number
            is a multiple of this (training epochs, not validations).
        num_heads: attention heads of the head (must divide the encoder width).
        steps: AdamW minibatch steps.
        batch_size: minibatch size (at most the bank's size is used).
        lr: AdamW's peak learning rate.
        weight_decay: AdamW's weight decay.
        encoder: ``target`` (default) or ``online``.
        probe_at_start: also probe the random-init encoder when ``fit`` starts.
        seed: initialisation and batch order of the head.
    """

    metric = "attentive_top1"
    title = "Attentive probe"

    def __init__(
        self,
        every_n_epochs: int = 1,
        num_heads: int = 4,
        steps: int = 400,
        batch_size: int = 128,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        encoder: str = "target",
        probe_at_start: bool = True,
        seed: int = 0,
    ):
        super().__init__(every_n_epochs=every_n_epochs, encoder=encoder, probe_at_start=probe_at_start)
        for name, value in (("num_heads", num_heads), ("steps", steps), ("batch_size", batch_size)):
            check_range(value, name, 1)
        check_range(lr, "lr", 0, low_open=True)
        check_range(weight_decay, "weight_decay", 0)
        self.num_heads, self.steps, self.batch_size = num_heads, steps, batch_size
        self.lr, self.weight_decay, self.seed = lr, weight_decay, seed

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        width = pl_module.encoder.embed_dim
        if width % self.num_heads:
            raise ValueError(f"AttentiveProbe num_heads must divide the encoder width {width}, got {self.num_heads}.")

    def feature_options(self) -> dict:
        return {"tokens": True}

    def score(self, bank, bank_labels, queries, query_labels, num_classes: int) -> float:
        with torch.inference_mode(False):  # validate and test run under inference mode
            grid = AttentiveHeadGrid(bank.size(-1), num_classes, count=1, num_heads=self.num_heads, seed=self.seed)
            grid = grid.to(bank.device)
            trainer = HeadGridTrainer([(grid, lambda x: x)], [self.lr], [self.weight_decay], "adamw", self.steps)
            batch_size = min(self.batch_size, bank.size(0))
            for tokens, labels in feature_batches(bank, bank_labels, batch_size, self.seed, self.steps):
                trainer.step(tokens, labels)
        return grid_scores(grid, queries, query_labels, batch_size)[0]
