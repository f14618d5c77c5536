"""The I-JEPA predictor: context features + target positions -> predicted target features."""

from __future__ import annotations

import torch
import torch.nn as nn

from ijepa.nn.attention import BlockLayout
from ijepa.nn.checks import check_indices
from ijepa.nn.packing import Packed, check_packable
from ijepa.nn.position import PositionEncoding, build_position_encoding
from ijepa.nn.vit import Transformer, init_network

PREDICTOR_MODES = ("per_block", "one_pass")


class Predictor(nn.Module):
    """Narrow transformer that predicts target-patch features from context features.

    Context features are projected to the predictor width and given predictor positions at the
    context indices; one learned mask token per target index, plus that index's position, is
    appended; after the transformer the target tokens are projected back to the encoder width.

    ``forward(context [B, Kc, D], context_indices [B, Kc], target_indices [B, M, Kt] or [B, Kt],
    frame_times, context_mask [B, Kc] | None)`` returns ``[B, M, Kt, D]`` (or ``[B, Kt, D]``);
    ``context_mask`` (True for real tokens) marks padding in the context, which no query sees;
    ``target_mask [B, M, Kt]`` (True for real targets) marks padded target slots (static
    shapes), which no query sees as a key; their predictions are to be ignored. ``forward``'s
    ``grid`` gives the indices' grid when it is not the predictor's own (a FlexiViT step at
    another patch size: the position encoding's view on that grid). The constructor's ``grid`` is
    the encoder's: ``(H', W')`` (or its side) for images, ``(T', H', W')`` for clips with a clip
    position encoding (``sincos_3d``, ``learned_flat_3d``, ``mrope``; M-RoPE also takes
    ``frame_times [B, T']``).

    ``out_levels = k`` widens the output projection to ``k * D`` (``k`` target levels side by side:
    ``ijepa.objectives.MultiLevelTargets``); predictions are then ``[..., k * D]``. ``out_dim``
    sets the target width ``D`` when it is not the encoder's (a distilled student predicts its
    teacher's features: :mod:`ijepa.distill`).
    ``with_context=True`` also returns the predictions at the context positions ``[B, Kc, k * D]``
    (per_block: the mean over the ``M`` blocks' sequences of the context's outputs, projected).

    ``mode`` says how M target blocks are predicted:

    * ``per_block`` (official I-JEPA): the context is repeated and each block is predicted in
      its own sequence ``[context, block m]`` of ``Kc + Kt`` tokens, ``B*M`` sequences; context
      tokens attend to the context and to block m's queries, so the context's hidden states
      differ per block.
    * ``one_pass``: one sequence ``[context, block 1, ..., block M]`` of ``Kc + M*Kt`` tokens per
      image with the attention of :func:`block_attention_mask` (computed mask-free by
      :func:`ijepa.nn.attention.block_layout_attention`): context tokens attend to the context
      only, block m's queries to the context and to block m. Blocks still never see each other, but the
      context's hidden states no longer depend on the queries (the one difference from
      ``per_block``), so its work is done once instead of M times.
    """

    def __init__(
        self,
        grid: int | tuple[int, ...],
        embed_dim: int = 192,
        predictor_embed_dim: int = 96,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        pos_embed: str = "sincos",
        mode: str = "per_block",
        rescale_residuals: bool = True,
        pos_options: dict | None = None,
        out_levels: int = 1,
        out_dim: int | None = None,
    ):
        super().__init__()
        if mode not in PREDICTOR_MODES:
            raise ValueError(f"predictor mode must be one of {PREDICTOR_MODES}, got {mode!r}.")
        self.mode = mode
        self.grid = (grid, grid) if isinstance(grid, int) else tuple(grid)
        self.embed_dim = embed_dim
        self.input_proj = nn.Linear(embed_dim, predictor_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, predictor_embed_dim))
        position = build_position_encoding(pos_embed, self.grid, predictor_embed_dim, num_heads, pos_options)
        if mode == "one_pass" and "after_block" in position.hooks():
            # e.g. PEG's convolution over the token grid would mix blocks that share positions.
            raise ValueError(
                f"predictor mode 'one_pass' needs a position encoding that acts per token, not {pos_embed!r}; "
                "use mode 'per_block' or another predictor_pos_embed."
            )
        self.num_patches = position.num_positions
        self.transformer = Transformer(
            predictor_embed_dim, depth, num_heads, position, mlp_ratio, qkv_bias, drop_path_rate
        )
        self.output_proj = nn.Linear(predictor_embed_dim, (out_dim or embed_dim) * out_levels)
        init_network(self, rescale_residuals, learned_inputs=(self.mask_token,))

    @property
    def position(self) -> PositionEncoding:
        """The predictor's position encoding."""
        return self.transformer.position

    def no_weight_decay(self) -> set[str]:
        """The mask token is a learned input, not a weight: the optimizer does not decay it."""
        return {"mask_token"}

    def forward(
        self,
        context: torch.Tensor,
        context_indices: torch.Tensor,
        target_indices: torch.Tensor,
        frame_times: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        grid: tuple[int, ...] | None = None,
        target_mask: torch.Tensor | None = None,
        with_context: bool = False,
        with_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        position = self.position if grid is None else self.position.at_grid(grid)
        if context.dim() != 3 or context.size(-1) != self.embed_dim:
            raise ValueError(f"context must have shape [B, Kc, {self.embed_dim}], got {tuple(context.shape)}.")
        check_indices(context_indices, position.num_positions, "context_indices")
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
        check_indices(target_indices, position.num_positions, "target_indices")

        if self.mode == "one_pass":
            flat_targets = target_indices.reshape(batch, num_blocks * num_targets)
            flat_mask = None if target_mask is None else target_mask.reshape(batch, num_blocks * num_targets)
            tokens = self._one_pass(
                context, context_indices, flat_targets, num_blocks, frame_times, context_mask, position, flat_mask
            )
            num_context = context.size(1)
            hidden = tokens[:, num_context:].view(batch, num_blocks, num_targets, -1)
            return self._outputs(hidden, tokens[:, :num_context], single_block, with_context, with_hidden)

        x = self.input_proj(context).repeat_interleave(num_blocks, dim=0)  # [B*M, Kc, Dp]
        context_indices = context_indices.repeat_interleave(num_blocks, dim=0)
        queries = self.mask_token.expand(batch * num_blocks, num_targets, -1).to(x.dtype)

        tokens = torch.cat([x, queries], dim=1)
        indices = torch.cat([context_indices, target_indices], dim=1)
        if frame_times is not None:
            frame_times = frame_times.repeat_interleave(num_blocks, dim=0)  # one row per sequence
        token_mask = None
        if context_mask is not None or target_mask is not None:
            ones = torch.ones(batch * num_blocks, 1, dtype=torch.bool, device=context.device)
            context_part = (
                ones.expand(-1, context.size(1))
                if context_mask is None
                else context_mask.repeat_interleave(num_blocks, dim=0)
            )
            target_part = ones.expand(-1, num_targets) if target_mask is None else target_mask.reshape(-1, num_targets)
            token_mask = torch.cat([context_part, target_part], dim=1)
        tokens = self.transformer(tokens, indices, frame_times=frame_times, token_mask=token_mask, position=position)
        hidden = tokens[:, -num_targets:].view(batch, num_blocks, num_targets, -1)  # [B, M, Kt, Dp]
        context_states = (
            tokens[:, : context.size(1)].unflatten(0, (batch, num_blocks)).mean(1) if with_context else None
        )
        return self._outputs(hidden, context_states, single_block, with_context, with_hidden)

    def _outputs(self, hidden, context_states, single_block: bool, with_context: bool, with_hidden: bool):
        """``prediction = output_proj(hidden)`` (``[B, M, Kt, D']``, ``[B, Kt, D']`` for one block),
        then, as asked, the context's predictions ``[B, Kc, D']`` and the hidden states themselves."""
        prediction = self.output_proj(hidden)
        if single_block:
            prediction, hidden = prediction.squeeze(1), hidden.squeeze(1)
        extra = ([self.output_proj(context_states)] if with_context else []) + ([hidden] if with_hidden else [])
        return (prediction, *extra) if extra else prediction

    def forward_packed(
        self, context: torch.Tensor, layout: Packed, context_slot: torch.Tensor, target_slot: torch.Tensor
    ) -> torch.Tensor:
        """NaViT: predictions for every target token of a packed batch, ``[T, D]`` in slot order.

        ``context [S_c, L_c, D]`` is the context encoder's packed output; ``layout`` the
        predictor's packed sequences (``positions``, ``image_ids``, ``groups``: group 0 the
        context, group m the m-th target block, as ``one_pass`` attends: the context sees its
        image's context, block m that context and itself); ``context_slot [S, L]`` points each
        group-0 slot at its token in ``context`` (flat index), ``target_slot [S, L]`` is ``>= 0``
        at the slots to predict."""
        check_packable(self.position.name, "predictor_pos_embed")
        check_indices(layout.positions, self.num_patches, "layout.positions")
        flat = self.input_proj(context).flatten(0, 1)  # [S_c * L_c, Dp]
        is_context = context_slot >= 0
        tokens = torch.where(
            is_context[..., None], flat[context_slot.clamp_min(0)], self.mask_token.to(flat.dtype)
        )  # [S, L, Dp]
        tokens = self.transformer(tokens, layout.positions, attn_mask=layout.attention_mask())
        return self.output_proj(tokens[target_slot >= 0])

    def _one_pass(
        self,
        context: torch.Tensor,
        context_indices: torch.Tensor,
        target_indices: torch.Tensor,
        num_blocks: int,
        frame_times: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        position: PositionEncoding | None = None,
        target_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, Kc, D]``, ``[B, Kc]``, ``[B, M*Kt]`` -> the transformer's output ``[B, Kc + M*Kt, Dp]``
        (before the output projection); with a ``context_mask`` the block structure becomes an
        explicit boolean mask (no mask-free path)."""
        batch, num_context = context_indices.shape
        x = self.input_proj(context)
        queries = self.mask_token.expand(batch, target_indices.size(1), -1).to(x.dtype)
        tokens = torch.cat([x, queries], dim=1)
        indices = torch.cat([context_indices, target_indices], dim=1)
        num_targets = target_indices.size(1) // num_blocks
        if context_mask is None and target_mask is None:
            layout = BlockLayout(num_context, num_blocks, num_targets)
            tokens = self.transformer(tokens, indices, attn_mask=layout, frame_times=frame_times, position=position)
        else:
            structure = block_attention_mask(num_context, num_blocks, num_targets, tokens.device)
            context_part = (
                context_mask if context_mask is not None else torch.ones_like(context_indices, dtype=torch.bool)
            )
            target_part = target_mask if target_mask is not None else torch.ones_like(target_indices, dtype=torch.bool)
            token_mask = torch.cat([context_part, target_part], dim=1)
            tokens = self.transformer(
                tokens, indices, attn_mask=structure, frame_times=frame_times, token_mask=token_mask, position=position
            )
        return tokens


def block_attention_mask(num_context: int, num_blocks: int, num_targets: int, device=None) -> torch.Tensor:
    """Boolean ``[K, K]`` mask, ``K = Kc + M*Kt``, True where a query row may attend to a key column.

    Tokens are ordered ``[context (Kc), block 1 (Kt), ..., block M (Kt)]``: every row attends to
    the context columns; a block's rows also attend to their own block; nothing else.
    """
    group = torch.arange(num_blocks, device=device).repeat_interleave(num_targets)
    group = torch.cat([torch.full((num_context,), -1, device=device), group])
    return (group[None, :] == -1) | (group[:, None] == group[None, :])
