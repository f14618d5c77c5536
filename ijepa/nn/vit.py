"""The Vision Transformer: its blocks, the one init sequence, and the encoder of images and clips
(over gathered patch indices, no class token)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ijepa.nn.attention import Attention, BlockLayout
from ijepa.nn.checks import check_indices, check_positive
from ijepa.nn.packing import Packed, check_packable
from ijepa.nn.patch import PatchEmbed, gather_patches
from ijepa.nn.position import AttentionPositions, PositionEncoding, build_position_encoding
from ijepa.nn.stem import ConvStem, check_stem, refuse_conv_stem
from ijepa.nn.video import TubeletEmbed

# The position encoding of an encoder that names none, by grid axes (images, clips).
DEFAULT_POSITIONS = {2: "sincos", 3: "sincos_3d"}


class MLP(nn.Module):
    """Transformer feed-forward: ``[..., D] -> [..., hidden] -> GELU -> [..., D]``."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample with probability ``p``."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty(x.size(0), *([1] * (x.dim() - 1))).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``; ``[B, K, D]``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path: float = 0.0,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = MLP(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, positions: AttentionPositions | None = None, attn_mask=None) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), positions, attn_mask))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """A stack of blocks plus final LayerNorm that lets a position encoding act at every stage.

    ``forward(tokens [B, K, D], indices [B, K], attn_mask, frame_times, token_mask) -> [B, K, D]``;
    ``attn_mask`` as in :class:`ijepa.nn.attention.Attention` (None, boolean ``[K, K]`` or a
    ``BlockLayout``); ``token_mask [B, K]`` (True for real tokens) makes padding tokens invisible
    as keys and zero before a position encoding's ``after_block``, so real tokens' outputs do
    not depend on the padding. Shared by encoder and predictor.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        position: PositionEncoding,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        check_positive(depth, "depth")
        if num_heads <= 0 or dim % num_heads != 0:
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of the width {dim}.")
        self.position = position
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio, qkv_bias, rate, norm_eps) for rate in rates)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.checkpoint_every = 0  # activation checkpointing: see checkpoints_block

    def checkpoints_block(self, index: int) -> bool:
        """Whether block ``index`` keeps only its input for the backward pass and recomputes its
        activations there (``checkpoint_every = n``: blocks 0, n, 2n, ...; 0: none). Only when
        gradients are being recorded: the target encoder and evaluation run as they are."""
        every = self.checkpoint_every
        return bool(every) and index % every == 0 and torch.is_grad_enabled()

    def forward(
        self,
        tokens: torch.Tensor,
        indices: torch.Tensor,
        attn_mask=None,
        frame_times: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        position: PositionEncoding | None = None,
    ) -> torch.Tensor:
        return self.last_block_outputs(tokens, indices, 1, attn_mask, frame_times, token_mask, position)[0]

    def last_block_outputs(
        self,
        tokens: torch.Tensor,
        indices: torch.Tensor,
        count: int,
        attn_mask=None,
        frame_times: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        position: PositionEncoding | None = None,
    ) -> list[torch.Tensor]:
        """The outputs of the last ``count`` blocks, each through the final norm: ``count`` x
        ``[B, K, D]``, the last being ``forward``'s. ``tokens`` come without positions: the
        encoding adds its own here (``add_to_tokens``), its attention terms act in every block
        and its ``after_block`` hook after each. ``frame_times [B, T']`` reach encodings that
        take them (M-RoPE) and are ignored by the others. ``position`` replaces the stack's own
        encoding for this call (its view on another grid, :meth:`PositionEncoding.at_grid`)."""
        if not 1 <= count <= len(self.blocks):
            raise ValueError(f"count must be in 1..{len(self.blocks)} (the depth), got {count}.")
        position = self.position if position is None else position
        tokens = position.add_to_tokens(tokens, indices)
        positions = position.attention_positions(indices, frame_times)
        keep = None
        if token_mask is not None:
            if token_mask.shape != tokens.shape[:2]:
                raise ValueError(
                    f"token_mask must have shape [B, K] = {tuple(tokens.shape[:2])}, got {tuple(token_mask.shape)}."
                )
            if isinstance(attn_mask, BlockLayout):
                raise ValueError("token_mask cannot be combined with a BlockLayout; pass the boolean mask instead.")
            keys = token_mask[:, None, None, :]  # [B, 1, 1, K]: no query attends to padding
            attn_mask = keys if attn_mask is None else attn_mask & keys
            keep = token_mask[..., None].to(tokens.dtype)
        outputs = []
        for i, block in enumerate(self.blocks):
            if self.checkpoints_block(i):
                # non-reentrant: composes with FSDP2 and torch.compile, and replays the RNG, so
                # stochastic depth drops the same paths in the recomputation
                tokens = checkpoint(block, tokens, positions, attn_mask, use_reentrant=False)
            else:
                tokens = block(tokens, positions, attn_mask)
            if keep is not None:  # e.g. PEG scatters tokens to the grid: padding must add nothing
                tokens = tokens * keep
            tokens = position.after_block(i, tokens, indices)
            if i >= len(self.blocks) - count:
                outputs.append(self.norm(tokens))
        return outputs


def init_vit_weights(module: nn.Module) -> None:
    """ViT/I-JEPA init: trunc-normal(0.02) linear and conv weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def init_timm(network: nn.Module) -> None:
    """timm's ViT init (``VisionTransformer.init_weights(mode="")``), the standard a from-scratch
    baseline is trained from: trunc-normal(0.02) linear weights and zero biases, PyTorch's own
    init of the convolutions (the patch embedding: Kaiming-uniform, fan-in bounded), unit
    LayerNorms, the position encoding's own draw (a learned table: trunc-normal 0.02); no residual
    rescaling. Draws from the global RNG."""
    for module in network.modules():
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Conv2d, nn.Conv3d, nn.LayerNorm)):
            module.reset_parameters()
    network.transformer.position.reset_parameters()


def rescale_residual_branches(blocks: nn.ModuleList) -> None:
    """Divide each block's residual output projections by ``sqrt(2 * layer)``, as I-JEPA does,
    so the residual stream's variance does not grow with depth at init."""
    for layer, block in enumerate(blocks, start=1):
        block.attn.proj.weight.data.div_(math.sqrt(2.0 * layer))
        block.mlp.fc2.weight.data.div_(math.sqrt(2.0 * layer))


def init_network(network: nn.Module, rescale_residuals: bool, learned_inputs: tuple[nn.Parameter, ...] = ()) -> None:
    """The one init of the encoders and the predictor, on ``network`` (which has a
    ``transformer``): :func:`init_vit_weights` over every submodule, the ``learned_inputs`` (the
    predictor's mask token) trunc-normal(0.02), the position encoding's own draw
    (:meth:`~ijepa.nn.position.PositionEncoding.reset_parameters`), then, with
    ``rescale_residuals``, :func:`rescale_residual_branches`. The order fixes which random numbers
    each tensor gets, so a seed gives the same weights as it always has."""
    network.apply(init_vit_weights)
    for parameter in learned_inputs:
        nn.init.trunc_normal_(parameter, std=0.02)
    network.transformer.position.reset_parameters()
    if rescale_residuals:
        rescale_residual_branches(network.transformer.blocks)


class VisionTransformer(nn.Module):
    """ViT encoder of images or clips that runs only on the given tokens (no class token).

    The token embedding is given: a :class:`~ijepa.nn.patch.PatchEmbed` or a
    :class:`~ijepa.nn.stem.ConvStem` (images ``[B, C, H, W]``, grid ``(H', W')``) or a
    :class:`~ijepa.nn.video.TubeletEmbed` (clips ``[B, C, T, H, W]``, grid ``(T', H', W')``);
    :meth:`for_images` and :meth:`for_clips` build it from sizes. Everything
    after the embedding is shared: ``forward(inputs, patch_indices [B, K] | None, token_mask
    [B, K] | None, patch_size, frame_times [B, T'] | None) -> [B, K, D]``; with no indices it
    encodes all ``N`` tokens in row-major order; ``token_mask`` (True for real tokens) marks
    padding among the indices; ``patch_size`` is FlexiViT's per-call patch size (images only);
    ``frame_times`` (one per temporal token, in temporal-position units) reach the encodings that
    read time (``mrope``). Online and target encoders are two instances of this class.

    ``pos_embed``: a member of :data:`~ijepa.nn.position.POSITION_ENCODINGS` for the embedding's
    grid (None: ``sincos`` for images, ``sincos_3d`` for clips). ``rescale_residuals``: divide
    each block's output projections by ``sqrt(2 * layer)`` after the init (the I-JEPA ViT's
    constructor does; the official training script then redraws every Linear, so official runs
    start without it). ``norm_eps``: the LayerNorms' epsilon (1e-6 as in I-JEPA and timm; a
    Hugging Face config may say otherwise, see :mod:`ijepa.interop`).
    """

    def __init__(
        self,
        patch_embed: PatchEmbed | ConvStem | TubeletEmbed,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        pos_embed: str | None = None,
        rescale_residuals: bool = True,
        pos_options: dict | None = None,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        self.patch_embed = patch_embed
        # a conv stem names its width: it has no single projection to read it from
        self.embed_dim = patch_embed.embed_dim if isinstance(patch_embed, ConvStem) else patch_embed.proj.out_channels
        if pos_embed is None:
            pos_embed = DEFAULT_POSITIONS[len(patch_embed.grid)]
        position = build_position_encoding(pos_embed, patch_embed.grid, self.embed_dim, num_heads, pos_options)
        self.transformer = Transformer(
            self.embed_dim, depth, num_heads, position, mlp_ratio, qkv_bias, drop_path_rate, norm_eps
        )
        init_network(self, rescale_residuals)

    @classmethod
    def for_images(
        cls,
        image_size: int = 96,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
        *args,
        stem: str = "patch",
        **options,
    ) -> VisionTransformer:
        """An image encoder: ``patch_size`` x ``patch_size`` patches of ``image_size`` squares,
        embedded by ``stem``: ``patch`` (one linear projection per patch, :class:`PatchEmbed`) or
        ``conv`` (Xiao et al.'s stride-2 convolutions on the whole image, :class:`~ijepa.nn.stem.ConvStem`)
        or ``conv_in_patch`` (the same on each patch alone); ``args`` and ``options`` as the
        constructor's (``depth``, ``num_heads``, ...)."""
        check_stem(stem)
        if stem == "patch":
            embed = PatchEmbed(image_size, patch_size, in_channels, embed_dim)
        else:
            embed = ConvStem(image_size, patch_size, in_channels, embed_dim, within_patch=stem == "conv_in_patch")
        return cls(embed, *args, **options)

    @classmethod
    def for_clips(
        cls,
        num_frames: int = 16,
        image_size: int = 64,
        tubelet_size: int = 2,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
        *args,
        stem: str = "patch",
        **options,
    ) -> VisionTransformer:
        """A clip encoder: ``tubelet_size`` x ``patch_size`` x ``patch_size`` tubelets of
        ``num_frames`` frames of ``image_size`` squares; ``args`` and ``options`` as the
        constructor's (``depth``, ``num_heads``, ...). ``stem`` is ``patch`` only (a tubelet
        embedding); it is taken so that one call builds either kind."""
        check_stem(stem)
        if stem != "patch":
            raise ValueError(
                f"stem={stem!r} is for images; clips (num_frames={num_frames} > 0) are embedded by tubelets: "
                "use stem='patch'."
            )
        embed = TubeletEmbed(num_frames, image_size, tubelet_size, patch_size, in_channels, embed_dim)
        return cls(embed, *args, **options)

    @property
    def grid(self) -> tuple[int, ...]:
        """The token grid: ``(H', W')`` for images, ``(T', H', W')`` for clips."""
        return self.patch_embed.grid

    @property
    def num_patches(self) -> int:
        """Tokens on the full grid, ``N``."""
        return self.patch_embed.num_patches

    @property
    def is_clip_encoder(self) -> bool:
        """Whether the encoder embeds clips (a :class:`~ijepa.nn.video.TubeletEmbed`)."""
        return isinstance(self.patch_embed, TubeletEmbed)

    @property
    def position(self) -> PositionEncoding:
        """The encoder's position encoding."""
        return self.transformer.position

    def all_indices(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """Every patch index, ``[batch_size, N]``."""
        return torch.arange(self.num_patches, device=device).expand(batch_size, -1)

    def embed(self, inputs: torch.Tensor, patch_size: int | None = None) -> tuple[torch.Tensor, PositionEncoding]:
        """Tokens ``[B, N, D]`` (no positions yet) and the position encoding of their grid: the
        encoder's own, or for another ``patch_size`` (FlexiViT, images only) the resized kernel's
        tokens and the encoding's view on that grid (:meth:`PositionEncoding.at_grid`)."""
        if patch_size is None or patch_size == self.patch_embed.patch_size:
            return self.patch_embed(inputs), self.position
        refuse_conv_stem(self.patch_embed, f"a per-call patch_size={patch_size} (FlexiViT, data.train_patch_sizes)")
        if self.is_clip_encoder:
            raise ValueError(
                f"patch_size={patch_size}: per-call patch sizes (FlexiViT, data.train_patch_sizes) are for image "
                f"encoders; this clip encoder's tubelets are {self.patch_embed.patch_size} px, fixed."
            )
        tokens = self.patch_embed(inputs, patch_size)
        side = self.patch_embed.image_size // patch_size
        return tokens, self.position.at_grid((side, side))

    def forward(
        self,
        inputs: torch.Tensor,
        patch_indices: torch.Tensor | None = None,
        *,
        token_mask: torch.Tensor | None = None,
        patch_size: int | None = None,
        frame_times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens, position = self.embed(inputs, patch_size)  # [B, N, D]
        if patch_indices is None:
            patch_indices = torch.arange(tokens.size(1), device=inputs.device).expand(inputs.size(0), -1)
        else:
            check_indices(patch_indices, tokens.size(1), "patch_indices")
            if patch_indices.size(0) != inputs.size(0):
                raise ValueError(
                    f"batch mismatch: inputs have B={inputs.size(0)}, patch_indices have B={patch_indices.size(0)}."
                )
            tokens = gather_patches(tokens, patch_indices)
        return self.transformer(
            tokens, patch_indices, frame_times=frame_times, token_mask=token_mask, position=position
        )

    def forward_packed(self, packed: Packed) -> torch.Tensor:
        """NaViT: images of their own sizes packed into sequences (:mod:`ijepa.nn.packing`), whose
        ``values [S, L, C p p]`` are patches, ``positions`` canvas positions on this encoder's grid
        -> features ``[S, L, D]``; every token attends only to its own image's tokens (padding
        slots hold values to ignore). Image encoders, with position members that act per image only."""
        if self.is_clip_encoder:
            raise ValueError("packed batches (NaViT, data.native_resolution) are for image encoders, not clips.")
        check_packable(self.position.name)
        refuse_conv_stem(self.patch_embed, "a packed batch (NaViT, data.native_sides)")
        if packed.values.size(-1) != self.patch_embed.proj.weight[0].numel():
            raise ValueError(
                f"packed patches have {packed.values.size(-1)} values, this encoder's patches "
                f"{self.patch_embed.proj.weight[0].numel()} (C p p)."
            )
        check_indices(packed.positions, self.num_patches, "packed.positions")
        proj = self.patch_embed.proj
        tokens = F.linear(packed.values, proj.weight.flatten(1), proj.bias)  # the patch convolution, per slot
        return self.transformer(tokens, packed.positions, attn_mask=packed.attention_mask())

    def block_outputs(
        self,
        inputs: torch.Tensor,
        last_blocks: int = 1,
        *,
        patch_size: int | None = None,
        frame_times: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The last ``last_blocks`` blocks' normed outputs on all tokens, ``last_blocks`` x
        ``[B, N, D]`` (oldest block first); ``patch_size`` and ``frame_times`` as in ``forward``."""
        tokens, position = self.embed(inputs, patch_size)
        indices = torch.arange(tokens.size(1), device=inputs.device).expand(inputs.size(0), -1)
        return self.transformer.last_block_outputs(
            tokens, indices, last_blocks, frame_times=frame_times, position=position
        )

    def pooled_features(
        self,
        inputs: torch.Tensor,
        last_blocks: int = 1,
        *,
        patch_size: int | None = None,
        frame_times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean over all tokens of the last ``last_blocks`` blocks' normed outputs, concatenated:
        ``[B, last_blocks * D]`` (oldest block first; :meth:`block_outputs`)."""
        outputs = self.block_outputs(inputs, last_blocks, patch_size=patch_size, frame_times=frame_times)
        return torch.cat([output.mean(dim=1) for output in outputs], dim=-1)
