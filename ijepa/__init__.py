"""I-JEPA self-supervised pretraining of Vision Transformers with PyTorch Lightning.

Rooms, bottom to top (imports flow one way; ``tests/test_import_layers.py`` holds the floors):
``ijepa.nn`` (plain PyTorch: the ViT, predictor, position family, packing), ``ijepa.registry``
and ``ijepa.legacy`` (how members of a kind are found; older formats mapped to today's);
``ijepa.step`` (one step's target and context branches), ``ijepa.regularizers``,
``ijepa.objectives``, ``ijepa.optim``, ``ijepa.masks``; ``ijepa.data`` and ``ijepa.checkpoint``;
``ijepa.classifiers`` (k-NN, logistic and attentive heads on frozen features);
``ijepa.module`` (the LightningModule); ``ijepa.interop`` (other formats); ``ijepa.distill``;
``ijepa.callbacks`` (EMA, in-fit probes, monitors, resolution change); ``ijepa.cli``,
``ijepa.launch`` and ``ijepa.evaluation`` (``ijepa fit``/``eval``/``submit``); ``ijepa.studies``
and ``ijepa.benchmark`` (the scripts behind the docs' tables).
"""

__version__ = "0.1.0"
