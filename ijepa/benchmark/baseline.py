"""The seed documents' way, kept as the benchmark's baseline (never used for training).

Same math as :class:`ijepa.module.IJEPA` with additive position tables (its weights are copied
in, and the benchmark checks the two losses agree on a batch), written plainly:
``nn.MultiheadAttention`` blocks, index checks with ``.item()`` on every call, the predictor
called once per target block, a per-parameter EMA loop, a per-parameter AdamW, and a mask
sampler that builds each image's blocks with Python loops.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.data.batch import GridBatch
from ijepa.nn.position import AdditivePosition, PositionEncoding
from ijepa.nn.stem import refuse_conv_stem


def check_indices_item(indices: torch.Tensor, num_patches: int) -> None:
    """The seeds' per-call check: two host syncs every time."""
    if int(indices.min().item()) < 0 or int(indices.max().item()) >= num_patches:
        raise ValueError("index out of range")


class SeedBlock(nn.Module):
    """Pre-norm block around ``nn.MultiheadAttention``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class SeedTransformer(nn.Module):
    """Blocks + final norm, weights copied from an :class:`ijepa.nn.vit.Transformer`."""

    def __init__(self, source: nn.Module):
        super().__init__()
        first = source.blocks[0]
        dim, heads = first.attn.proj.in_features, first.attn.num_heads
        ratio = first.mlp.fc1.out_features / dim
        self.blocks = nn.ModuleList(SeedBlock(dim, heads, ratio) for _ in source.blocks)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        with torch.no_grad():
            for mine, theirs in zip(self.blocks, source.blocks):
                mine.norm1.load_state_dict(theirs.norm1.state_dict())
                mine.norm2.load_state_dict(theirs.norm2.state_dict())
                mine.attn.in_proj_weight.copy_(theirs.attn.qkv.weight)
                mine.attn.in_proj_bias.copy_(theirs.attn.qkv.bias)
                mine.attn.out_proj.load_state_dict(theirs.attn.proj.state_dict())
                mine.mlp[0].load_state_dict(theirs.mlp.fc1.state_dict())
                mine.mlp[2].load_state_dict(theirs.mlp.fc2.state_dict())
            self.norm.load_state_dict(source.norm.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def _table(position: PositionEncoding) -> torch.Tensor | None:
    if isinstance(position, AdditivePosition) and position.hooks() == ("add_to_tokens",):
        return position.table().detach().clone()
    if not position.hooks():  # no position information
        return None
    raise ValueError(f"the seed-style baseline only has additive position tables, not {type(position).__name__}.")


class SeedEncoder(nn.Module):
    def __init__(self, source: nn.Module):
        super().__init__()
        refuse_conv_stem(source.patch_embed, "the seed-style baseline (one strided convolution, as the official code)")
        self.patch_embed = nn.Conv2d(
            source.patch_embed.proj.in_channels,
            source.embed_dim,
            source.patch_embed.patch_size,
            source.patch_embed.patch_size,
        )
        self.patch_embed.load_state_dict(source.patch_embed.proj.state_dict())
        table = _table(source.position)
        self.pos_embed = nn.Parameter(table, requires_grad=False) if table is not None else None
        self.transformer = SeedTransformer(source.transformer)
        self.num_patches = source.num_patches

    def forward(self, images: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        if indices is not None:
            check_indices_item(indices, self.num_patches)
            x = torch.gather(x, 1, indices.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        return self.transformer(x)


class SeedPredictor(nn.Module):
    def __init__(self, source: nn.Module):
        super().__init__()
        self.input_proj = nn.Linear(source.input_proj.in_features, source.input_proj.out_features)
        self.input_proj.load_state_dict(source.input_proj.state_dict())
        self.mask_token = nn.Parameter(source.mask_token.detach().clone())
        table = _table(source.position)
        self.pos_embed = nn.Parameter(table, requires_grad=False) if table is not None else None
        self.transformer = SeedTransformer(source.transformer)
        self.output_proj = nn.Linear(source.output_proj.in_features, source.output_proj.out_features)
        self.output_proj.load_state_dict(source.output_proj.state_dict())
        self.num_patches = source.num_patches

    def positions(self, indices: torch.Tensor) -> torch.Tensor:
        return 0.0 if self.pos_embed is None else self.pos_embed[indices]

    def forward(
        self, context: torch.Tensor, context_indices: torch.Tensor, target_indices: torch.Tensor
    ) -> torch.Tensor:
        """One call per target block ``[B, Kt]`` (the caller loops over the blocks)."""
        check_indices_item(context_indices, self.num_patches)
        check_indices_item(target_indices, self.num_patches)
        x = self.input_proj(context) + self.positions(context_indices)
        queries = self.mask_token.expand(target_indices.size(0), target_indices.size(1), -1) + self.positions(
            target_indices
        )
        x = self.transformer(torch.cat([x, queries], dim=1))
        return self.output_proj(x[:, -target_indices.size(1) :])


class SeedIJEPA(nn.Module):
    """Online/target encoder and predictor, copied from an :class:`ijepa.module.IJEPA`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = SeedEncoder(model.encoder)
        self.target_encoder = SeedEncoder(model.target_encoder).requires_grad_(False)
        self.predictor = SeedPredictor(model.predictor)
        self.loss_name = model.hparams.loss

    def loss(self, batch: GridBatch) -> torch.Tensor:
        images, context_indices, target_indices = batch.images, batch.context_indices, batch.target_indices
        with torch.no_grad():
            target_features = self.target_encoder(images)
            target_features = F.layer_norm(target_features, target_features.shape[-1:])
        context = self.encoder(images, context_indices)
        losses = []
        for block in range(target_indices.size(1)):  # the predictor once per target block
            indices = target_indices[:, block]
            check_indices_item(indices, target_features.size(1))
            targets = torch.gather(target_features, 1, indices.unsqueeze(-1).expand(-1, -1, target_features.size(-1)))
            prediction = self.predictor(context, context_indices, indices)
            losses.append(
                F.smooth_l1_loss(prediction, targets)
                if self.loss_name == "smooth_l1"
                else F.mse_loss(prediction, targets)
            )
        return torch.stack(losses).mean()

    @torch.no_grad()
    def ema_update(self, momentum: float) -> None:
        """One small kernel pair per parameter."""
        for target, online in zip(self.target_encoder.parameters(), self.encoder.parameters()):
            target.mul_(momentum).add_(online.detach(), alpha=1.0 - momentum)


def python_masks(
    batch_size: int,
    grid_size: int,
    num_blocks: int = 4,
    target_scale: tuple[float, float] = (0.15, 0.2),
    target_aspect_ratio: tuple[float, float] = (0.75, 1.5),
    context_scale: tuple[float, float] = (0.85, 1.0),
    min_keep: int = 4,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mask sampling the way the official I-JEPA collator does it: for every image and
    every block a fresh ``[G, G]`` tensor, a ``torch.randint`` corner, ``torch.nonzero``; the
    context restricted by multiplying with each target's complement; lists truncated to the
    batch minimum at the end. Where the official loop would retry forever (targets leaving fewer
    than ``min_keep`` context patches), the targets are redrawn after 20 tries."""
    generator = generator or torch.Generator().manual_seed(0)

    def shape(scale, aspect_range):
        u = torch.rand(2, generator=generator)
        area = grid_size * grid_size * (scale[0] + float(u[0]) * (scale[1] - scale[0]))
        aspect = aspect_range[0] + float(u[1]) * (aspect_range[1] - aspect_range[0])
        h = min(max(round(math.sqrt(area * aspect)), 1), grid_size)
        w = min(max(round(math.sqrt(area / aspect)), 1), grid_size)
        return h, w

    def block_mask(h, w, acceptable=None, tries=20):
        for _ in range(tries):  # a block with no `acceptable` regions is returned on the first try
            top = int(torch.randint(0, grid_size - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, grid_size - w + 1, (1,), generator=generator))
            mask = torch.zeros((grid_size, grid_size), dtype=torch.int32)
            mask[top : top + h, left : left + w] = 1
            if acceptable is not None:
                for region in acceptable:
                    mask *= region
            indices = torch.nonzero(mask.flatten()).squeeze(-1)
            if acceptable is None or len(indices) >= min_keep:
                complement = torch.ones((grid_size, grid_size), dtype=torch.int32)
                complement[top : top + h, left : left + w] = 0
                return indices, complement
        return None  # no context of min_keep patches beside these targets

    target_hw, context_hw = shape(target_scale, target_aspect_ratio), shape(context_scale, (1.0, 1.0))
    contexts, targets = [], []
    for _ in range(batch_size):
        while True:  # the official loop can spin forever on impossible targets: redraw them
            blocks, complements = zip(*(block_mask(*target_hw) for _ in range(num_blocks)))
            found = block_mask(*context_hw, acceptable=complements)
            if found is not None:
                break
        contexts.append(found[0])
        targets.append(torch.stack(blocks))
    keep = min(len(c) for c in contexts)
    return torch.stack([c[:keep] for c in contexts]), torch.stack(targets)
