"""The I-JEPA predictor: context features + target positions -> predicted target features."""

from __future__ import annotations

import torch
import torch.nn as nn

from ijepa.nn.checks import check_indices
from ijepa.nn.position import PositionEncoding, build_position_embedding
from ijepa.nn.vit import Transformer, init_vit_weights, rescale_residual_branches


class Predictor(nn.Module):
    """Narrow transformer that predicts target-patch features from context features.

    Context features are projected to the predictor width and given predictor positions at the
    context indices; one learned mask token per target index, plus that index's position, is
    appended; after the transformer the target tokens are projected back to the encoder width.

    ``forward(context [B, Kc, D], context_indices [B, Kc], target_indices [B, M, Kt] or [B, Kt])``
    returns ``[B, M, Kt, D]`` (or ``[B, Kt, D]``). With M target blocks the context is repeated
    and each block is predicted in its own sequence, as in the official I-JEPA, so blocks never
    attend to each other.
    """

    def __init__(
        self,
        grid_size: int,
        embed_dim: int = 192,
        predictor_embed_dim: int = 96,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        pos_embed: str = "sincos",
    ):
        super().__init__()
        self.grid_size = grid_size
        self.num_patches = grid_size * grid_size
        self.embed_dim = embed_dim
        self.input_proj = nn.Linear(embed_dim, predictor_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, predictor_embed_dim))
        position = build_position_embedding(pos_embed, grid_size, grid_size, predictor_embed_dim, num_heads)
        self.transformer = Transformer(
            predictor_embed_dim, depth, num_heads, position, mlp_ratio, qkv_bias, drop_path_rate
        )
        self.output_proj = nn.Linear(predictor_embed_dim, embed_dim)
        self.apply(init_vit_weights)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        if hasattr(position, "reset_parameters"):
            position.reset_parameters()
        rescale_residual_branches(self.transformer.blocks)

    @property
    def position(self) -> PositionEncoding:
        """The predictor's position encoding."""
        return self.transformer.position

    def forward(
        self, context: torch.Tensor, context_indices: torch.Tensor, target_indices: torch.Tensor
    ) -> torch.Tensor:
        if context.dim() != 3 or context.size(-1) != self.embed_dim:
            raise ValueError(f"context must have shape [B, Kc, {self.embed_dim}], got {tuple(context.shape)}.")
        check_indices(context_indices, self.num_patches, "context_indices")
        if context_indices.shape != context.shape[:2]:
            raise ValueError(
                f"context_indices {tuple(context_indices.shape)} must match context's [B, Kc] = {tuple(context.shape[:2])}."
            )
        single_block = target_indices.dim() == 2
        if single_block:
            target_indices = target_indices.unsqueeze(1)
        if target_indices.dim() != 3 or target_indices.size(0) != context.size(0):
            raise ValueError(
                f"target_indices must have shape [B, M, Kt] or [B, Kt] with B={context.size(0)}, "
                f"got {tuple(target_indices.shape)}."
            )
        batch, num_blocks, num_targets = target_indices.shape
        target_indices = target_indices.reshape(batch * num_blocks, num_targets)
        check_indices(target_indices, self.num_patches, "target_indices")

        x = self.input_proj(context).repeat_interleave(num_blocks, dim=0)  # [B*M, Kc, Dp]
        context_indices = context_indices.repeat_interleave(num_blocks, dim=0)
        x = self.position.add_to_tokens(x, context_indices)
        queries = self.mask_token.expand(batch * num_blocks, num_targets, -1).to(x.dtype)
        queries = self.position.add_to_tokens(queries, target_indices)

        tokens = torch.cat([x, queries], dim=1)
        indices = torch.cat([context_indices, target_indices], dim=1)
        tokens = self.transformer(tokens, indices)
        prediction = self.output_proj(tokens[:, -num_targets:])  # [B*M, Kt, D]
        prediction = prediction.view(batch, num_blocks, num_targets, self.embed_dim)
        return prediction.squeeze(1) if single_block else prediction
