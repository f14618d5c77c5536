"""Data: the DataModule, the data sources it reads (chosen by ``class_path``), and the datasets."""

from ijepa.data.datamodule import IJEPADataModule, labeled_collate
from ijepa.data.sources import (
    DataSource,
    ImageFolderSource,
    MovingShapesSource,
    ShapesSource,
    Splits,
    SplitSettings,
    STL10Source,
    VideoFolderSource,
    source_from_config,
)

__all__ = [
    "DataSource",
    "IJEPADataModule",
    "ImageFolderSource",
    "MovingShapesSource",
    "STL10Source",
    "ShapesSource",
    "SplitSettings",
    "Splits",
    "VideoFolderSource",
    "labeled_collate",
    "source_from_config",
]
