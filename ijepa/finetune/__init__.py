"""Fine-tuning after pretraining: ``ijepa finetune`` (:mod:`ijepa.finetune.cli`).

* :mod:`~ijepa.finetune.recipe`: layer-wise lr decay, the no-decay set, stochastic depth, freezing;
* :mod:`~ijepa.finetune.heads`: the head kinds (``model.head``);
* :mod:`~ijepa.finetune.mixing`: MixUp / CutMix and label smoothing in the collate;
* :mod:`~ijepa.finetune.lora`: LoRA through ``peft``, merged for export;
* :mod:`~ijepa.finetune.data`: labelled data with a label fraction, validation carved from train;
* :mod:`~ijepa.finetune.module`: the LightningModule, :func:`load_finetuned`.
"""

from ijepa.finetune.data import FinetuneData
from ijepa.finetune.heads import AttentivePoolHead, HeadKind, MeanPoolHead
from ijepa.finetune.lora import LoraOptions
from ijepa.finetune.module import FineTuner, load_finetuned
from ijepa.finetune.recipe import FinetuneOptim

__all__ = [
    "AttentivePoolHead",
    "FineTuner",
    "FinetuneData",
    "FinetuneOptim",
    "HeadKind",
    "LoraOptions",
    "MeanPoolHead",
    "load_finetuned",
]
