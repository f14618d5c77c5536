"""Reading and writing other formats: the official I-JEPA checkpoint, Hugging Face ``IJepaModel``
and timm ``VisionTransformer``; and a trained encoder for plain PyTorch.

Every conversion is total: a key it cannot map is an error that lists the keys, never a partial
load, and anything a format cannot express (a position encoding that is not a table, clips) is
refused with a message saying what. Neither transformers nor timm is imported: the files they
read are written directly (safetensors and JSON).
"""

from ijepa.interop.encoder import (
    ijepa_from_encoder,
    image_encoder,
    load_encoder,
    position_table,
    save_lightning_checkpoint,
)
from ijepa.interop.huggingface import encoder_to_hf, load_hf, save_hf, to_hub_layout
from ijepa.interop.official import (
    check_sincos_table,
    load_official,
    official_to_state_dict,
    strip_module_prefix,
    to_official,
)
from ijepa.interop.timm_vit import encoder_to_timm, save_timm, timm_model_args

__all__ = [
    "check_sincos_table",
    "encoder_to_hf",
    "encoder_to_timm",
    "ijepa_from_encoder",
    "image_encoder",
    "load_encoder",
    "load_hf",
    "load_official",
    "official_to_state_dict",
    "position_table",
    "save_hf",
    "save_lightning_checkpoint",
    "save_timm",
    "strip_module_prefix",
    "timm_model_args",
    "to_hub_layout",
    "to_official",
]
