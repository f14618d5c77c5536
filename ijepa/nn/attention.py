"""Multi-head self-attention with the hooks that position encodings act through."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.nn.position import AttentionPositions


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive channel pairs ``(x[2j], x[2j+1])`` of ``x [B, H, K, hd]`` by angles
    whose cos/sin are ``[B, 1 or H, K, hd/2]``. Real arithmetic only (``torch.compile`` friendly),
    computed in float32 and cast back."""
    x_pairs = x.float().unflatten(-1, (-1, 2))
    x_even, x_odd = x_pairs.unbind(-1)
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


@dataclass(frozen=True)
class BlockLayout:
    """Token order ``[context (Kc), block 1 (Kt), ..., block M (Kt)]`` where the context attends to
    the context only and block m to the context and itself (the one-pass predictor). The same
    attention as a boolean mask is :func:`ijepa.nn.predictor.block_attention_mask`."""

    num_context: int
    num_blocks: int
    num_targets: int


def block_layout_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: BlockLayout,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention of ``q, k, v [B, H, Kc + M*Kt, hd]`` under ``layout``, without a mask: the context
    attends within itself, and the M blocks run as ``B*M`` sequences over ``[context, block m]``
    keys. Every call stays eligible for the fused (flash) kernels, and no masked-out score is ever
    computed. ``bias``: optional additive ``[B or 1, H, K, K]``. Returns ``[B, H, K, hd]``."""
    batch, heads, _, head_dim = q.shape
    c, m, t = layout.num_context, layout.num_blocks, layout.num_targets
    if bias is not None:
        bias = bias.expand(batch, heads, -1, -1)
    out_context = F.scaled_dot_product_attention(
        q[:, :, :c],
        k[:, :, :c],
        v[:, :, :c],
        attn_mask=None if bias is None else bias[:, :, :c, :c],
        dropout_p=dropout_p,
    )

    def blocks(x: torch.Tensor) -> torch.Tensor:  # [B, H, M*Kt, hd] part -> [B*M, H, Kt, hd]
        return x[:, :, c:].unflatten(2, (m, t)).transpose(1, 2).reshape(batch * m, heads, t, head_dim)

    def context_per_block(x: torch.Tensor) -> torch.Tensor:  # [B, H, Kc, hd] part -> [B*M, H, Kc, hd]
        return x[:, :, :c].unsqueeze(1).expand(batch, m, heads, c, head_dim).reshape(batch * m, heads, c, head_dim)

    keys = torch.cat([context_per_block(k), blocks(k)], dim=2)
    values = torch.cat([context_per_block(v), blocks(v)], dim=2)
    block_bias = None
    if bias is not None:
        rows = bias[:, :, c:].unflatten(2, (m, t))  # [B, H, M, Kt, K]
        own = rows[..., c:].unflatten(-1, (m, t)).diagonal(dim1=2, dim2=4).permute(0, 1, 4, 2, 3)  # [B, H, M, Kt, Kt]
        block_bias = torch.cat([rows[..., :c], own], dim=-1).transpose(1, 2).reshape(batch * m, heads, t, c + t)
    out_blocks = F.scaled_dot_product_attention(blocks(q), keys, values, attn_mask=block_bias, dropout_p=dropout_p)
    out_blocks = out_blocks.view(batch, m, heads, t, head_dim).transpose(1, 2).reshape(batch, heads, m * t, head_dim)
    return torch.cat([out_context, out_blocks], dim=2)


class Attention(nn.Module):
    """Fused-qkv self-attention over ``[B, K, D]`` using ``scaled_dot_product_attention``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if num_heads <= 0 or dim % num_heads != 0:
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of the width {dim}.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self,
        x: torch.Tensor,
        positions: AttentionPositions | None = None,
        attn_mask: torch.Tensor | BlockLayout | None = None,
    ) -> torch.Tensor:
        """``x [B, K, D] -> [B, K, D]``. ``attn_mask``: optional boolean ``[K, K]`` (or broadcastable
        to ``[B, H, K, K]``), True where query row may attend to key column; or a
        :class:`BlockLayout`, the same structure computed without a mask."""
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, K, hd]
        bias = None
        if positions is not None:
            if positions.rope is not None:
                cos, sin = positions.rope
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            if positions.bias is not None:
                bias = positions.bias.to(q.dtype)
        dropout_p = self.attn_drop if self.training else 0.0
        if isinstance(attn_mask, BlockLayout):
            out = block_layout_attention(q, k, v, attn_mask, bias, dropout_p)
        else:
            if attn_mask is not None:
                bias = attn_mask if bias is None else bias.masked_fill(~attn_mask, float("-inf"))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, dim)))
