"""Data: the DataModule (stl10, imagefolder, shapes) and the generated shapes dataset."""

from ijepa.data.datamodule import DATASETS, IJEPADataModule, labeled_collate

__all__ = ["DATASETS", "IJEPADataModule", "labeled_collate"]
