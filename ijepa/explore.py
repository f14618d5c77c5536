"""The computations behind the notebooks in ``docs/notebooks/``: mask statistics, position-embedding
maps, RoPE scores by offset, loading a trained model and an encoder report. Plain functions on
tensors, tested in ``tests/test_explore.py``; the notebooks only lay them out, with the image
helpers of :mod:`ijepa.pictures`.

Images are float ``[3, H, W]`` in [0, 1]; maps are ``[G, G]`` over the patch grid, row-major
(``i = r * G + c``).
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA
from ijepa.nn.attention import apply_rotary
from ijepa.nn.position import AdditivePosition, PositionEncoding
from ijepa.nn.position.registry import additive_positions


def mask_statistics(sampler: MultiBlockMaskSampler, batch_size: int = 64, num_batches: int = 20, seed: int = 0) -> dict:
    """Masks of ``num_batches`` batches: per-position frequencies ``[G, G]`` of being a target
    (in any block) and of being context, the context length ``Kc`` of every batch, the target
    block size ``Kt`` and mean fractions of the grid covered."""
    generator = torch.Generator().manual_seed(seed)
    n, g = sampler.num_patches, sampler.grid_size
    target_count, context_count = torch.zeros(n), torch.zeros(n)
    context_lengths, block_sizes = [], []
    for _ in range(num_batches):
        context, targets = sampler(batch_size, generator)
        target_mask = torch.zeros(batch_size, n, dtype=torch.bool)
        target_mask.scatter_(1, targets.flatten(1), True)
        context_mask = torch.zeros(batch_size, n, dtype=torch.bool).scatter_(1, context, True)
        target_count += target_mask.sum(0)
        context_count += context_mask.sum(0)
        context_lengths.append(context.size(1))
        block_sizes.append(targets.size(2))
    samples = batch_size * num_batches
    return {
        "target_frequency": (target_count / samples).view(g, g),
        "context_frequency": (context_count / samples).view(g, g),
        "context_lengths": context_lengths,
        "target_block_sizes": block_sizes,
        "mean_context_fraction": statistics.mean(context_lengths) / n,
        "mean_target_fraction": float(target_count.sum() / samples / n),
    }


def _additive_table(position: PositionEncoding) -> torch.Tensor:
    if not isinstance(position, AdditivePosition):
        raise ValueError(
            f"{type(position).__name__} has no additive table; table maps exist for "
            f"{', '.join(additive_positions())} (RoPE: use rope_offset_scores)."
        )
    return position.table().detach().float()


def position_channel_map(position: PositionEncoding, channel: int) -> torch.Tensor:
    """Channel ``channel`` of an additive position table, as a ``[G_h, G_w]`` map."""
    table = _additive_table(position)
    if not 0 <= channel < table.size(1):
        raise ValueError(f"channel must be in 0..{table.size(1) - 1}, got {channel}.")
    return table[:, channel].view(position.grid_height, position.grid_width)


def position_similarity_map(position: PositionEncoding, index: int) -> torch.Tensor:
    """Cosine similarity ``[G_h, G_w]`` of position ``index``'s embedding with every position's."""
    table = _additive_table(position)
    if not 0 <= index < table.size(0):
        raise ValueError(f"index must be in 0..{table.size(0) - 1}, got {index}.")
    return F.cosine_similarity(table[index][None], table, dim=1).view(position.grid_height, position.grid_width)


def offset_pairs(
    grid_height: int, grid_width: int, anchor: tuple[int, int] | None = None
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """One (query, key) token pair per offset ``p_q - p_k = (dr, dc)`` that fits the grid: query
    and key indices, and the offset's cell ``(dr + G_h - 1, dc + G_w - 1)`` in a
    ``[2 G_h - 1, 2 G_w - 1]`` map. The key sits at ``anchor`` (default: as far up-left as each
    offset allows)."""
    queries, keys, cells = [], [], []
    for dr in range(-(grid_height - 1), grid_height):
        for dc in range(-(grid_width - 1), grid_width):
            kr, kc = anchor if anchor is not None else (max(0, -dr), max(0, -dc))
            qr, qc = kr + dr, kc + dc
            if 0 <= kr < grid_height and 0 <= kc < grid_width and 0 <= qr < grid_height and 0 <= qc < grid_width:
                queries.append(qr * grid_width + qc)
                keys.append(kr * grid_width + kc)
                cells.append((dr + grid_height - 1, dc + grid_width - 1))
    return queries, keys, cells


@torch.no_grad()
def bias_offset_map(position: PositionEncoding, head: int = 0, anchor: tuple[int, int] | None = None) -> torch.Tensor:
    """The attention bias of one head against the offset ``p_q - p_k = (dr, dc)``: a
    ``[2 G_h - 1, 2 G_w - 1]`` map, centre = offset (0, 0), for any member that biases the
    attention logits (``relative_bias``). Cells no pair reaches from ``anchor`` are NaN."""
    everything = torch.arange(position.num_positions)[None]
    positions = position.attention_positions(everything)
    if positions is None or positions.bias is None:
        raise ValueError(f"{type(position).__name__} puts no bias on the attention logits.")
    bias = positions.bias[0].detach().float()  # [heads, N, N]
    if not 0 <= head < bias.size(0):
        raise ValueError(f"head must be in 0..{bias.size(0) - 1}, got {head}.")
    gh, gw = position.grid_height, position.grid_width
    queries, keys, cells = offset_pairs(gh, gw, anchor)
    image = torch.full((2 * gh - 1, 2 * gw - 1), float("nan"))
    for (row, col), q, k in zip(cells, queries, keys):
        image[row, col] = bias[head, q, k]
    return image


def load_model(checkpoint: str, **overrides):
    """An :class:`ijepa.module.IJEPA` from a Lightning checkpoint, on the CPU, in eval mode;
    ``overrides`` (e.g. ``image_size=96``) go to ``load_from_checkpoint``, which adapts the
    weights to a new resolution."""
    return IJEPA.load_from_checkpoint(checkpoint, map_location="cpu", **overrides).eval()


@torch.no_grad()
def rope_offset_scores(
    position: PositionEncoding,
    query: torch.Tensor,
    key: torch.Tensor,
    head: int = 0,
    anchor: tuple[int, int] | None = None,
) -> torch.Tensor:
    """RoPE attention score ``<R(p_q) q, R(p_k) k>`` for every offset ``p_q - p_k = (dr, dc)``:
    a ``[2 G_h - 1, 2 G_w - 1]`` map, centre = offset (0, 0). ``query``, ``key``: ``[head_dim]``.

    The key sits at ``anchor`` (default: as far up-left as each offset allows); for a relative
    encoding the map does not depend on where (the test of that is RoPE's relativity).
    """
    everything = torch.arange(position.num_positions)[None]
    positions = position.attention_positions(everything)
    if positions is None or positions.rope is None:
        raise ValueError(f"{type(position).__name__} is not a rotary encoding (it does not rotate q and k).")
    gh, gw = position.grid_height, position.grid_width
    q_idx, k_idx, cells = offset_pairs(gh, gw, anchor)
    scores = torch.full((2 * gh - 1, 2 * gw - 1), float("nan"))
    cos, sin = positions.rope  # [1, 1 or H, N, hd/2]
    q_cos, q_sin, k_cos, k_sin = cos[:, :, q_idx], sin[:, :, q_idx], cos[:, :, k_idx], sin[:, :, k_idx]
    h = min(head, cos.size(1) - 1)
    count = len(cells)
    q_rot = apply_rotary(query.float().expand(1, 1, count, -1), q_cos[:, h : h + 1], q_sin[:, h : h + 1])
    k_rot = apply_rotary(key.float().expand(1, 1, count, -1), k_cos[:, h : h + 1], k_sin[:, h : h + 1])
    values = (q_rot * k_rot).sum(-1).flatten()
    for (row, col), value in zip(cells, values.tolist()):
        scores[row, col] = value
    return scores


def encoder_report(encoder: torch.nn.Module, images: torch.Tensor, patch_indices: torch.Tensor | None = None) -> dict:
    """Run ``encoder(images, patch_indices)`` with gradients and report what a debugging session
    asks first: output shape, feature statistics (mean, std over everything, mean token norm,
    std of the pooled features across the batch) and the gradient norm of every top-level part
    (patch embedding, position encoding, each block, final norm) after ``output.square().mean()``
    is back-propagated. Parameters' ``.grad`` are cleared before and after."""
    encoder.zero_grad(set_to_none=True)
    output = encoder(images, patch_indices)
    output.float().square().mean().backward()
    parts = {"patch_embed": encoder.patch_embed, "position": encoder.transformer.position}
    parts.update({f"block {i}": block for i, block in enumerate(encoder.transformer.blocks)})
    parts["norm"] = encoder.transformer.norm
    grad_norms = {}
    for name, module in parts.items():
        grads = [p.grad.float().norm() for p in module.parameters() if p.grad is not None]
        if grads:
            grad_norms[name] = float(torch.stack(grads).norm())
    encoder.zero_grad(set_to_none=True)
    features = output.detach().float()
    return {
        "input_shape": tuple(images.shape),
        "indices_shape": None if patch_indices is None else tuple(patch_indices.shape),
        "output_shape": tuple(output.shape),
        "mean": float(features.mean()),
        "std": float(features.std()),
        "mean_token_norm": float(features.norm(dim=-1).mean()),
        "pooled_std_across_batch": float(features.mean(1).std(0).mean()) if features.size(0) > 1 else float("nan"),
        "grad_norms": grad_norms,
        "device": str(output.device),
    }
