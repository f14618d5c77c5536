"""Classification heads of ``ijepa finetune``, one class per kind, chosen in YAML by
``class_path`` (``model.head``):

* :class:`MeanPoolHead`: the encoder's (LayerNorm-ed) tokens averaged, then a linear layer: the
  head Hugging Face's ``IJepaForImageClassification`` and timm's ``VisionTransformer(global_pool="avg",
  fc_norm=False)`` hold; ``fc_norm: true`` adds MAE's LayerNorm after the pooling (no format holds both norms);
* :class:`AttentivePoolHead`: the attentive pooler the probes use
  (:class:`ijepa.classifiers.heads.AttentiveHead`), which no export format holds.

A kind holds its options; :meth:`HeadKind.build` makes the head for an encoder width and a class
count: ``tokens [B, K, D] -> logits [B, C]``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ijepa.classifiers.heads import AttentiveHead
from ijepa.nn.checks import check_range
from ijepa.registry import class_path, concrete_subclasses, from_config


class HeadKind:
    """A kind of head with its options; :meth:`build` makes the module."""

    def __init__(self, **options):
        self.options = options

    def config(self) -> dict:
        return {"class_path": class_path(self), "init_args": copy.deepcopy(self.options)}

    def build(self, width: int, num_classes: int, seed: int = 0) -> nn.Module:
        raise NotImplementedError

    def export_problem(self) -> str | None:
        """Why a Hugging Face or timm folder cannot hold this head, or None."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.options.items())})"


class PooledClassifier(nn.Module):
    """``tokens [B, K, D] -> mean over K -> (LayerNorm) -> dropout -> linear -> [B, C]``."""

    def __init__(
        self, width: int, num_classes: int, fc_norm: bool = False, dropout: float = 0.0, init_std: float = 0.02
    ):
        super().__init__()
        self.fc_norm = nn.LayerNorm(width, eps=1e-6) if fc_norm else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, num_classes)
        nn.init.trunc_normal_(self.head.weight, std=init_std)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.fc_norm(tokens.mean(dim=1))))


class MeanPoolHead(HeadKind):
    """The encoder's tokens (normed by its final LayerNorm) averaged, then a linear layer.

    Args:
        fc_norm: a second LayerNorm after the pooling (MAE's ``fc_norm``); not exportable.
        dropout: dropout before the linear layer, in [0, 1).
        init_std: std of the linear layer's trunc-normal init: timm's 0.02 (MAE's 2e-5, a near-zero
            head, is made for 100 ImageNet epochs: in 300 steps it cost 3 points, docs/finetuning.md).
    """

    def __init__(self, fc_norm: bool = False, dropout: float = 0.0, init_std: float = 0.02):
        check_range(dropout, "model.head.dropout", 0, 1, high_open=True)
        check_range(init_std, "model.head.init_std", 0)
        super().__init__(fc_norm=fc_norm, dropout=dropout, init_std=init_std)

    def export_problem(self) -> str | None:
        if self.options["fc_norm"]:
            return "MeanPoolHead(fc_norm=true) normalises after the pooling, on top of the encoder's own final norm"
        return None

    def build(self, width: int, num_classes: int, seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return PooledClassifier(width, num_classes, **self.options)


class AttentivePoolHead(HeadKind):
    """V-JEPA's attentive pooler over every token (the attentive probe's head).

    Args:
        num_heads: attention heads of the cross-attention (a divisor of the encoder's width).
        depth: blocks of the pooler (1: the cross-attention alone).
        num_queries: learned queries.
    """

    def __init__(self, num_heads: int = 4, depth: int = 1, num_queries: int = 1):
        super().__init__(num_heads=num_heads, depth=depth, num_queries=num_queries)

    def export_problem(self) -> str | None:
        return "the attentive pooler (AttentivePoolHead) has learned queries and attention of its own"

    def build(self, width: int, num_classes: int, seed: int = 0) -> nn.Module:
        return AttentiveHead(width, num_classes, seed=seed, **self.options)


def head_kinds() -> tuple[type[HeadKind], ...]:
    """The concrete head kinds (the docs' registry)."""
    return tuple(kind for kind in concrete_subclasses(HeadKind) if kind is not HeadKind)


def head_from_config(config: dict | HeadKind | None) -> HeadKind:
    """The kind a :meth:`HeadKind.config` dict describes (a kind as it is; None: mean pooling)."""
    if config is None:
        return MeanPoolHead()
    return config if isinstance(config, HeadKind) else from_config(config, HeadKind)
