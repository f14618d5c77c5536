"""The official I-JEPA checkpoint format, in and out.

The official layout (``facebookresearch/ijepa``, ``src/models/vision_transformer.py``) is a dict
with ``encoder``, ``predictor`` and ``target_encoder`` state dicts (possibly behind DDP's
``module.`` prefix) plus optimizer and bookkeeping entries. Its ViT has no class token and a
fixed sin-cos ``pos_embed [1, N, D]`` whose layout equals our ``sincos`` table (``col_row``), so
the weights map one to one onto an :class:`~ijepa.module.IJEPA` with ``pos_embed`` and
``predictor_pos_embed`` ``sincos``; its predictor is our ``per_block`` predictor.

A ``pos_embed`` that is not our sin-cos table is an error, not replaced.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from ijepa.interop.encoder import load_exactly
from ijepa.module import IJEPA
from ijepa.nn.position import sinusoidal_2d_grid

# official name -> ours, within the encoder and the predictor (block keys are mapped by pattern)
ENCODER_NAMES = {
    "patch_embed.proj.weight": "patch_embed.proj.weight",
    "patch_embed.proj.bias": "patch_embed.proj.bias",
    "norm.weight": "transformer.norm.weight",
    "norm.bias": "transformer.norm.bias",
}
PREDICTOR_NAMES = {
    "mask_token": "mask_token",
    "predictor_embed.weight": "input_proj.weight",
    "predictor_embed.bias": "input_proj.bias",
    "predictor_norm.weight": "transformer.norm.weight",
    "predictor_norm.bias": "transformer.norm.bias",
    "predictor_proj.weight": "output_proj.weight",
    "predictor_proj.bias": "output_proj.bias",
}
BLOCK_PARTS = r"(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)"
NETWORKS = ("encoder", "predictor", "target_encoder")


def strip_module_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop DDP's ``module.`` prefix from every key that has it."""
    return {key.removeprefix("module."): value for key, value in state.items()}


def check_sincos_table(table: torch.Tensor, name: str) -> tuple[int, int]:
    """The square grid of an official ``[1, N, D]`` sin-cos ``table``, after checking that it is
    our ``sincos`` table (``col_row``, temperature 10000) to float32 precision."""
    if table.dim() != 3 or table.size(0) != 1:
        raise ValueError(f"{name} must be [1, N, D], got {tuple(table.shape)}.")
    side = math.isqrt(table.size(1))
    if side * side != table.size(1):
        raise ValueError(f"{name} has {table.size(1)} rows, not a square grid.")
    ours = sinusoidal_2d_grid(side, side, table.size(2))
    if not torch.allclose(table[0].float(), ours, atol=1e-5):
        error = (table[0].float() - ours).abs().max().item()
        raise ValueError(
            f"{name} is not the 2D sin-cos table this model builds (col_row, temperature 10000; largest "
            f"difference {error:.3g}): a learned or differently laid out table cannot be mapped onto `sincos`."
        )
    return side, side


def _convert(state: dict, names: dict[str, str], block_prefix: str, ours_prefix: str, skip: set[str]) -> dict:
    converted, unmapped = {}, []
    block = re.compile(rf"^{re.escape(block_prefix)}(\d+)\.{BLOCK_PARTS}$")
    for key, value in state.items():
        if key in skip:
            continue
        match = block.match(key)
        if key in names:
            converted[ours_prefix + names[key]] = value
        elif match:
            converted[f"{ours_prefix}transformer.blocks.{match.group(1)}.{match.group(2)}.{match.group(3)}"] = value
        else:
            unmapped.append(key)
    if unmapped:
        raise ValueError(f"cannot map these official keys onto the model: {sorted(unmapped)}")
    return converted


def official_to_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """An official checkpoint dict -> our :class:`IJEPA` state dict (``encoder.*``,
    ``target_encoder.*``, ``predictor.*``). Raises ValueError listing any key it cannot map and
    if a ``pos_embed`` is not the sin-cos table."""
    missing = [name for name in NETWORKS if name not in checkpoint]
    if missing:
        raise ValueError(f"not an official I-JEPA checkpoint: no {missing} entries (has {sorted(checkpoint)}).")
    state: dict[str, torch.Tensor] = {}
    for network in ("encoder", "target_encoder"):
        part = strip_module_prefix(checkpoint[network])
        if "pos_embed" in part:
            check_sincos_table(part["pos_embed"], f"{network}.pos_embed")
        state.update(_convert(part, ENCODER_NAMES, "blocks.", f"{network}.", {"pos_embed"}))
    predictor = strip_module_prefix(checkpoint["predictor"])
    if "predictor_pos_embed" in predictor:
        check_sincos_table(predictor["predictor_pos_embed"], "predictor.predictor_pos_embed")
    state.update(_convert(predictor, PREDICTOR_NAMES, "predictor_blocks.", "predictor.", {"predictor_pos_embed"}))
    return state


def official_layout(state: dict, names: dict[str, str], block_prefix: str, prefix: str) -> dict[str, torch.Tensor]:
    """The keys of ``state`` under ``prefix`` (``encoder.``, ``predictor.``; ``""`` for a bare
    encoder) renamed to the official layout (also timm's for the encoder): ``names`` and the
    blocks under ``block_prefix``. Raises ValueError listing keys that have no place there."""
    inverse = {ours: official for official, ours in names.items()}
    out, unmapped = {}, []
    block = re.compile(rf"^transformer\.blocks\.(\d+)\.{BLOCK_PARTS}$")
    for key, value in state.items():
        if not key.startswith(prefix):
            continue
        key = key[len(prefix) :]
        match = block.match(key)
        if key in inverse:
            out[inverse[key]] = value
        elif match:
            out[f"{block_prefix}{match.group(1)}.{match.group(2)}.{match.group(3)}"] = value
        else:
            unmapped.append(prefix + key)
    if unmapped:
        raise ValueError(f"these parameters have no place in the official layout: {sorted(unmapped)}")
    return out


def to_official(model: IJEPA) -> dict:
    """Our model -> an official-format checkpoint dict (``encoder``, ``predictor``,
    ``target_encoder`` with their sin-cos ``pos_embed`` tables). Only models the official code
    can express: image models, ``sincos`` in both networks, the ``per_block`` predictor, no
    SIGReg projector."""
    hp = model.hparams
    problems = []
    if hp.num_frames:
        problems.append("clips (model.num_frames > 0)")
    if hp.pos_embed != "sincos" or hp.predictor_pos_embed != "sincos":
        problems.append(
            f"position encodings {hp.pos_embed!r} / {hp.predictor_pos_embed!r} (the official ViT has sincos)"
        )
    if hp.predictor_mode != "per_block":
        problems.append(f"predictor_mode {hp.predictor_mode!r} (the official predictor is per_block)")
    if problems:
        raise ValueError("the official I-JEPA layout cannot express " + "; ".join(problems) + ".")
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    grid = model.encoder.grid_size
    checkpoint = {}
    for network in ("encoder", "target_encoder"):
        part = official_layout(state, ENCODER_NAMES, "blocks.", f"{network}.")
        part["pos_embed"] = sinusoidal_2d_grid(grid, grid, hp.embed_dim)[None]
        checkpoint[network] = part
    predictor = official_layout(state, PREDICTOR_NAMES, "predictor_blocks.", "predictor.")
    predictor["predictor_pos_embed"] = sinusoidal_2d_grid(grid, grid, hp.predictor_embed_dim)[None]
    checkpoint["predictor"] = predictor
    leftover = [key for key in state if not key.startswith(NETWORKS)]
    if leftover:
        raise ValueError(f"these parameters have no place in the official layout: {sorted(leftover)}")
    return checkpoint


def load_official(
    checkpoint: dict | str | Path,
    num_heads: int,
    predictor_num_heads: int,
    image_size: int | None = None,
    **model_options,
) -> IJEPA:
    """An :class:`IJEPA` holding an official I-JEPA checkpoint's weights.

    Widths, depths, patch size and the training grid are read from the weights; the head counts
    cannot be (the fused qkv hides them) and must be given (ViT-H/14: 16, predictor 12).
    ``image_size`` defaults to the checkpoint's; another size keeps the weights (sin-cos tables
    are rebuilt for the new grid). ``model_options`` go to :class:`IJEPA` (schedules, loss...).
    """
    if not isinstance(checkpoint, dict):
        checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state = official_to_state_dict(checkpoint)
    encoder = strip_module_prefix(checkpoint["encoder"])
    kernel = state["encoder.patch_embed.proj.weight"]
    embed_dim, patch_size = kernel.size(0), kernel.size(-1)
    if "pos_embed" in encoder:
        grid = check_sincos_table(encoder["pos_embed"], "encoder.pos_embed")[0]
    elif image_size is None:
        raise ValueError("the checkpoint has no encoder pos_embed to read the grid from: give image_size.")
    depth = 1 + max(int(key.split(".")[3]) for key in state if key.startswith("encoder.transformer.blocks."))
    predictor_depth = 1 + max(
        int(key.split(".")[3]) for key in state if key.startswith("predictor.transformer.blocks.")
    )
    model = IJEPA(
        image_size=image_size if image_size is not None else grid * patch_size,
        patch_size=patch_size,
        in_channels=kernel.size(1),
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=state["encoder.transformer.blocks.0.mlp.fc1.weight"].size(0) / embed_dim,
        pos_embed="sincos",
        predictor_embed_dim=state["predictor.input_proj.weight"].size(0),
        predictor_depth=predictor_depth,
        predictor_num_heads=predictor_num_heads,
        predictor_pos_embed="sincos",
        predictor_mode="per_block",
        **model_options,
    )
    load_exactly(model, state, "official checkpoint")
    return model
