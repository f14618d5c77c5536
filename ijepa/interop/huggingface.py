"""Hugging Face ``IJepaModel`` (``transformers``) in and out, without importing transformers.

``IJepaModel`` is a plain ViT with no class token: a learned ``position_embeddings [1, N, D]``
parameter added to the patch tokens, pre-norm blocks with separate q/k/v projections, exact
GELU, and a final LayerNorm whose output ``last_hidden_state [B, N, D]`` is our encoder's output
token for token. Two key layouts exist: the one Hub checkpoints are stored in (transformers 4:
``encoder.layer.N.attention.attention.query``, ``intermediate.dense``...) and transformers 5's
(``layers.N.attention.q_proj``, ``mlp.fc1``...), which renames the former on load. Import reads
both (and the ``ijepa.`` prefix of ``IJepaForImageClassification``); export writes the Hub
layout, which both versions load.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from ijepa.interop.encoder import (
    encoder_options,
    export_dtype,
    image_encoder,
    load_exactly,
    load_weights,
    position_table,
    read_json,
    save_json,
    save_safetensors,
)
from ijepa.interop.official import check_sincos_table
from ijepa.nn.position.tables import sinusoidal_2d_grid
from ijepa.nn.vit import VisionTransformer

# our encoder key -> Hub (transformers 4) key; block keys by pattern, q/k/v by splitting qkv
HF_NAMES = {
    "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "transformer.norm.weight": "layernorm.weight",
    "transformer.norm.bias": "layernorm.bias",
}
HF_BLOCK_NAMES = {
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
    "attn.proj": "attention.output.dense",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}
# transformers 5 names -> the Hub layout, the first pattern that matches (q/k/v by V5_QKV)
V5_RENAMES = (
    (re.compile(r"^layers\.(\d+)\.attention\.o_proj\."), r"encoder.layer.\1.attention.output.dense."),
    (re.compile(r"^layers\.(\d+)\.mlp\.fc1\."), r"encoder.layer.\1.intermediate.dense."),
    (re.compile(r"^layers\.(\d+)\.mlp\.fc2\."), r"encoder.layer.\1.output.dense."),
    (re.compile(r"^layers\.(\d+)\."), r"encoder.layer.\1."),
)
V5_QKV = re.compile(r"^layers\.(\d+)\.attention\.([qkv])_proj\.(weight|bias)$")
QKV_V5 = {"q": "query", "k": "key", "v": "value"}
POSITION_KEY = "embeddings.position_embeddings"
HF_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "image_size",
    "patch_size",
)
QKV = ("query", "key", "value")


def to_hub_layout(state: dict[str, torch.Tensor], drop: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """An ``IJepaModel`` state dict in either layout -> the Hub layout. Strips the ``ijepa.``
    prefix and drops keys starting with any of ``drop`` (e.g. ``("classifier.", "pooler.")``:
    heads our encoder has no place for; only when asked, never in silence)."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("ijepa.")
        if drop and key.startswith(drop):
            continue
        qkv = V5_QKV.match(key)
        if qkv:
            key = f"encoder.layer.{qkv.group(1)}.attention.attention.{QKV_V5[qkv.group(2)]}.{qkv.group(3)}"
        else:
            for pattern, replacement in V5_RENAMES:
                if pattern.match(key):
                    key = pattern.sub(replacement, key, count=1)
                    break
        out[key] = value
    return out


def hf_config(encoder: VisionTransformer) -> dict:
    """The ``config.json`` of an ``IJepaModel`` equal to ``encoder`` (:func:`save_hf` adds the
    stored weights' ``torch_dtype``)."""
    options = encoder_options(encoder)
    return {
        "architectures": ["IJepaModel"],
        "model_type": "ijepa",
        "hidden_size": options["embed_dim"],
        "num_hidden_layers": options["depth"],
        "num_attention_heads": options["num_heads"],
        "intermediate_size": options["mlp_hidden"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "layer_norm_eps": options["norm_eps"],
        "image_size": options["image_size"],
        "patch_size": options["patch_size"],
        "num_channels": options["in_channels"],
        "qkv_bias": options["qkv_bias"],
    }


def encoder_to_hf(encoder: torch.nn.Module, which: str = "target") -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config, state dict)`` of an ``IJepaModel`` (Hub layout) computing what ``encoder``
    computes. An :class:`~ijepa.module.IJEPA` gives its ``which`` encoder (``target`` or ``online``). Position
    encodings a plain table cannot express (RoPE, PEG, relative bias) are refused."""
    encoder = image_encoder(encoder, which)
    table = position_table(encoder, "A Hugging Face IJepaModel")
    out, unmapped = {POSITION_KEY: table[None]}, []
    block = re.compile(r"^transformer\.blocks\.(\d+)\.(.+)\.(weight|bias)$")
    for key, value in encoder.state_dict().items():
        match = block.match(key)
        if key in HF_NAMES:
            out[HF_NAMES[key]] = value
        elif match and match.group(2) == "attn.qkv":
            for name, part in zip(QKV, value.chunk(3, dim=0)):
                out[f"encoder.layer.{match.group(1)}.attention.attention.{name}.{match.group(3)}"] = part
        elif match and match.group(2) in HF_BLOCK_NAMES:
            out[f"encoder.layer.{match.group(1)}.{HF_BLOCK_NAMES[match.group(2)]}.{match.group(3)}"] = value
        elif not key.startswith("transformer.position."):  # the table is written above
            unmapped.append(key)
    if unmapped:
        raise ValueError(f"these parameters have no place in an IJepaModel: {sorted(unmapped)}")
    return hf_config(encoder), out


def save_hf(encoder: torch.nn.Module, folder: str | Path, which: str = "target", dtype: str = "fp32") -> Path:
    """Write ``encoder`` as an ``IJepaModel`` folder: ``config.json``, ``model.safetensors`` and
    a ``preprocessor_config.json`` (:func:`hf_preprocessor`), so that
    ``transformers.IJepaModel.from_pretrained(folder)`` loads it with no missing or extra key.
    ``dtype``: the weights' dtype in the file, ``fp32`` or ``bf16`` (half the size, each weight
    rounded to bfloat16's 8-bit mantissa); ``config.json``'s ``torch_dtype`` records it, as
    transformers writes it (transformers 5 then loads the model in it unless given ``dtype=``;
    4 loads float32 unless given ``torch_dtype="auto"``)."""
    torch_dtype = export_dtype(dtype)
    config, state = encoder_to_hf(encoder, which)
    config["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, folder / "model.safetensors", torch_dtype)
    save_json(config, folder / "config.json")
    save_json(hf_preprocessor(config["image_size"]), folder / "preprocessor_config.json")
    return folder


def hf_preprocessor(image_size: int) -> dict:
    """The ``preprocessor_config.json`` of this project's evaluation transform
    (``IJEPADataModule.eval_transform``): the shorter side resized to ``image_size`` (bilinear,
    antialiased), the centre ``image_size`` square cropped, then ImageNet normalisation. A
    ``CLIPImageProcessor`` does exactly these steps; ``ViTImageProcessor``, the default for
    ``ijepa`` models, would squash the whole image to the square instead."""
    return {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": image_size},
        "resample": 2,  # PIL bilinear, as torchvision's Resize
        "do_center_crop": True,
        "crop_size": {"height": image_size, "width": image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(IMAGENET_MEAN),
        "image_std": list(IMAGENET_STD),
        "do_convert_rgb": True,
    }


def _square(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"config {name} must be square, got {value}.")
        value = value[0]
    return int(value)


def hf_to_encoder_state(state: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """A Hub-layout ``IJepaModel`` state dict (see :func:`to_hub_layout`) -> our encoder's
    state dict without the position table (``POSITION_KEY`` is left to the caller). Raises
    ValueError listing every key it cannot map and every block part that is missing."""
    inverse = {hub: ours for ours, hub in HF_NAMES.items()}
    inverse_block = {hub: ours for ours, hub in HF_BLOCK_NAMES.items()}
    block = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
    out, qkv, unmapped = {}, {}, []
    for key, value in state.items():
        match = block.match(key)
        if key == POSITION_KEY:
            continue
        if key in inverse:
            out[inverse[key]] = value
        elif match and match.group(2).startswith("attention.attention.") and match.group(2)[20:] in QKV:
            qkv[(int(match.group(1)), match.group(3), match.group(2)[20:])] = value
        elif match and match.group(2) in inverse_block:
            out[f"transformer.blocks.{match.group(1)}.{inverse_block[match.group(2)]}.{match.group(3)}"] = value
        else:
            unmapped.append(key)
    if unmapped:
        raise ValueError(
            f"cannot map these IJepaModel keys onto the encoder: {sorted(unmapped)} (heads such as pooler. or "
            "classifier. can be dropped explicitly with drop=...)."
        )
    for layer in range(depth):
        for kind in {kind for (i, kind, _) in qkv if i == layer} or {"weight"}:
            parts = [qkv.get((layer, kind, name)) for name in QKV]
            if any(part is None for part in parts):
                missing = [name for name, part in zip(QKV, parts) if part is None]
                raise ValueError(f"encoder.layer.{layer}: attention {kind} lacks {missing}.")
            out[f"transformer.blocks.{layer}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)
    return out


def is_sincos_table(table: torch.Tensor) -> bool:
    """Whether ``table [1, N, D]`` is our 2D sin-cos table: to float32 precision, or exactly that
    table rounded to the table's own dtype when it is stored in less (a ``bf16`` export)."""
    try:
        check_sincos_table(table, POSITION_KEY)
        return True
    except ValueError:
        if table.dtype in (torch.float32, torch.float64) or not table.is_floating_point():
            return False
        side = round(table.size(1) ** 0.5)
        return bool(torch.equal(sinusoidal_2d_grid(side, side, table.size(2)).to(table.dtype), table[0]))


def load_hf(
    source: str | Path | dict,
    config: dict | None = None,
    drop: tuple[str, ...] = (),
    pos_embed: str | None = None,
    dtype: torch.dtype | None = torch.float32,
) -> VisionTransformer:
    """An ``IJepaModel`` as our encoder (eval mode, CPU), equal to it output for output.

    ``source`` is a saved folder (``config.json`` plus ``model.safetensors`` or
    ``pytorch_model.bin``) or a state dict, which then needs its ``config`` (a dict, e.g.
    ``model.config.to_dict()``). The position table becomes ``sincos`` if it is our 2D sin-cos
    table (as in the converted official checkpoints) and ``learned`` otherwise; ``pos_embed``
    forces ``learned``. Any key it cannot map is an error that lists them.

    Weights stored in another dtype (``bfloat16``: ``ijepa convert ... --dtype bf16``) are
    widened: the encoder is float32 by default (``dtype``; None: the dtype of the stored
    weights), its parameters hold the stored values exactly and it computes in float32; a sin-cos
    table stored in bfloat16 is recognised (it is ours rounded) and rebuilt exactly."""
    if isinstance(source, dict):
        if config is None:
            raise ValueError("a state dict source needs its config (e.g. model.config.to_dict()).")
        state = source
    else:
        folder = Path(source)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder.")
        config = read_json(folder / "config.json") if config is None else config
        missing = [key for key in HF_REQUIRED if key not in config]
        if missing:
            raise ValueError(f"{folder / 'config.json'} lacks {missing}: not an IJepaModel config.")
        state = load_weights(folder)
    if config.get("model_type", "ijepa") != "ijepa":
        raise ValueError(f"config model_type must be 'ijepa', got {config.get('model_type')!r}.")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"config hidden_act must be 'gelu' (exact GELU, as our MLP), got {config['hidden_act']!r}.")
    if pos_embed not in (None, "learned"):
        raise ValueError(
            f"pos_embed must be None (sincos if the table is, else learned) or 'learned', got {pos_embed!r}."
        )
    state = to_hub_layout(state, drop)
    if POSITION_KEY not in state:
        raise ValueError(f"the state dict has no {POSITION_KEY}.")
    table = state[POSITION_KEY]
    depth, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    encoder_state = hf_to_encoder_state(state, depth)
    if pos_embed is None:
        pos_embed = "sincos" if is_sincos_table(table) else "learned"
    encoder = VisionTransformer.for_images(
        image_size=_square(config["image_size"], "image_size"),
        patch_size=_square(config["patch_size"], "patch_size"),
        in_channels=int(config.get("num_channels", 3)),
        embed_dim=hidden,
        depth=depth,
        num_heads=int(config["num_attention_heads"]),
        mlp_ratio=int(config["intermediate_size"]) / hidden,
        qkv_bias=bool(config.get("qkv_bias", True)),
        pos_embed=pos_embed,
        rescale_residuals=False,
        norm_eps=float(config.get("layer_norm_eps", 1e-12)),
    )
    if table.shape != (1, encoder.num_patches, hidden):
        raise ValueError(f"{POSITION_KEY} is {tuple(table.shape)}, expected {(1, encoder.num_patches, hidden)}.")
    if pos_embed == "learned":
        encoder_state["transformer.position.embedding.weight"] = table[0]
    load_exactly(encoder, encoder_state, "IJepaModel state dict")  # copied into float32, the values exact
    return encoder.to(table.dtype if dtype is None else dtype).eval()
