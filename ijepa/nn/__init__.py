"""Plain PyTorch building blocks (no Lightning): patches, positions, attention, ViT, predictor."""

from ijepa.nn.attention import Attention, BlockLayout, apply_rotary, block_layout_attention
from ijepa.nn.checks import check_indices, index_checks
from ijepa.nn.patch import PatchEmbed, gather_patches, grid_size
from ijepa.nn.position import (
    POSITION_EMBEDDINGS,
    AttentionPositions,
    FixedSinCos2DPositionEmbedding,
    Learned2DPositionEmbedding,
    NoPositionEmbedding,
    PositionEncoding,
    add_position_embedding,
    build_position_embedding,
    gather_tokens_with_positions,
    sinusoidal_1d_positions,
    sinusoidal_2d_grid,
)
from ijepa.nn.predictor import Predictor
from ijepa.nn.vit import Block, VisionTransformer

__all__ = [
    "POSITION_EMBEDDINGS",
    "Attention",
    "AttentionPositions",
    "Block",
    "BlockLayout",
    "FixedSinCos2DPositionEmbedding",
    "Learned2DPositionEmbedding",
    "NoPositionEmbedding",
    "PatchEmbed",
    "PositionEncoding",
    "Predictor",
    "VisionTransformer",
    "add_position_embedding",
    "apply_rotary",
    "block_layout_attention",
    "build_position_embedding",
    "check_indices",
    "gather_patches",
    "gather_tokens_with_positions",
    "grid_size",
    "index_checks",
    "sinusoidal_1d_positions",
    "sinusoidal_2d_grid",
]
