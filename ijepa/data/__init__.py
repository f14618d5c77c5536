"""Data: the DataModule, the data sources it reads (chosen by ``class_path``), and the datasets."""

import importlib

# Names load their module on first use, so that `ijepa.data.transforms` (pixel statistics, used by
# the exporters of ijepa.interop) does not import Lightning and torchvision with the DataModule.
_MODULES = {
    "IJEPADataModule": "datamodule",
    "labeled_collate": "collate",
    "dense_collate": "collate",
    "DenseBatch": "batch",
    "IGNORE_INDEX": "batch",
    **dict.fromkeys(
        (
            "DataSource",
            "ImageFolderSource",
            "MovingShapesSource",
            "ShapesSource",
            "Splits",
            "SplitSettings",
            "STL10Source",
            "VideoFolderSource",
            "source_from_config",
        ),
        "sources",
    ),
    "ShardsSource": "shards",
}


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))


__all__ = [
    "IGNORE_INDEX",
    "DataSource",
    "DenseBatch",
    "IJEPADataModule",
    "ImageFolderSource",
    "MovingShapesSource",
    "STL10Source",
    "ShapesSource",
    "ShardsSource",
    "SplitSettings",
    "Splits",
    "VideoFolderSource",
    "dense_collate",
    "labeled_collate",
    "source_from_config",
]
