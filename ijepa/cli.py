"""The ``ijepa`` command: a LightningCLI over :class:`IJEPA` and :class:`IJEPADataModule`.

``ijepa fit|validate|test|predict --config configs/<experiment>.yaml [--key value ...]``
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
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
        # Clips: the frame count belongs to the data, the tubelet depth to the model.
        parser.link_arguments("data.num_frames", "model.num_frames")
        parser.link_arguments("model.tubelet_size", "data.tubelet_size")

    def _parse_ckpt_path(self) -> None:
        # LightningCLI fills the model's arguments from the checkpoint's hyperparameters. Keep
        # that for the architecture, but let the run choose the resolution (image and patch
        # size): the model adapts the checkpoint to it on load (IJEPA.on_load_checkpoint).
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):  # Lightning resolves these itself
            return
        if not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path!r} is not a file.")
        try:
            checkpoint = torch.load(ckpt_path, weights_only=True, map_location="cpu")
        except Exception as error:  # truncated download, interrupted copy, not a checkpoint at all
            raise ValueError(
                f"cannot read ckpt_path={ckpt_path!r} ({type(error).__name__}: {error}); the file is truncated or "
                f"not a Lightning checkpoint. Checkpoints are written atomically, so an earlier one in the same folder "
                f"is intact."
            ) from error
        hparams = checkpoint.get("hyper_parameters", {})
        hparams = {k: v for k, v in hparams.items() if k not in ("image_size", "patch_size", "_instantiator")}
        if not hparams:
            return
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise


def build_cli(args: list[str] | None = None, run: bool = True) -> IJEPACLI:
    """The ``ijepa`` CLI: IJEPA + IJEPADataModule, checkpoints written atomically."""
    return IJEPACLI(
        IJEPA,
        IJEPADataModule,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"plugins": [{"class_path": "ijepa.checkpoint_io.AtomicCheckpointIO"}]},
        args=args,
        run=run,
    )


def instantiate(config: str, overrides: list[str] | None = None):
    """``(model, datamodule)`` exactly as ``ijepa fit --config config [overrides]`` builds them,
    without running anything (benchmarks, notebooks). Overrides are CLI arguments such as
    ``--data.batch_size=64``."""
    from unittest import mock

    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["--config", str(config), *(overrides or []), "--trainer.logger=false"], run=False)
    return cli.model, cli.datamodule


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ijepa`` console script and ``python -m ijepa``."""
    build_cli(args)


if __name__ == "__main__":
    main()
