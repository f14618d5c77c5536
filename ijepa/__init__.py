"""I-JEPA self-supervised pretraining of Vision Transformers with PyTorch Lightning.

Rooms: ``ijepa.nn`` (plain PyTorch model), ``ijepa.masks`` (multi-block masks),
``ijepa.data`` (datasets and DataModule), ``ijepa.module`` (the LightningModule),
``ijepa.schedules`` and ``ijepa.callbacks`` (EMA, k-NN probe), ``ijepa.cli`` (the command).
"""

__version__ = "0.1.0"
