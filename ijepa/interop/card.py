"""The model card (``README.md``) that ``ijepa convert`` writes beside the weights of every
``hf`` and ``timm`` export: what the encoder is, what it was trained on and for how long (as far
as the source records it), every ``ijepa eval`` result of that checkpoint and encoder, and the
lines that load the folder (each kind tested: ``tests/test_export_card.py``).

Imports no Lightning: the checkpoint is the dict ``ijepa convert`` read, the results are the
JSON files ``ijepa eval`` wrote (:class:`ijepa.evaluation.runner.Evaluation`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from ijepa.interop.encoder import encoder_options, export_dtype, file_digest, read_json, save_text
from ijepa.interop.timm_vit import TIMM_ARCHITECTURE, timm_model_args
from ijepa.nn.vit import VisionTransformer

CARD_NAME = "README.md"
NO_RESULTS = "No `ijepa eval` results were found for this checkpoint"
FORMATS = {"hf": "Hugging Face `IJepaModel` (transformers)", "timm": "timm `VisionTransformer`"}
LIBRARIES = {"hf": "transformers", "timm": "timm"}
SOURCES = {
    "ckpt": "an `ijepa fit` checkpoint",
    "official": "an official I-JEPA checkpoint (facebookresearch/ijepa)",
    "hf": "a Hugging Face `IJepaModel` folder",
}
WEIGHTS_ONLY_KEY = "ijepa_weights_only"  # ijepa.interop.ijepa_model's marker (that module imports Lightning)


def eval_folder(source: Path) -> Path:
    """Where ``ijepa eval --checkpoint source`` writes its results by default
    (:func:`ijepa.evaluation.runner.default_output_dir`): ``<run folder>/eval/<checkpoint stem>``
    for a checkpoint in ``<run folder>/checkpoints/``, else ``eval/<stem>`` under the current folder."""
    if source.parent.name == "checkpoints":
        return source.parent.parent / "eval" / source.stem
    return Path("eval") / source.stem


def find_results(source: Path, encoder: str) -> tuple[Path, list[tuple[Path, dict]], int]:
    """``(folder, [(results file, result)], skipped)``: the ``ijepa eval`` results in ``source``'s
    default results folder (:func:`eval_folder`) that are of this very file (the SHA-256 the
    results record) and of this ``encoder`` (``target``, ``online``), by file name; ``skipped``
    counts the results files there of another file of that name or of the other encoder. Files
    that are not results (no ``protocol`` and ``version``) are ignored."""
    folder = eval_folder(source)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    found, skipped, digest = [], 0, None
    for path in files:
        try:
            result = read_json(path)
        except (OSError, ValueError):
            continue
        checkpoint = result.get("checkpoint")
        if "protocol" not in result or "version" not in result or not isinstance(checkpoint, dict):
            continue
        digest = digest or file_digest(source)
        if checkpoint.get("sha256") == digest and checkpoint.get("encoder") == encoder:
            found.append((path, result))
        else:
            skipped += 1
    return folder, found, skipped


def percent(value: float) -> str:
    return f"{100 * value:.2f} %"


def headline(result: dict) -> str:
    """A results file's headline metric(s), as ``ijepa eval`` prints them in its summary line."""
    if result.get("test_miou") is not None:
        ceiling = f" (ceiling {percent(result['ceiling_miou'])})" if result.get("ceiling_miou") is not None else ""
        return (
            f"test mIoU {percent(result['test_miou'])}{ceiling}, "
            f"pixel accuracy {percent(result['test_pixel_accuracy'])} "
            f"({result.get('selected')}; val mIoU {percent(result['val_miou'])})"
        )
    if result.get("test_top1") is None and result.get("settings_results"):
        parts = [
            f"{r['name']} {100 * r['mean']:.2f} ± {100 * r.get('std', 0.0):.2f} %" for r in result["settings_results"]
        ]
        return "test top-1 " + ", ".join(parts)
    if result.get("test_top1") is None:
        return "no headline metric in the file"
    selected = f"{result['selected']}; " if result.get("selected") else ""
    val = f"val top-1 {percent(result['val_top1'])}" if result.get("val_top1") is not None else ""
    return f"test top-1 {percent(result['test_top1'])} ({selected}{val})".replace(" ()", "")


def source_text(config: object) -> str:
    """A data source's ``{class_path, init_args}`` as ``Class (option=value, ...)``."""
    if not isinstance(config, dict) or "class_path" not in config:
        return f"`{config}`"
    args = config.get("init_args") or {}
    options = ", ".join(f"{key}={value!r}" for key, value in args.items())
    return f"`{config['class_path'].rsplit('.', 1)[-1]}` ({options})" if options else f"`{config['class_path']}`"


def results_section(source: Path, encoder: str) -> list[str]:
    folder, found, skipped = find_results(source, encoder)
    lines = ["## Evaluation (`ijepa eval`)", ""]
    if not found:
        lines.append(f"{NO_RESULTS} (looked in `{folder}`, where `ijepa eval` writes them by default).")
    else:
        lines += [
            f"Every results file of this checkpoint's {encoder} encoder in `{folder}` (frozen encoder):",
            "",
            "| protocol | result | data | results file |",
            "|---|---|---|---|",
        ]
        for path, result in found:
            data = result.get("data") or {}
            source_name = source_text(data.get("source")).split(" (")[0]
            described = f"{source_name}, {data.get('image_size')} px"
            if data.get("test_images") is not None:
                described += f", {data['test_images']} test images"
            if result.get("adapted"):
                described += ", encoder adapted to the evaluated size"
            lines.append(f"| {result['name']} ({result['protocol']}) | {headline(result)} | {described} | `{path}` |")
    if skipped:
        lines += ["", f"Not listed: {skipped} results file(s) in `{folder}` of another file of this name or encoder."]
    return lines + [""]


def training_section(kind: str, source: Path, checkpoint: dict | None) -> list[str]:
    """What the source records of the training run; what it does not is said to be unknown."""
    lines = ["## Training", "", f"Source: {SOURCES[kind]}, `{source}`.", ""]
    unknown = "not recorded in the source: unknown"
    if kind == "hf":
        card = " (its own `README.md` may say more)" if (source / CARD_NAME).is_file() else ""
        return lines + [f"Training data and steps: {unknown}{card}.", ""]
    checkpoint = checkpoint or {}
    if kind == "official":
        epoch = checkpoint.get("epoch")
        epochs = f"epoch {epoch} (the official run's count)" if epoch is not None else f"epochs: {unknown}"
        return lines + [f"{epochs}; training data, batch size and steps: {unknown}.", ""]
    if checkpoint.get(WEIGHTS_ONLY_KEY):
        return lines + [
            f"A weights-only checkpoint (`ijepa convert ... ckpt`): training data and steps are {unknown}.",
            "",
        ]
    data = checkpoint.get("datamodule_hyper_parameters")
    rows = [
        ("optimizer steps (`global_step`)", checkpoint.get("global_step")),
        ("epoch (Lightning's, counted from 0)", checkpoint.get("epoch")),
    ]
    if isinstance(data, dict):
        recorded = data.get("source") is not None  # the CLI records it; a data module built in Python does not
        rows += [
            ("data source", source_text(data["source"]) if recorded else None),
            ("image size (data)", data.get("image_size")),
            ("batch size (per process)", data.get("batch_size")),
        ]
        if data.get("probe_source"):
            rows.append(("probe source", source_text(data["probe_source"])))
    distilled = checkpoint.get("distillation")  # ijepa distill's record (ijepa.distill): the teacher that taught
    if isinstance(distilled, dict):
        digest = distilled.get("teacher_sha256")
        weights = f"weights `{digest}` (`ijepa.distill.weights_sha256`)" if digest else f"weights' digest {unknown}"
        rows.append(
            (
                "distilled from",
                f"`{distilled.get('teacher')}` ({distilled.get('teacher_kind')}, its {distilled.get('teacher_encoder')} "
                f"encoder: width {distilled.get('teacher_width')}, depth {distilled.get('teacher_depth')}; {weights}), "
                f"objective `{distilled.get('objective')}`",
            )
        )
    resolution = checkpoint.get("resolution")
    if isinstance(resolution, dict):
        rows.append(("resolution when saved", ", ".join(f"{k} {v}" for k, v in resolution.items())))
    lines += ["| | |", "|---|---|"]
    lines += [f"| {name} | {unknown if value is None else value} |" for name, value in rows]
    if not isinstance(data, dict):
        lines.append(f"| data source, image size, batch size | {unknown} (no `datamodule_hyper_parameters`) |")
    return lines + [""]


def weights_summary(path: Path) -> tuple[int, list[str]]:
    """The number of values and the dtypes of a safetensors file, read from its header."""
    count, dtypes = 0, set()
    with safe_open(str(path), "pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is no dict)
            tensor = f.get_slice(key)
            count += int(torch.Size(tensor.get_shape()).numel())
            dtypes.add(tensor.get_dtype())
    return count, sorted(dtypes)


def loading_section(to: str, folder: str, encoder: VisionTransformer, dtype: str) -> list[str]:
    """The code blocks that load the export; each ends with ``features [B, N, D]`` of ``images``
    (``[B, 3, H, W]``, ImageNet-normalised), the encoder's output."""
    where = json.dumps(folder)
    weights = json.dumps(str(Path(folder) / "model.safetensors"))
    stored = str(export_dtype(dtype)).removeprefix("torch.")
    lines = [
        "## Loading",
        "",
        f"`{folder}` is the folder as `ijepa convert` was given it: run these from where it ran, or replace it. "
        "`images` are `[B, 3, H, W]` float tensors, ImageNet-normalised (the folder's preprocessing config); "
        "`features` are the patch features `[B, N, D]`, their mean over patches the pooled feature.",
        "",
    ]
    if to == "hf":
        lines += [
            "Plain PyTorch, with this project (`ijepa`) installed: the encoder as `ijepa.nn.vit.VisionTransformer`, "
            "float32 whatever the stored dtype:",
            "",
            "```python",
            "from ijepa.interop import load_hf",
            "",
            f"encoder = load_hf({where})  # float32, eval mode, CPU",
            "features = encoder(images)",
            "```",
            "",
            f"transformers (5 loads the model in the stored dtype, {stored}, unless given `dtype=torch.float32`; "
            '4 in float32 unless given `torch_dtype="auto"`):',
            "",
            "```python",
            "from transformers import IJepaModel",
            "",
            f"model = IJepaModel.from_pretrained({where}).eval()",
            "features = model(pixel_values=images.to(model.dtype)).last_hidden_state",
            "```",
        ]
        return lines + [""]
    args = ", ".join(f"{key}={value!r}" for key, value in timm_model_args(encoder).items())
    lines += [
        "timm, from the folder (its `config.json`):",
        "",
        "```python",
        "import timm",
        "",
        f"model = timm.create_model({json.dumps('local-dir:' + folder)}, pretrained=True).eval()  # float32",
        "features = model.forward_features(images)  # model(images): their mean",
        "```",
        "",
        "timm, by architecture and model arguments:",
        "",
        "```python",
        "import timm",
        "",
        "model = timm.create_model(",
        f'    "{TIMM_ARCHITECTURE}",',
        "    pretrained=True,",
        f"    pretrained_cfg_overlay=dict(file={weights}),",
        f"    {args},",
        ").eval()",
        "features = model.forward_features(images)",
        "```",
        "",
        "Plain PyTorch (safetensors) into timm's module:",
        "",
        "```python",
        "import timm",
        "from safetensors.torch import load_file",
        "",
        f'model = timm.create_model("{TIMM_ARCHITECTURE}", {args}).eval()',
        f"model.load_state_dict(load_file({weights}))  # {stored} values, copied into float32",
        "features = model.forward_features(images)",
        "```",
    ]
    return lines + [""]


def model_card(
    to: str,
    folder: str | Path,
    encoder: VisionTransformer,
    dtype: str,
    source: str | Path,
    source_kind: str,
    checkpoint: dict | None = None,
    which: str = "target",
) -> str:
    """The card of the ``to`` (``hf``, ``timm``) export in ``folder`` (written already) of
    ``encoder``, stored in ``dtype``, from ``source`` of kind ``source_kind`` (``ckpt``,
    ``official``, ``hf``; ``checkpoint``: the dict read from a file source) and its ``which``
    encoder."""
    if to not in FORMATS:
        raise ValueError(f"a model card is written for {sorted(FORMATS)} exports, got {to!r}.")
    folder, source = str(folder), Path(source)
    weights = Path(folder) / "model.safetensors"
    count, dtypes = weights_summary(weights)
    options = encoder_options(encoder)
    grid = options["image_size"] // options["patch_size"]
    position = encoder.position.name
    stored = str(export_dtype(dtype)).removeprefix("torch.")
    which_text = "the encoder of the folder" if source_kind == "hf" else f"the {which} encoder"
    if source_kind != "hf" and which == "target":
        which_text += " (EMA, the one the I-JEPA paper evaluates)"
    lines = [
        "---",
        f"library_name: {LIBRARIES[to]}",
        "pipeline_tag: image-feature-extraction",
        "tags: [ijepa, i-jepa, self-supervised, vision-transformer]",
        "---",
        "",
        f"# I-JEPA ViT encoder: `{Path(folder).name}`",
        "",
        f"{FORMATS[to]} written by `ijepa convert` from `{source}`: {which_text}, on its own (no predictor).",
        "",
        "## Architecture",
        "",
        "| | |",
        "|---|---|",
        f"| width | {options['embed_dim']} |",
        f"| depth | {options['depth']} |",
        f"| heads | {options['num_heads']} |",
        f"| MLP width | {options['mlp_hidden']} |",
        f"| patch | {options['patch_size']} |",
        f"| image size | {options['image_size']} ({grid} x {grid} patches) |",
        f"| position encoding | `{position}`, stored as one `[1, {grid * grid}, {options['embed_dim']}]` table |",
        f"| parameters | {count:,} (the values in `model.safetensors`) |",
        f"| dtype | {stored} (`model.safetensors`: {weights.stat().st_size:,} bytes; {', '.join(dtypes)}) |",
        f"| output | `[B, {grid * grid}, {options['embed_dim']}]` patch features after the final LayerNorm, "
        "no class token |",
        "",
    ]
    lines += training_section(source_kind, source, checkpoint)
    lines += results_section(source, "target" if source_kind == "hf" else which)
    lines += loading_section(to, folder, encoder, dtype)
    return "\n".join(lines)


def write_card(folder: str | Path, text: str) -> Path:
    """``text`` as the folder's ``README.md`` (atomically)."""
    path = Path(folder) / CARD_NAME
    save_text(text, path)
    return path


def code_blocks(card: str) -> list[str]:
    """The Python code blocks of a card, in order."""
    blocks, current = [], None
    for line in card.splitlines():
        if current is None and line.strip() == "```python":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks
