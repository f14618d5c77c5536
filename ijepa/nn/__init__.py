"""Plain PyTorch building blocks (no Lightning): patches, positions, attention, ViT, predictor."""

from ijepa.nn.attention import Attention, BlockLayout, apply_rotary, block_layout_attention
from ijepa.nn.checks import check_indices, index_checks
from ijepa.nn.patch import PatchEmbed, gather_patches, grid_size
from ijepa.nn.position import (
    POSITION_ENCODINGS,
    AdditivePosition,
    AttentionPositions,
    PositionEncoding,
    build_position_encoding,
    position_names,
    sinusoidal_1d_positions,
    sinusoidal_2d_grid,
)
from ijepa.nn.predictor import Predictor
from ijepa.nn.video import TubeletEmbed
from ijepa.nn.vit import Block, VisionTransformer

__all__ = [
    "POSITION_ENCODINGS",
    "AdditivePosition",
    "Attention",
    "AttentionPositions",
    "Block",
    "BlockLayout",
    "PatchEmbed",
    "PositionEncoding",
    "Predictor",
    "TubeletEmbed",
    "VisionTransformer",
    "apply_rotary",
    "block_layout_attention",
    "build_position_encoding",
    "check_indices",
    "gather_patches",
    "grid_size",
    "index_checks",
    "position_names",
    "sinusoidal_1d_positions",
    "sinusoidal_2d_grid",
]
