"""``ijepa finetune``: LightningCLI over :class:`~ijepa.finetune.module.FineTuner` and
:class:`~ijepa.finetune.data.FinetuneData`.

``ijepa finetune export SOURCE DESTINATION hf|timm`` writes a fine-tuned classifier as a Hugging
Face or timm folder (:mod:`ijepa.finetune.export`).

``ijepa finetune --config configs/finetune/quickstart.yaml --model.checkpoint PATH`` fits (the
first word may be ``fit``, ``validate`` or ``test``, as for ``ijepa fit``), then tests the best
checkpoint by ``val/top1`` (or the last one when none is monitored) on the held-out split and
writes ``finetune.json`` (test top-1 / top-5, the selected step, the data, the wall time) into
the run's log folder.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from ijepa.checkpoint import unwritable
from ijepa.config_paths import resolve, resolve_data_paths
from ijepa.finetune import export
from ijepa.finetune.data import FinetuneData
from ijepa.finetune.module import FineTuner
from ijepa.interop.encoder import read_torch_file, save_json
from ijepa.option_errors import (
    OWN_ERRORS,
    IJEPAArgumentParser,
    OptionError,
    innermost_error,
    one_line,
    raised_by_project,
)
from ijepa.preflight import check_run

SUBCOMMANDS = ("fit", "validate", "test")


class FinetuneCLI(LightningCLI):
    """The CLI of ``ijepa finetune``: the data's image size is the model's."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.image_size", "model.image_size")

    def parse_arguments(self, parser, args) -> None:
        with warnings.catch_warnings():
            # args are the words after `ijepa finetune`, while sys.argv keeps the whole command line,
            # from which Lightning starts each further local rank: both on purpose
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        # Lightning reads the model's options from the checkpoint: a pretraining one's are IJEPA's
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and Path(ckpt_path).is_file():
            loaded = read_torch_file(Path(ckpt_path))
            hparams = (loaded.get("hyper_parameters") if isinstance(loaded, dict) else None) or {}
            if not {"num_classes", "network"} <= set(hparams):
                raise OptionError(
                    f"ckpt_path={ckpt_path!r} is a pretraining checkpoint (ijepa fit), not a fine-tuned one: fine-tune "
                    f"from it with --model.checkpoint {ckpt_path}, or validate it with ijepa validate --ckpt_path."
                )
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        root = self.config[subcommand].trainer.get("default_root_dir") if subcommand else None
        if subcommand == "fit" and (problem := unwritable(Path(root or os.getcwd()))):
            raise OptionError(f"trainer.default_root_dir: cannot write to {root or os.getcwd()} ({problem}).")
        if subcommand:
            # a config's relative paths are read from its folder: it works from any directory
            config = self.config[subcommand]
            if isinstance(config.get("model.architecture"), str):
                resolve(config, "model.architecture")
            resolve_data_paths(config)
            check_run(config)  # devices, nodes and data folders, before any class is built or process launched
        self._start = time.perf_counter()

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, OSError, ImportError, MisconfigurationException) as error:
            own = innermost_error(error)
            raise OptionError(str(own).strip().splitlines()[0]) from error

    def after_fit(self) -> None:
        trainer = self.trainer
        if trainer.interrupted:  # every rank tests (a collective); rank zero writes
            return
        fit_seconds = time.perf_counter() - self._start
        monitored = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor]
        best = monitored[0] if monitored else None
        ckpt = best.best_model_path if best is not None and best.best_model_path else None
        results = trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=False)[0]
        record = {
            "test_top1": results.get("test/top1"),
            "test_top5": results.get("test/top5"),
            "checkpoint": ckpt or "the model at the end of fit",
            "best_val_top1": float(best.best_model_score)
            if best is not None and best.best_model_score is not None
            else None,
            "steps": trainer.global_step,
            "fit_seconds": round(fit_seconds, 1),
            "encoder": {k: self.model.hparams[k] for k in ("checkpoint", "encoder", "trainable_blocks", "lora")},
            "data": self.datamodule.describe(),
        }
        folder = Path(trainer.log_dir or trainer.default_root_dir)  # a collective under DDP: every rank asks
        if trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
            save_json(json.loads(json.dumps(record, default=str)), folder / "finetune.json")
            top1 = record["test_top1"]
            print(f"finetune: test top-1 {100 * top1:.2f} % ({ckpt or 'last'}) -> {folder / 'finetune.json'}")


def build_cli(args: list[str] | None = None, run: bool = True) -> FinetuneCLI:
    return FinetuneCLI(
        FineTuner,
        FinetuneData,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"plugins": [{"class_path": "ijepa.checkpoint.AtomicCheckpointIO"}]},
        args=args,
        run=run,
        parser_class=IJEPAArgumentParser,
    )


def main(args: list[str]) -> None:
    """``ijepa finetune [fit|validate|test] ...`` (no subcommand: fit)."""
    args = list(args)
    if args[:1] == ["export"]:
        export.main(args[1:])
        return
    if not args or args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help"):
        args = ["fit", *args]
    try:
        build_cli(args)
    except OptionError as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    except OWN_ERRORS as error:
        if not raised_by_project(error) or os.environ.get("IJEPA_DEBUG"):
            raise
        sys.stderr.write(f"error: {one_line(error)}\n")
        sys.exit(2)
