"""The official I-JEPA checkpoint format, in and out.

The official layout (``facebookresearch/ijepa``, ``src/models/vision_transformer.py``) is a dict
with ``encoder``, ``predictor`` and ``target_encoder`` state dicts (possibly behind DDP's
``module.`` prefix) plus optimizer and bookkeeping entries. Its ViT has no class token and a
fixed sin-cos ``pos_embed [1, N, D]`` whose layout equals our ``sincos`` table (``col_row``), so
the weights map one to one onto an :class:`~ijepa.module.IJEPA` with ``pos_embed`` and
``predictor_pos_embed`` ``sincos``; its predictor is our ``per_block`` predictor.

A ``pos_embed`` that is not our sin-cos table is an error, not replaced. The export is a file the
official ``train.py`` resumes from (``src/helper.py``'s ``load_checkpoint`` reads ``epoch``, the
three networks with DDP's prefix, ``opt`` and ``scaler``). Nothing here imports Lightning:
:func:`~ijepa.interop.load_official`, which builds an :class:`~ijepa.module.IJEPA`, lives in
:mod:`ijepa.interop.ijepa_model`.
"""

from __future__ import annotations

import math
import re

import torch

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
# What the official load_checkpoint reads besides the networks; a missing one sends it back to
# epoch 0 with random weights, without an error.
RESUME_ENTRIES = ("epoch", "opt", "scaler")


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


def official_resume_entries(checkpoint: dict) -> dict:
    """``epoch``, ``opt`` and ``scaler`` for the official-layout networks in ``checkpoint``: what
    the official ``load_checkpoint`` reads after the weights. ``opt`` is an AdamW state dict over
    the official ``init_opt``'s four parameter groups (weights of the encoder, of the predictor,
    then their biases and 1-D parameters, which exclude weight decay) with fresh moments;
    ``scaler`` is a GradScaler's initial state (read only by bfloat16 runs). At epoch 0 the
    official run starts its schedules from the beginning, from these weights."""
    groups = []
    for no_decay in (False, True):
        for network in ("encoder", "predictor"):
            part = checkpoint[network]
            count = sum((("bias" in key) or value.dim() == 1) == no_decay for key, value in part.items())
            group: dict = {"params": [torch.zeros(()) for _ in range(count)]}
            if no_decay:
                group.update(WD_exclude=True, weight_decay=0)
            groups.append(group)
    return {
        "epoch": 0,
        "opt": torch.optim.AdamW(groups).state_dict(),
        "scaler": torch.amp.GradScaler("cpu").state_dict(),
    }


def to_official(model: torch.nn.Module, module_prefix: bool = True) -> dict:
    """Our :class:`~ijepa.module.IJEPA` -> an official-format checkpoint dict: ``encoder``,
    ``predictor``, ``target_encoder`` (with their sin-cos ``pos_embed`` tables) and the entries
    :func:`official_resume_entries` adds, so the official ``train.py`` resumes from it.
    ``module_prefix`` puts DDP's ``module.`` before every weight, as the published checkpoints
    and every multi-process official run have; an official run on one process (no DDP) needs
    ``module_prefix=False``. Only models the official code can express: image models,
    ``sincos`` in both networks, the ``per_block`` predictor, the patch stem, no SIGReg projector."""
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
    if hp.get("stem", "patch") != "patch":
        problems.append(f"stem {hp.stem!r} (the official ViT has a patch projection)")
    if problems:
        raise ValueError("the official I-JEPA layout cannot express " + "; ".join(problems) + ".")
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    grid = model.encoder.grid
    checkpoint = {}
    for network in ("encoder", "target_encoder"):
        part = official_layout(state, ENCODER_NAMES, "blocks.", f"{network}.")
        part["pos_embed"] = sinusoidal_2d_grid(*grid, hp.embed_dim)[None]
        checkpoint[network] = part
    predictor = official_layout(state, PREDICTOR_NAMES, "predictor_blocks.", "predictor.")
    predictor["predictor_pos_embed"] = sinusoidal_2d_grid(*grid, hp.predictor_embed_dim)[None]
    checkpoint["predictor"] = predictor
    leftover = [key for key in state if not key.startswith(NETWORKS)]
    if leftover:
        raise ValueError(f"these parameters have no place in the official layout: {sorted(leftover)}")
    checkpoint.update(official_resume_entries(checkpoint))
    if module_prefix:
        for network in NETWORKS:
            checkpoint[network] = {f"module.{key}": value for key, value in checkpoint[network].items()}
    return checkpoint


def official_model_options(checkpoint: dict, image_size: int | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """What an official checkpoint says about the model, ``(IJEPA options, our state dict)``:
    widths, depths, patch size and the training grid, read from the weights. The head counts
    cannot be (the fused qkv hides them); ``image_size`` overrides the checkpoint's."""
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
    options = {
        "image_size": image_size if image_size is not None else grid * patch_size,
        "patch_size": patch_size,
        "in_channels": kernel.size(1),
        "embed_dim": embed_dim,
        "depth": depth,
        "mlp_ratio": state["encoder.transformer.blocks.0.mlp.fc1.weight"].size(0) / embed_dim,
        "pos_embed": "sincos",
        "predictor_embed_dim": state["predictor.input_proj.weight"].size(0),
        "predictor_depth": predictor_depth,
        "predictor_pos_embed": "sincos",
        "predictor_mode": "per_block",
    }
    return options, state
