"""``ijepa eval``: evaluate a checkpoint's frozen encoder with one or more protocols and write a
results file per protocol.

    ijepa eval --config configs/eval/linear.yaml --checkpoint lightning_logs/version_0/checkpoints/last.ckpt

Processes, devices and precision come from Lightning Fabric (``--devices 2 --strategy ddp``,
``--precision bf16-mixed``); under DDP every process encodes its share of each batch and every
process trains the same heads on the gathered batch, so the scores equal a one-process run's.

``--data.image_size`` / ``--data.patch_size`` / ``--data.num_frames`` other than the checkpoint's
evaluate its encoder adapted as ``ijepa validate --data.image_size ...`` adapts it; each results
file's ``adapted`` entry says from what to what and which tensors changed (null: not adapted).
Clip checkpoints are evaluated on clip sources, with the sources' frame times.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from lightning.fabric import Fabric
from lightning.fabric.loggers import TensorBoardLogger

from ijepa.checkpoint import unwritable
from ijepa.evaluation.cache import FeatureCache
from ijepa.evaluation.context import EvalContext
from ijepa.evaluation.data import EvalData
from ijepa.evaluation.encoders import PIXELS, RANDOM, FrozenEncoder, open_encoder
from ijepa.evaluation.protocols import Protocol
from ijepa.interop.encoder import save_json
from ijepa.option_errors import (
    OWN_ERRORS,
    IJEPAArgumentParser,
    OptionError,
    innermost_error,
    one_line,
    raised_by_project,
)
from ijepa.preflight import built_source, check_devices, check_nodes

RESULTS_VERSION = 1


def default_output_dir(checkpoint: str) -> Path:
    """``<run folder>/eval`` for a checkpoint in ``<run folder>/checkpoints/``, else ``eval/<name>``
    next to the current folder."""
    path = Path(checkpoint)
    if checkpoint not in (PIXELS, RANDOM) and path.parent.name == "checkpoints":
        return path.parent.parent / "eval" / path.stem
    return Path("eval") / (checkpoint if checkpoint in (PIXELS, RANDOM) else path.stem)


class Evaluation:
    """One ``ijepa eval`` run.

    Args:
        checkpoint: an ``ijepa fit`` checkpoint, a weights-only conversion, a Hugging Face
            ``IJepaModel`` folder (``ijepa convert ... hf``), ``pixels`` (raw pixels, a baseline), or
            ``random`` (an encoder of ``architecture`` freshly initialised from ``data.seed``: the
            from-scratch baseline).
        protocols: the protocols to run, in order (each by ``class_path``, see ``configs/eval/``).
        data: the labelled images (:class:`~ijepa.evaluation.data.EvalData`).
        encoder: ``target`` (the EMA encoder, as the I-JEPA paper evaluates; default) or ``online``.
        output_dir: where ``<protocol name>.json`` and the TensorBoard logs go; null:
            ``<run folder>/eval/<checkpoint name>`` for a checkpoint of ``ijepa fit``.
        cache_dir: where features are cached for the next evaluation of the same checkpoint;
            null: ``<output_dir>/features``.
        cache: false extracts every feature afresh and writes none.
        pixel_patch_size: patch side of the pixel baseline's tokens (attentive probe).
        pixel_tubelet_size: frames per token of the pixel baseline on clips (attentive probe).
        architecture: with ``checkpoint: random``, the encoder to build: an ``ijepa fit`` config
            (its ``model:`` section and ``data.image_size``) or a dict of encoder options.
        accelerator, devices, num_nodes, strategy, precision: Lightning Fabric's.
    """

    def __init__(
        self,
        checkpoint: str,
        protocols: list[Protocol],
        data: EvalData | None = None,
        encoder: str = "target",
        output_dir: str | None = None,
        cache_dir: str | None = None,
        cache: bool = True,
        pixel_patch_size: int = 8,
        pixel_tubelet_size: int = 2,
        architecture: dict | str | None = None,
        accelerator: str = "auto",
        devices: int | str = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        precision: str = "32-true",
    ):
        if not protocols:
            raise ValueError("protocols must hold at least one protocol (e.g. ijepa.evaluation.LinearProtocol).")
        names = [protocol.name for protocol in protocols]
        if len(set(names)) != len(names):
            raise ValueError(f"protocols must have distinct names (their results files), got {names}: set name.")
        self.checkpoint, self.protocols, self.data = checkpoint, protocols, data or EvalData()
        self.encoder_kind, self.cache, self.pixel_patch_size = encoder, cache, pixel_patch_size
        self.pixel_tubelet_size, self.architecture = pixel_tubelet_size, architecture
        if architecture is not None and checkpoint != RANDOM:
            raise ValueError(f"architecture is for checkpoint=random; checkpoint={checkpoint!r} has its own.")
        self.output_dir = Path(output_dir) if output_dir else default_output_dir(checkpoint)
        self.cache_dir = Path(cache_dir) if cache_dir else self.output_dir / "features"
        # before any work: a read-only place would otherwise fail after the extraction
        places = [("output_dir", self.output_dir)] + ([("cache_dir", self.cache_dir)] if cache else [])
        for option, folder in places:
            if problem := unwritable(folder):
                raise ValueError(
                    f"{option}: cannot write to {folder} ({problem}); point --{option} at a writable folder."
                )
        self.fabric = Fabric(
            accelerator=accelerator,
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            precision=precision,
            loggers=TensorBoardLogger(str(self.output_dir), name="tensorboard", version=""),
        )

    def run(self) -> list[dict]:
        """Run every protocol; returns their results (also written to ``<output_dir>/<name>.json``)."""
        fabric = self.fabric
        fabric.launch()
        encoder, described = self.open_checkpoint()
        size = encoder.image_size  # the evaluated size: the data's, else the checkpoint's
        encoder = encoder.to(fabric.device)
        identity = {
            "checkpoint": described["sha256"]
            or (
                json.dumps([RANDOM, described["architecture"], described["seed"]], sort_keys=True)
                if self.checkpoint == RANDOM
                else PIXELS
            ),
            "encoder": described["encoder"],
            "pixel_patch_size": self.pixel_patch_size if self.checkpoint == PIXELS else None,
            "data": self.data.describe(size),
        }
        if self.checkpoint == PIXELS and encoder.num_frames:
            identity["pixel_tubelet_size"] = self.pixel_tubelet_size
        if encoder.adapted is not None:  # the same file at another patch size or frame count is another encoder
            identity["adapted"] = {key: encoder.adapted[key] for key in ("evaluated", "interpolation")}
        cache = FeatureCache(self.cache_dir if self.cache else None, identity, fabric.is_global_zero)
        ctx = EvalContext(fabric, encoder, self.data, cache, size, self.data.seed)
        results = []
        for protocol in self.protocols:
            start = time.perf_counter()
            result = protocol.run(ctx)
            result = {
                "version": RESULTS_VERSION,
                **result,
                "checkpoint": described,
                "adapted": encoder.adapted,
                "data": {
                    **self.data.describe(size),
                    "val_fraction": self.data.val_fraction,
                    "seed": self.data.seed,
                    "train_images": len(ctx.train_idx),
                    "val_images": len(ctx.val_idx),
                    "test_images": ctx.test_size(),
                    "num_classes": ctx.num_classes,
                },
                "processes": fabric.world_size,
                "precision": str(fabric.strategy.precision.precision),
                "features": {
                    "extracted": [list(k) for k in cache.extracted],
                    "reused": [list(k) for k in cache.reused],
                },
                "seconds": round(time.perf_counter() - start, 3),
            }
            cache.extracted, cache.reused = [], []
            if result.get("test_top1") is not None:
                ctx.log({f"{protocol.name}/test_top1": result["test_top1"]})
            if fabric.is_global_zero:
                path = self.output_dir / f"{protocol.name}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                save_json(json.loads(json.dumps(result, default=str)), path)
                fabric.print(summary_line(result, path))
            results.append(result)
        fabric.logger.finalize("success")
        return results

    def open_checkpoint(self) -> tuple[FrozenEncoder, dict]:
        """The frozen encoder at the data's sizes (adapted if they are not the checkpoint's), its
        description, and the data set to its frames (clip encoders) or refused for the other kind."""
        data = self.data
        if self.checkpoint == PIXELS:
            if data.patch_size is not None:
                raise ValueError(
                    "data.patch_size adapts a checkpoint's encoder; the pixel baseline's patches are pixel_patch_size."
                )
            if data.clips and data.num_frames is None:
                raise ValueError(
                    "checkpoint=pixels on a clip source needs data.num_frames (the pixel baseline has no frame count "
                    "of its own)."
                )
        patch = self.pixel_patch_size if self.checkpoint == PIXELS else data.patch_size
        encoder, described = open_encoder(
            self.checkpoint,
            self.encoder_kind,
            image_size=data.image_size,
            patch_size=patch,
            num_frames=data.num_frames,
            tubelet_size=self.pixel_tubelet_size,
            architecture=self.architecture,
            seed=data.seed,
        )
        data.use_frames(encoder.num_frames)
        return encoder, described


def summary_line(result: dict, path: Path) -> str:
    """One line per protocol: what a user reads first."""
    if result.get("test_miou") is not None:
        ceiling = f" (ceiling {100 * result['ceiling_miou']:.2f})" if result.get("ceiling_miou") is not None else ""
        return (
            f"{result['name']}: test mIoU {100 * result['test_miou']:.2f}{ceiling}, pixel accuracy "
            f"{100 * result['test_pixel_accuracy']:.2f} with {result['selected']} (val mIoU "
            f"{100 * result['val_miou']:.2f}, {len(result['heads'])} heads, {result['seconds']:.0f} s) -> {path}"
        )
    if result.get("test_top1") is None:
        parts = ", ".join(
            f"{r['name']} {100 * r['mean']:.1f} ± {100 * r['std']:.1f}" for r in result["settings_results"]
        )
        return f"{result['name']}: test top-1 {parts} ({result['seconds']:.0f} s) -> {path}"
    return (
        f"{result['name']}: test top-1 {100 * result['test_top1']:.2f} with {result['selected']} "
        f"(val {100 * result['val_top1']:.2f}, {len(result['heads'])} heads, {result['seconds']:.0f} s) -> {path}"
    )


def read_results(path: str | Path) -> dict:
    """A results file written by ``ijepa eval``."""
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or "protocol" not in result or "version" not in result:
        raise ValueError(f"{path} is not an ijepa eval results file (no protocol / version).")
    return result


def build_parser() -> IJEPAArgumentParser:
    parser = IJEPAArgumentParser(prog="ijepa eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="config")
    parser.add_class_arguments(Evaluation, fail_untyped=True, sub_configs=True)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """The ``ijepa eval`` command."""
    parser = build_parser()
    config = parser.parse_args(sys.argv[2:] if argv is None else argv)
    config.pop("config", None)
    try:
        # before Fabric starts a process per device: devices this machine has, nodes something launches
        check_devices(config.get("accelerator"), config.get("devices"), config.get("num_nodes"), prefix="")
        check_nodes(config.get("num_nodes"), config.get("devices"), prefix="")
        # the data folder, before any process (no source given: EvalData's own default, nothing to check)
        given = config.get("data.init_args.source")  # EvalData is a class of its own: its options under init_args
        if given is not None and (source := built_source(given)) is not None:
            source.check("data.source")
    except (OptionError, OSError) as error:  # OSError: a data folder that is not there
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    try:
        init = getattr(parser, "instantiate", parser.instantiate_classes)(config)
        evaluation = Evaluation(**init.as_dict() if hasattr(init, "as_dict") else init)
        return evaluation.run()
    except OWN_ERRORS as error:  # ValueError: also a library's, reached through the project's options
        if os.environ.get("IJEPA_DEBUG") or not (isinstance(error, ValueError) or raised_by_project(error)):
            raise
        # a constructor's own error (EvalData's data.image_size ...), not jsonargparse's wrapping of it
        sys.stderr.write(f"error: {one_line(innermost_error(error))}\n")
        sys.exit(2)
