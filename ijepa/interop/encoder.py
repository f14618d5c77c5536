"""A trained encoder on its own: out of an ``ijepa fit`` checkpoint into plain PyTorch, and the
pieces every export shares (its position table, its weights written atomically as safetensors).

Neither this module nor the exporters built on it import Lightning (nor, through it,
transformers): an encoder is read straight from the checkpoint's weights and hyperparameters.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ijepa.legacy import upgrade_hparams
from ijepa.nn.position import AdditivePosition, NonePosition
from ijepa.nn.position.registry import additive_positions
from ijepa.nn.stem import refuse_conv_stem
from ijepa.nn.vit import VisionTransformer

# The IJEPA hyperparameters its encoders are built from (ijepa.module.IJEPA.__init__), by name.
ENCODER_OPTIONS = (
    "image_size",
    "patch_size",
    "in_channels",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "drop_path_rate",
    "pos_embed",
    "rescale_residuals",
    "pos_options",
    "stem",
)
CLIP_OPTIONS = ("num_frames", "tubelet_size")
# The dtypes the folder exports (hf, timm) write their weights in, by their ``--dtype`` name.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``: a library's error cut to one line for ours."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def read_torch_file(path: str | Path, what: str = "PyTorch checkpoint") -> object:
    """``torch.load(path, weights_only=True)`` on the CPU; a file that is truncated or of another
    kind is a ValueError naming it, in one line."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # zip, pickle and EOF errors of torch: none names the file
        raise ValueError(
            f"{path} is not a readable {what} (truncated, or a file of another kind): {first_line(error)}"
        ) from error


def load_encoder(checkpoint: str | Path, encoder: str = "target") -> VisionTransformer:
    """The trained encoder of an ``ijepa fit`` checkpoint as a plain :class:`torch.nn.Module` in
    eval mode, on the CPU: ``encoder(images [B, 3, H, W]) -> [B, N, D]`` patch features and
    ``encoder.pooled_features(images) -> [B, D]``. ``encoder``: ``target`` (the EMA encoder the
    probes score, default) or ``online``. Clip checkpoints give the clip encoder. Built from
    the checkpoint's hyperparameters without Lightning, at the resolution it was trained at."""
    if encoder not in ("target", "online"):
        raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
    saved = read_torch_file(checkpoint, "ijepa checkpoint")
    hp = saved.get("hyper_parameters") if isinstance(saved, dict) else None
    state = saved.get("state_dict") if isinstance(saved, dict) else None
    if not isinstance(hp, dict) or not isinstance(state, dict):
        raise ValueError(f"{checkpoint} is not an ijepa fit checkpoint: it has no state_dict and hyper_parameters.")
    hp = upgrade_hparams(hp)
    options = {key: hp[key] for key in ENCODER_OPTIONS if key in hp}
    if hp.get("num_frames"):
        network = VisionTransformer.for_clips(**options, **{key: hp[key] for key in CLIP_OPTIONS if key in hp})
    else:
        network = VisionTransformer.for_images(**options)
    prefix = "target_encoder." if encoder == "target" else "encoder."
    load_exactly(
        network, {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}, str(checkpoint)
    )
    return network.eval().requires_grad_(False)


def load_exactly(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``module`` only if it fits key for key and shape for shape; otherwise a
    ValueError naming ``source`` and listing the missing keys or the mismatched shapes (never a
    partial load)."""
    ours = module.state_dict()
    missing = sorted(set(ours) - set(state))
    if missing:
        raise ValueError(f"the {source} lacks these parameters of the model: {missing}")
    for key, value in state.items():
        if key in ours and ours[key].shape != value.shape:
            raise ValueError(f"{key}: {source} shape {tuple(value.shape)} != model shape {tuple(ours[key].shape)}.")
    module.load_state_dict(state, strict=True)


def image_encoder(encoder: torch.nn.Module, which: str = "target") -> VisionTransformer:
    """The image encoder to export: ``encoder`` itself, or one of an
    :class:`~ijepa.module.IJEPA`'s (``which``: ``target``, the EMA encoder, or ``online``).
    Clip encoders and conv stems (the formats hold a patch projection only) are refused."""
    if hasattr(encoder, "target_encoder"):  # an IJEPA, told apart without importing Lightning
        if which not in ("target", "online"):
            raise ValueError(f"which must be 'target' or 'online', got {which!r}.")
        encoder = encoder.target_encoder if which == "target" else encoder.encoder
    if not isinstance(encoder, VisionTransformer):
        raise ValueError(
            f"only image encoders (ijepa.nn.vit.VisionTransformer) can be exported, got {type(encoder).__name__}."
        )
    if encoder.is_clip_encoder:
        raise ValueError("only image encoders can be exported, got a clip encoder (model.num_frames > 0).")
    refuse_conv_stem(encoder.patch_embed, "exporting to Hugging Face or timm (a ViT with a patch projection)")
    return encoder


def position_table(encoder: VisionTransformer, target: str) -> torch.Tensor:
    """The encoder's positions as the one ``[N, D]`` table added to the patch tokens that plain
    ViTs (timm, Hugging Face) hold: the table of an additive member (``learned``, ``learned_2d``
    summed out, ``sincos``) or zeros for ``none``. Members that act inside attention or between
    blocks cannot be written as such a table and are refused; ``target`` names the format."""
    position = encoder.position
    if isinstance(position, AdditivePosition):
        return position.table().detach().float().clone()
    if type(position) is NonePosition:
        return torch.zeros(encoder.num_patches, encoder.embed_dim)
    acts = list(position.hooks())
    raise ValueError(
        f"{target} adds one position table to the patch tokens; pos_embed {position.name!r} acts through "
        f"{acts} and cannot be written as a table. Exportable: the additive members "
        f"({', '.join(additive_positions())}) and none."
    )


def encoder_options(encoder: VisionTransformer) -> dict:
    """What a plain ViT needs to rebuild ``encoder``: sizes, widths and the LayerNorm epsilon."""
    refuse_conv_stem(encoder.patch_embed, "a plain ViT's config (patch size and channels, read from the kernel)")
    first = encoder.transformer.blocks[0]
    kernel = encoder.patch_embed.proj.weight
    return {
        "image_size": encoder.patch_embed.image_size,
        "patch_size": kernel.size(-1),
        "in_channels": kernel.size(1),
        "embed_dim": encoder.embed_dim,
        "depth": len(encoder.transformer.blocks),
        "num_heads": first.attn.num_heads,
        "mlp_hidden": first.mlp.fc1.out_features,
        "qkv_bias": first.attn.qkv.bias is not None,
        "norm_eps": encoder.transformer.norm.eps,
    }


def temporary_file(path: Path) -> Path:
    """A hidden file next to ``path`` (same filesystem, so renaming it over ``path`` is atomic),
    named after the writing process as ``ijepa.checkpoint``'s temporaries are."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def export_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` name of :data:`DTYPES`; any other name is a ValueError
    listing them."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    return DTYPES[dtype]


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> None:
    """Write ``tensors`` to ``path`` as safetensors (``format: pt``, which transformers requires),
    through a temporary file renamed over ``path``: a crash leaves the old file or the new one.
    ``dtype``: floating-point tensors are written in it (rounded to nearest); None keeps theirs."""
    temporary = temporary_file(path)

    def stored(value: torch.Tensor) -> torch.Tensor:
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value.contiguous().clone()

    try:
        save_file({k: stored(v) for k, v in tensors.items()}, str(temporary), {"format": "pt"})
        # safetensors creates its file private (0600): give it the mode any file gets under the umask
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def current_umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_digest(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (names and contents, in sorted order): how
    ``ijepa eval`` results name the checkpoint they are of."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def save_text(text: str, path: Path) -> None:
    """``text`` at ``path``, written through a temporary file."""
    temporary = temporary_file(path)
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def save_json(obj: dict, path: Path) -> None:
    """``obj`` as indented JSON at ``path``, written through a temporary file."""
    save_text(json.dumps(obj, indent=2) + "\n", path)


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of a saved model folder: ``model.safetensors``, a sharded
    ``model.safetensors.index.json``, or ``pytorch_model.bin`` (loaded with ``weights_only``).
    A file that cannot be read is a ValueError naming it."""
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        index = read_json(folder / "model.safetensors.index.json")
        if not isinstance(index.get("weight_map"), dict):
            raise ValueError(f"{folder / 'model.safetensors.index.json'} has no weight_map: not a safetensors index.")
        shards = sorted(set(index["weight_map"].values()))
        return {key: value for shard in shards for key, value in read_safetensors(folder / shard).items()}
    if (folder / "pytorch_model.bin").is_file():
        state = read_torch_file(folder / "pytorch_model.bin", "PyTorch state dict")
        if not isinstance(state, dict):
            raise ValueError(f"{folder / 'pytorch_model.bin'} is not a state dict: it holds a {type(state).__name__}.")
        return state
    raise FileNotFoundError(f"{folder} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin.")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; one that is missing, truncated or of another kind is an
    error naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (named by the folder's safetensors index).")
    try:
        return load_file(str(path))
    except Exception as error:  # safetensors' own errors do not name the file
        raise ValueError(
            f"{path} is not a readable safetensors file (truncated, or a file of another kind): {first_line(error)}"
        ) from error


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; anything else is a ValueError naming the file."""
    try:
        obj = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not JSON: {first_line(error)}") from error
    if not isinstance(obj, dict):
        raise ValueError(f"{path} is not a JSON object: it holds a {type(obj).__name__}.")
    return obj
