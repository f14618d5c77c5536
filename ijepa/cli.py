"""The ``ijepa`` command: a LightningCLI over :class:`IJEPA` and :class:`IJEPADataModule`.

``ijepa fit|validate|test|predict --config configs/<experiment>.yaml [--key value ...]``
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from ijepa.data.datamodule import IJEPADataModule
from ijepa.module import IJEPA


class IJEPACLI(LightningCLI):
    """LightningCLI whose model and data share one definition of the patch grid."""

    def add_arguments_to_parser(self, parser) -> None:
        # The image size belongs to the data, the patch size to the model; each is set once and
        # copied to the other, so masks and model always agree on the grid.
        parser.link_arguments("data.image_size", "model.image_size")
        parser.link_arguments("model.patch_size", "data.patch_size")


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ijepa`` console script and ``python -m ijepa``."""
    IJEPACLI(IJEPA, IJEPADataModule, save_config_kwargs={"overwrite": True}, args=args)


if __name__ == "__main__":
    main()
