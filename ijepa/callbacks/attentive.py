"""Attentive probe of frozen token features (V-JEPA's protocol): a learned query cross-attends
over every token of an image or clip, and a linear layer classifies the result. Mean pooling
averages away what sits in a few tokens or in how tokens differ; attention pooling can keep it.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from ijepa.callbacks.probe import Probe
from ijepa.nn.checks import check_range


class AttentivePooler(nn.Module):
    """``[B, K, D]`` tokens -> ``[B, C]`` logits: one learned query attends over the tokens
    (``nn.MultiheadAttention``, ``num_heads`` heads), then LayerNorm and a linear layer."""

    def __init__(self, embed_dim: int, num_classes: int, num_heads: int = 4):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num_heads must divide the feature width {embed_dim}, got {num_heads}.")
        self.query = nn.Parameter(torch.zeros(1, 1, embed_dim))
        nn.init.trunc_normal_(self.query, std=0.02)
        self.attention = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pooled, _ = self.attention(self.query.expand(tokens.size(0), -1, -1), tokens, tokens, need_weights=False)
        return self.head(self.norm(pooled[:, 0]))


def train_attentive_classifier(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    num_heads: int = 4,
    steps: int = 400,
    batch_size: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> AttentivePooler:
    """An :class:`AttentivePooler` fitted on ``tokens [N, K, D]`` and ``labels [N]`` with AdamW,
    ``steps`` minibatches of ``batch_size``. Its initialisation and batches come from ``seed``
    alone: the global RNG is left as it was (stochastic depth draws from it, and a resumed run
    must see the same draws)."""
    with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokens, labels = tokens.float().clone(), labels.clone()
        probe = AttentivePooler(tokens.size(-1), num_classes, num_heads).to(tokens.device)
        optimizer = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
        generator = torch.Generator(device=tokens.device).manual_seed(seed)
        for _ in range(steps):
            batch = torch.randint(
                0, tokens.size(0), (min(batch_size, tokens.size(0)),), generator=generator, device=tokens.device
            )
            loss = F.cross_entropy(probe(tokens[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return probe.eval()


class AttentiveProbe(Probe):
    """Train an :class:`AttentivePooler` on the frozen token features of the labelled train
    split and report top-1 on the held-out split as ``val/attentive_top1``
    (``test/attentive_top1``). When it runs and its standing down on unlabelled data:
    :class:`~ijepa.callbacks.probe.Probe`.

    Token features of the whole bank are held in memory, ``N x K x D`` floats (1,920 clips x 32
    tokens x 96 in the video quickstart; 5,000 STL-10 images x 144 x 384 is 1.1 GB).

    Args:
        every_n_epochs: during ``fit``, probe at validations that end a training epoch whose number
            is a multiple of this (training epochs, not validations).
        num_heads: attention heads of the pooler (must divide the encoder width).
        steps: AdamW minibatch steps.
        batch_size: minibatch size.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        encoder: ``target`` (default) or ``online``.
        probe_at_start: also probe the random-init encoder when ``fit`` starts.
        seed: initialisation and batch order of the pooler.
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
        probe = train_attentive_classifier(
            bank,
            bank_labels,
            num_classes,
            self.num_heads,
            self.steps,
            self.batch_size,
            self.lr,
            self.weight_decay,
            self.seed,
        )
        with torch.no_grad():
            logits = probe(queries.float())
        accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro").to(logits.device)
        return float(accuracy(logits, query_labels))
