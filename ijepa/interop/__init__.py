"""Reading and writing other formats: the official I-JEPA checkpoint, Hugging Face ``IJepaModel``
and timm ``VisionTransformer``; and a trained encoder for plain PyTorch.

Every conversion is total: a key it cannot map is an error that lists the keys, never a partial
load, and anything a format cannot express (a position encoding that is not a table, clips) is
refused with a message saying what. Neither transformers nor timm is imported: the files they
read are written directly (safetensors and JSON).

Each name loads its module on first use. ``load_encoder`` and the exporters (``save_hf``,
``save_timm``, ``to_official`` ...) import no Lightning (nor transformers, which Lightning
pulls in); only what builds an ``IJEPA`` does (``load_official``, ``ijepa_from_encoder``,
``save_lightning_checkpoint``, in :mod:`ijepa.interop.ijepa_model`).
"""

import importlib

_MODULES = {
    "ijepa_from_encoder": "ijepa_model",
    "load_official": "ijepa_model",
    "model_card": "card",
    "save_lightning_checkpoint": "ijepa_model",
    "image_encoder": "encoder",
    "load_encoder": "encoder",
    "position_table": "encoder",
    "encoder_to_hf": "huggingface",
    "load_hf": "huggingface",
    "save_hf": "huggingface",
    "to_hub_layout": "huggingface",
    "check_sincos_table": "official",
    "official_to_state_dict": "official",
    "strip_module_prefix": "official",
    "to_official": "official",
    "encoder_to_timm": "timm_vit",
    "save_timm": "timm_vit",
    "timm_model_args": "timm_vit",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))
