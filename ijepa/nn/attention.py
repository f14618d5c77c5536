"""Multi-head self-attention with the hooks that position encodings act through."""

from __future__ import annotations

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

    def forward(self, x: torch.Tensor, positions: AttentionPositions | None = None) -> torch.Tensor:
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
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=self.attn_drop if self.training else 0.0
        )
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, dim)))
