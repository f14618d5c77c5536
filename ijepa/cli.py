"""The ``ijepa`` command: a LightningCLI over :class:`IJEPA` and :class:`IJEPADataModule`.

``ijepa fit|validate|test|predict --config configs/<experiment>.yaml [--key value ...]``,
``ijepa distill --config configs/distill/<student>.yaml`` (a fit of :class:`ijepa.distill.DistillIJEPA`), and
``ijepa convert SOURCE DESTINATION ckpt|official|hf|timm`` (:mod:`ijepa.interop.convert`), and
``ijepa eval --config configs/eval/<protocol>.yaml --checkpoint PATH`` (:mod:`ijepa.evaluation.runner`),
``ijepa finetune --config configs/finetune/<data>.yaml --model.checkpoint PATH`` (:mod:`ijepa.finetune.cli`),
and ``ijepa submit [options] -- fit ...`` (:mod:`ijepa.launch.submit`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import warnings
from pathlib import Path

import torch
import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from ijepa.callbacks.checkpoint_safety import CheckpointFolderCheck, PreemptionCheckpoint
from ijepa.callbacks.features import FeatureWriter
from ijepa.callbacks.final_checkpoint import FinalCheckpoint
from ijepa.callbacks.rank_watchdog import RankWatchdog
from ijepa.checkpoint import AtomicCheckpointIO, unwritable
from ijepa.config_paths import resolve_data_paths
from ijepa.data import shards
from ijepa.data.datamodule import IJEPADataModule
from ijepa.distill import DistillIJEPA
from ijepa.evaluation import runner as evaluation
from ijepa.finetune import cli as finetune
from ijepa.interop import convert
from ijepa.launch import submit as launcher
from ijepa.launch.requeue import StepBoundaryRequeue
from ijepa.legacy import upgrade_config, upgrade_hparams, upgrade_model_flags
from ijepa.module import IJEPA
from ijepa.option_errors import (
    CLASS_KEYS,
    OWN_ERRORS,
    HeldBack,
    IJEPAArgumentParser,
    OptionError,
    built_class,
    innermost_error,
    one_line,
    raised_by_project,
)
from ijepa.preflight import check_run
from ijepa.strategy import FSDP2Strategy  # noqa: F401  (importing it registers trainer.strategy: fsdp2)

# (source, target): the target is set from the source and cannot be set itself. The image size
# and frame count belong to the data, the patch size and tubelet depth to the model; each is set
# once and copied to the other side, so masks and model always agree on the grid.
LINKS = (
    ("data.image_size", "model.image_size"),
    ("model.patch_size", "data.patch_size"),
    ("data.num_frames", "model.num_frames"),
    ("model.tubelet_size", "data.tubelet_size"),
)


class IJEPACLI(LightningCLI):
    """LightningCLI whose model and data share one definition of the patch grid."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("parser_class", IJEPAArgumentParser)
        # Lightning logs "Seed set to N" before it builds the classes: held back until they are
        # built, so that an option a class refuses is the first line of the output.
        self._seed_message = HeldBack(logging.getLogger("lightning.fabric.utilities.seed"))
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._seed_message.release(emit=False)  # nothing left once released

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        root = self.config[subcommand].trainer.get("default_root_dir") if subcommand else None
        local = root is None or "://" not in str(root)  # remote logs: the filesystem library reports
        if subcommand == "fit" and local and (problem := unwritable(Path(root or os.getcwd()))):
            raise OptionError(
                f"trainer.default_root_dir: cannot write the run's logs and checkpoints to {root or os.getcwd()} "
                f"({problem}); point it at a writable folder."
            )
        if subcommand == "fit" and self.config.fit.trainer.get("max_steps") == 0:
            raise OptionError(
                "trainer.max_steps: 0 trains no step (fit would end at once, saving nothing); set it >= 1, or -1 to "
                "stop by trainer.max_epochs. To score a checkpoint, use ijepa validate or ijepa eval."
            )
        if subcommand:  # devices, nodes and data folders, before any class is built or process launched
            resolve_data_paths(self.config[subcommand])  # a config's data folders, from the config's folder
            check_run(self.config[subcommand])
        if subcommand in ("validate", "test", "predict") and not self.config[subcommand].get("ckpt_path"):
            rank_zero_warn(
                f"`ijepa {subcommand}` without --ckpt_path evaluates the model's random initialisation; pass "
                f"--ckpt_path with a checkpoint of `ijepa fit` to evaluate trained weights."
            )

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, OSError, MisconfigurationException) as error:  # Lightning's for trainer options
            raise OptionError(self._option_error_message(error)) from error
        except RuntimeError as error:
            if match := re.match(r"Found more than one stateful callback of type `(\w+)`", str(error)):
                raise OptionError(
                    f"trainer.callbacks: two {match[1]} callbacks with the same settings would share one entry of the "
                    f"checkpoint (Lightning's state_key), so one would resume the other's state. Keep one, or make "
                    "them differ (ModelCheckpoint: monitor, mode, every_n_train_steps, every_n_epochs or "
                    "train_time_interval)."
                ) from error
            raise
        subcommand = self.config.get("subcommand")
        if subcommand == "fit":  # the logger's own folder (lightning_logs/) can be read-only in a writable root
            for logger in self.trainer.loggers:
                folder = getattr(logger, "root_dir", None) or getattr(logger, "save_dir", None)
                if folder and "://" not in str(folder) and (problem := unwritable(Path(folder))):
                    raise OptionError(
                        f"trainer.logger: {type(logger).__name__} cannot write to {folder} ({problem}); make it "
                        "writable, or point trainer.default_root_dir (or the logger's save_dir) at a writable folder."
                    )
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        io = self.trainer.strategy.checkpoint_io
        if isinstance(io, AtomicCheckpointIO) and ckpt_path not in (None, "last", "best", "hpc", "registry"):
            io.named_path = ckpt_path  # the only file that may be unpickled, under --weights_only false
        self._seed_message.release()

    def _option_error_message(self, error: BaseException) -> str:
        """``<config key>: [<class>: ]<the class's own message>``, then jsonargparse's report if
        it wrapped the error (trainer.callbacks and data.source are checked in a union of types)."""
        own = innermost_error(error)
        cls = built_class(own)
        label = None
        if cls is not None:
            label = next((key for base, key in CLASS_KEYS if issubclass(cls, base)), None)
            if label is None:  # chosen by class_path: a callback, a data source
                key = self._key_naming(cls)
                label = f"{key}: {cls.__name__}" if key else cls.__name__
        if str(own).startswith(("model.", "data.", "trainer.")):  # it names its option itself
            label = None
        message = f"{label}: {own}" if label else str(own)
        return message if own is error else f"{message}\n{error}"

    def _key_naming(self, cls: type) -> str | None:
        """The config key whose ``class_path`` (or a list entry's, as in ``trainer.callbacks``) names ``cls``."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config

        def names(path) -> bool:
            return isinstance(path, str) and path.rsplit(".", 1)[-1] == cls.__name__

        for key, value in config.items():
            if key.endswith(".class_path") and names(value):
                return key.removesuffix(".class_path")
            if isinstance(value, list) and any(names(getattr(entry, "class_path", None)) for entry in value):
                return key
        return None

    def add_arguments_to_parser(self, parser) -> None:
        for source, target in LINKS:
            parser.link_arguments(source, target)
        # Always on, configurable under these keys: checkpoint folder checked before any work,
        # a checkpoint on SIGTERM (ijepa.callbacks.checkpoint_safety).
        parser.add_lightning_class_args(CheckpointFolderCheck, "checkpoint_folder")
        parser.add_lightning_class_args(PreemptionCheckpoint, "preemption")
        # A rank whose peer died stops with a message instead of hanging (ijepa.callbacks.rank_watchdog).
        parser.add_lightning_class_args(RankWatchdog, "rank_watchdog")
        # The state fit ends in, saved wherever max_steps falls (ijepa.callbacks.final_checkpoint).
        parser.add_lightning_class_args(FinalCheckpoint, "final_checkpoint")
        # Under SLURM, Lightning's requeue (hpc checkpoint, scontrol requeue) at a step boundary (ijepa.launch.requeue).
        parser.add_lightning_class_args(StepBoundaryRequeue, "slurm_requeue")
        # `ijepa predict` writes its features and labels to a file (ijepa.callbacks.features).
        parser.add_lightning_class_args(FeatureWriter, "feature_writer")

    def parse_arguments(self, parser, args) -> None:
        # Kept to tell, on resume, which model values the run sets itself (see _parse_ckpt_path).
        if args is None:
            self._raw_args = sys.argv[1:]
        else:  # a dict or Namespace of arguments names no flags
            self._raw_args = list(args) if isinstance(args, (list, tuple)) else []
        refuse_optimizer_options(self._raw_args)
        upgraded = upgrade_model_flags(self._raw_args)  # --model.lr -> --model.optim.lr (ijepa.legacy)
        if upgraded is not self._raw_args:
            self._raw_args = args = upgraded
        super().parse_arguments(parser, args)

    def _explicit_model_keys(self, subcommand: str) -> set[str]:
        """Model arguments this run sets: named by a ``--model.<key>`` flag, in the ``model:``
        section of a ``--config`` file, or different from the parser's default (any other source)."""
        config = self.config[subcommand]
        defaults = self._subcommand_parsers[subcommand].get_defaults().model
        keys = {key for key, value in config.model.items() if defaults.get(key) != value}
        for arg in self._raw_args:
            if arg.startswith("--model."):
                keys.add(arg[len("--model.") :].split("=")[0])
        for path in config.get("config") or []:
            with open(getattr(path, "absolute", path)) as f:
                loaded = yaml.safe_load(f)
            section = upgrade_config(loaded)[0].get("model") or {} if isinstance(loaded, dict) else {}
            keys |= set(_flat_optim(section))
        return keys

    def _parse_ckpt_path(self) -> None:
        # LightningCLI replaces every model argument by the checkpoint's hyperparameters. Here the
        # checkpoint supplies only what the run does not set itself: explicit flags and config
        # values win (learning rate, schedules, losses: anything that may change between runs),
        # and an explicit architecture value that disagrees with the checkpoint is an error.
        # The resolution (image and patch size) is always the run's: the model adapts the
        # checkpoint to it on load (ijepa.checkpoint.adapt_checkpoint, from IJEPA.on_load_checkpoint).
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or ckpt_path in ("last", "best", "hpc", "registry"):  # Lightning resolves these itself
            return
        if not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path!r} is not a file.")
        io = AtomicCheckpointIO()
        io.named_path = ckpt_path  # the same reading as the run's own load (ijepa.checkpoint)
        try:
            checkpoint = io.load_checkpoint(ckpt_path, "cpu", self.config[subcommand].get("weights_only"))
        except ValueError as error:
            raise ValueError(f"ckpt_path: {error}") from None
        if "state_dict" not in checkpoint and checkpoint and all(torch.is_tensor(v) for v in checkpoint.values()):
            raise ValueError(
                f"ckpt_path={ckpt_path!r} is a bare state dict ({len(checkpoint)} tensors), not a Lightning checkpoint: "
                "load its weights with IJEPA.load_state_dict in Python, or start a run from an encoder with the "
                "ijepa.callbacks.PositionEmbeddingInterpolation callback's init_checkpoint (docs/resolution.md)."
            )
        if "pytorch-lightning_version" not in checkpoint and not checkpoint.get(convert.WEIGHTS_ONLY_KEY):
            # a dict of some keys (often only state_dict): Lightning's loader fails on the missing version
            held = ", ".join(sorted(map(str, checkpoint))[:6]) or "nothing"
            raise ValueError(
                f"ckpt_path={ckpt_path!r} holds {held} but no 'pytorch-lightning_version': it is not a checkpoint of "
                "ijepa fit (no loop, optimizer or schedule state). Load its state_dict with IJEPA.load_state_dict in "
                "Python, or start a new run from its weights with the ijepa.callbacks.PositionEmbeddingInterpolation "
                "callback's init_checkpoint (docs/resolution.md)."
            )
        if subcommand == "fit" and checkpoint.get(convert.WEIGHTS_ONLY_KEY):
            # no optimizer, schedule or step: "resuming" it would silently restart warm-up
            raise ValueError(
                f"ckpt_path={ckpt_path!r} is a weights-only conversion (ijepa convert ... ckpt): it holds no "
                "optimizer, schedule or step to resume. Start a new run from its weights with the "
                "ijepa.callbacks.PositionEmbeddingInterpolation callback's init_checkpoint (docs/resolution.md)."
            )
        max_steps, step = self.config[subcommand].trainer.get("max_steps"), checkpoint.get("global_step")
        if subcommand == "fit" and isinstance(step, int) and max_steps is not None and 0 < max_steps <= step:
            rank_zero_warn(
                f"ckpt_path={ckpt_path!r} is at step {step} and trainer.max_steps={max_steps}: the run is already at "
                f"or past its end, so fit restores it and trains nothing. Raise trainer.max_steps above {step} to "
                "train on (the schedules then stretch to the new length)."
            )
        hparams = _flat_optim(upgrade_hparams(checkpoint.get("hyper_parameters", {})))  # optim.lr: one key each
        ignored = ("image_size", "patch_size", "_instantiator", *getattr(self.model_class, "SET_BY_TEACHER", ()))
        hparams = {k: v for k, v in hparams.items() if k not in ignored}
        if not hparams:
            return
        current = self.config[subcommand].model
        explicit = self._explicit_model_keys(subcommand)
        differs = [key for key in hparams if key in explicit and _differ(current.get(key), hparams[key])]
        conflicts = [key for key in self.model_class.ARCHITECTURE if key in differs]
        if conflicts:
            listed = ", ".join(f"model.{key}={current.get(key)} (checkpoint: {hparams[key]})" for key in conflicts)
            raise ValueError(
                f"ckpt_path={ckpt_path!r} holds another architecture than this run asks for: {listed}. Drop these "
                f"settings to use the checkpoint's, or start a new run without ckpt_path."
            )
        if differs:
            rank_zero_info(
                "Resuming from ckpt_path with this run's own "
                + ", ".join(f"model.{key}={current.get(key)} (checkpoint: {hparams[key]})" for key in differs)
            )
        stored = {key: value for key, value in hparams.items() if key not in explicit and "." not in key}
        optim = {key[6:]: value for key, value in hparams.items() if key.startswith("optim.") and key not in explicit}
        if optim:
            stored["optim"] = optim
        try:
            self.config = self.parser.parse_object({subcommand: {"model": stored}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise


OPTIMIZER_KEYS = ("optimizer", "lr_scheduler")


def refuse_optimizer_options(args: list[str]) -> None:
    """Lightning's ``--optimizer`` / ``--lr_scheduler`` (flags or top-level keys of a ``--config``
    file) would replace the module's AdamW, whose parameter groups carry the weight-decay schedule
    and the no-decay set, and whose learning rate follows the warm-up + cosine schedule. The CLI
    does not offer them; say so, and what to set instead, rather than fail mid-step."""
    named = {arg[2:].split("=")[0].split(".")[0] for arg in args if arg.startswith("--")} & set(OPTIMIZER_KEYS)
    for index, arg in enumerate(args):
        path = (
            arg.split("=", 1)[1]
            if arg.startswith("--config=")
            else (args[index + 1] if arg == "--config" and index + 1 < len(args) else None)
        )
        if path and Path(path).is_file():
            with open(path) as f:
                section = yaml.safe_load(f)
            if isinstance(section, dict):
                named |= set(section) & set(OPTIMIZER_KEYS)
    if named:
        raise ValueError(
            f"{' and '.join(sorted(named))} cannot be set: the model builds its own AdamW (parameter groups with and "
            "without weight decay, a scheduled weight decay, warm-up + cosine learning rate). Set model.optim instead: "
            "lr, start_lr, final_lr, warmup_steps, weight_decay, final_weight_decay, betas (--model.optim.lr 1e-3)."
        )


def _flat_optim(model: dict) -> dict:
    """A model section or hyperparameters with ``optim: {lr: ...}`` as ``optim.lr`` keys, one per option."""
    optim = model.get("optim")
    if not isinstance(optim, dict):
        return model
    return {**{k: v for k, v in model.items() if k != "optim"}, **{f"optim.{k}": v for k, v in optim.items()}}


def _differ(run_value, stored_value) -> bool:
    # Checkpoints store tuples as lists (weights_only loads); compare by value.
    if isinstance(run_value, tuple):
        run_value = list(run_value)
    if isinstance(stored_value, tuple):
        stored_value = list(stored_value)
    return run_value != stored_value


def build_cli(args: list[str] | None = None, run: bool = True, model_class: type[IJEPA] = IJEPA) -> IJEPACLI:
    """The ``ijepa`` CLI: IJEPA (or ``model_class``, e.g. :class:`ijepa.distill.DistillIJEPA`) +
    IJEPADataModule, checkpoints written atomically."""
    return IJEPACLI(
        model_class,
        IJEPADataModule,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # the module owns its optimizer (refuse_optimizer_options)
        trainer_defaults={"plugins": [{"class_path": "ijepa.checkpoint.AtomicCheckpointIO"}]},
        args=args,
        run=run,
    )


class _Parsed(Exception):
    """Carries the parser out of :class:`_ParserOnly` before anything is built."""


class _ParserOnly(IJEPACLI):
    def parse_arguments(self, parser, args) -> None:
        raise _Parsed(parser)


@functools.cache
def _fit_parser():
    # Built once per process: a sweep's points (and a test over every shipped config) each parse
    # with it; parsing keeps no state in the parser.
    try:
        _ParserOnly(IJEPA, IJEPADataModule, args=["fit"], auto_configure_optimizers=False)
    except _Parsed as parsed:
        parser = parsed.args[0]
    for each in [parser, *parser._subcommands_action._name_parser_map.values()]:
        each.exit_on_error = False
    return parser


def fit_arguments_error(args: list[str]) -> str | None:
    """Why ``ijepa fit args`` would stop at parsing (an unknown key, a value of the wrong type, a
    config file that does not exist), or None. Nothing is built: ``ijepa submit`` asks before a run
    waits in a queue to fail in its first second."""
    parser = _fit_parser()
    try:
        with warnings.catch_warnings():  # the run itself says it, once
            warnings.simplefilter("ignore", FutureWarning)
            parser.parse_args(["fit", *upgrade_model_flags(args)])
    except Exception as error:  # jsonargparse's ArgumentError, or a class's own refusal of a value
        return str(innermost_error(error)).strip().splitlines()[0]
    return None


def instantiate(config: str, overrides: list[str] | None = None):
    """``(model, datamodule)`` exactly as ``ijepa fit --config config [overrides]`` builds them,
    without running anything (benchmarks, notebooks). Overrides are CLI arguments such as
    ``--data.batch_size=64``."""
    from unittest import mock

    with mock.patch("sys.argv", ["ijepa"]):
        cli = build_cli(["--config", str(config), *(overrides or []), "--trainer.logger=false"], run=False)
    return cli.model, cli.datamodule


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ijepa`` console script and ``python -m ijepa``. A run stopped by
    SIGTERM exits with status 143 (128 + SIGTERM) after saving a checkpoint, so schedulers see a
    failure and requeue (Lightning would exit 0). ``convert`` and ``eval`` are commands of their own."""
    argv = sys.argv[1:] if args is None else list(args)
    model_class = IJEPA
    if argv[:1] == ["distill"]:  # `ijepa fit` of a student against a frozen teacher (ijepa.distill)
        stage = argv[1:2] if argv[1:2] in (["validate"], ["test"]) else []  # `ijepa distill validate`: with it
        argv, model_class = [*(stage or ["fit"]), *argv[1 + len(stage) :]], DistillIJEPA
        args = argv
    if argv[:1] == ["convert"]:
        convert.main(argv[1:])
        return
    if argv[:1] == ["prepare"]:
        shards.main(argv[1:])
        return
    if argv[:1] == ["eval"]:
        evaluation.main(argv[1:])
        return
    if argv[:1] == ["finetune"]:
        finetune.main(argv[1:])
        return
    if argv[:1] == ["submit"]:
        launcher.main(argv[1:], fit=main, check=fit_arguments_error)
        return
    try:
        build_cli(args, model_class=model_class)
    except SIGTERMException:
        sys.exit(128 + signal.SIGTERM)
    except OptionError as error:  # a value the user set: the message says which and why, no traceback
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    except OWN_ERRORS as error:  # the project's own message (a checkpoint to resume from, a path to fix)
        if not raised_by_project(error) or os.environ.get("IJEPA_DEBUG"):
            raise
        sys.stderr.write(f"error: {one_line(error)}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
