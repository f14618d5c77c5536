"""Video building blocks: tubelet embedding and position encodings over a ``T' x H' x W'`` grid.

Tokens are row-major over (time, row, column): ``i = (t * H' + r) * W' + c``. The encodings are
:class:`ijepa.nn.position.PositionEncoding` members, so the shared :class:`Transformer` runs
them through the same hooks as the image encodings.

* ``sincos_3d``: V-JEPA's fixed table, half the channels for time, a quarter each for rows and
  columns (``[time | row | col]``), so inner products depend only on the offsets;
* ``learned_3d``: a learned ``[T' H' W', D]`` table;
* ``mrope``: Qwen2-VL's multimodal RoPE. The rotary channel pairs keep the ordinary 1D
  frequencies and are split into temporal, height and width sections, each rotated by its own
  coordinate. With ``t = h = w`` it is exactly 1D RoPE. The temporal coordinate is the frame index,
  or (Qwen2.5-VL) the frame's timestamp divided by ``time_unit``, so clips at different frame
  rates get positions in elapsed time.
"""

from __future__ import annotations

import torch
from torch import nn

from ijepa.nn.checks import check_indices, check_positive
from ijepa.nn.patch import gather_patches
from ijepa.nn.position import AdditivePositionEmbedding, AttentionPositions, PositionEncoding, sinusoidal_1d_positions
from ijepa.nn.resize import interpolate_3d_table
from ijepa.nn.vit import Transformer, init_vit_weights, pooled_block_features, rescale_residual_branches


class TubeletEmbed(nn.Module):
    """``[B, C, T, H, W] -> [B, T' H' W', D]`` with one ``tubelet_size x patch_size x patch_size``
    Conv3d (V-JEPA), tokens row-major over ``(t, r, c)``."""

    def __init__(
        self,
        num_frames: int,
        image_size: int,
        tubelet_size: int = 2,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
    ):
        super().__init__()
        for value, name in (
            (num_frames, "num_frames"),
            (image_size, "image_size"),
            (tubelet_size, "tubelet_size"),
            (patch_size, "patch_size"),
            (embed_dim, "embed_dim"),
        ):
            check_positive(value, name)
        if num_frames % tubelet_size:
            raise ValueError(f"num_frames={num_frames} must be a multiple of tubelet_size={tubelet_size}.")
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} must be a multiple of patch_size={patch_size}.")
        self.grid = (num_frames // tubelet_size, image_size // patch_size, image_size // patch_size)
        self.num_patches = self.grid[0] * self.grid[1] * self.grid[2]
        self.proj = nn.Conv3d(
            in_channels,
            embed_dim,
            (tubelet_size, patch_size, patch_size),
            stride=(tubelet_size, patch_size, patch_size),
        )

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        if clips.dim() != 5:
            raise ValueError(f"clips must be [B, C, T, H, W], got {tuple(clips.shape)}.")
        tokens = self.proj(clips)  # [B, D, T', H', W']
        if tuple(tokens.shape[2:]) != self.grid:
            raise ValueError(f"clips {tuple(clips.shape)} give a {tuple(tokens.shape[2:])} grid, expected {self.grid}.")
        return tokens.flatten(2).transpose(1, 2)


def tubelet_times(frame_times: torch.Tensor, tubelet_size: int) -> torch.Tensor:
    """Per-frame timestamps ``[B, T]`` (seconds) -> one per temporal token ``[B, T // tubelet_size]``:
    the time of each tubelet's first frame. Only differences reach M-RoPE, so the choice of the
    first frame (rather than the middle) shifts every token equally and changes nothing."""
    if frame_times.dim() != 2 or frame_times.size(1) % tubelet_size:
        raise ValueError(
            f"frame_times must be [B, T] with T a multiple of tubelet_size={tubelet_size}, "
            f"got {tuple(frame_times.shape)}."
        )
    return frame_times[:, ::tubelet_size]


class VideoPositionEncoding(PositionEncoding):
    """Base for encodings over a ``grid_time x grid_height x grid_width`` token grid."""

    def __init__(self, grid_time: int, grid_height: int, grid_width: int, embed_dim: int):
        super().__init__(grid_height, grid_width, embed_dim)
        check_positive(grid_time, "grid_time")
        self.grid_time = grid_time
        self.num_positions = grid_time * grid_height * grid_width

    def time_row_col(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row-major indices ``[B, K]`` -> ``(t, r, c)``, each ``[B, K]``."""
        plane = self.grid_height * self.grid_width
        return indices // plane, (indices % plane) // self.grid_width, indices % self.grid_width

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.grid_time, self.grid_height, self.grid_width


def sincos_3d_table(
    grid_time: int, grid_height: int, grid_width: int, embed_dim: int, temperature: float = 10_000.0
) -> torch.Tensor:
    """V-JEPA's fixed 3D sin-cos table ``[T H W, D]``, row-major over ``(t, r, c)``: channels
    ``[time (D/2) | row (D/4) | col (D/4)]``, each a 1D sin-cos code (:func:`sinusoidal_1d_positions`)."""
    if embed_dim % 8:
        raise ValueError(f"embed_dim must be divisible by 8 for 3D sin-cos, got {embed_dim}.")
    t, r, c = torch.meshgrid(
        torch.arange(grid_time), torch.arange(grid_height), torch.arange(grid_width), indexing="ij"
    )
    return torch.cat(
        [
            sinusoidal_1d_positions(t.flatten(), embed_dim // 2, temperature),
            sinusoidal_1d_positions(r.flatten(), embed_dim // 4, temperature),
            sinusoidal_1d_positions(c.flatten(), embed_dim // 4, temperature),
        ],
        dim=1,
    )


class FixedSinCos3DPositionEmbedding(VideoPositionEncoding, AdditivePositionEmbedding):
    """``sincos_3d``: the fixed V-JEPA table, a float32 buffer not saved in checkpoints."""

    def __init__(
        self, grid_time: int, grid_height: int, grid_width: int, embed_dim: int, temperature: float = 10_000.0
    ):
        super().__init__(grid_time, grid_height, grid_width, embed_dim)
        self.register_buffer(
            "pos_embed", sincos_3d_table(grid_time, grid_height, grid_width, embed_dim, temperature), persistent=False
        )

    def table(self) -> torch.Tensor:
        return self.pos_embed


class Learned3DPositionEmbedding(VideoPositionEncoding, AdditivePositionEmbedding):
    """``learned_3d``: a learned ``[T' H' W', D]`` table (trunc-normal init, std 0.02)."""

    def __init__(self, grid_time: int, grid_height: int, grid_width: int, embed_dim: int):
        super().__init__(grid_time, grid_height, grid_width, embed_dim)
        self.embedding = nn.Embedding(self.num_positions, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.embedding.weight, std=0.02)

    def table(self) -> torch.Tensor:
        return self.embedding.weight

    def state_resizers(self, old_grid, mode="bicubic", antialias=False):
        if len(old_grid) != 3:
            raise ValueError(f"learned_3d needs the checkpoint's (T', H', W') grid, got {old_grid}.")
        return {"embedding.weight": lambda t: interpolate_3d_table(t, tuple(old_grid), self.grid, mode)}


def mrope_sections(pairs: int) -> tuple[int, int, int]:
    """Qwen2-VL's default split of ``pairs`` rotary channel pairs: a quarter for time, the rest
    halved between height and width (16/24/24 of 64 pairs)."""
    spatial = (3 * pairs) // 8
    return pairs - 2 * spatial, spatial, spatial


class MultimodalRotaryPositionEmbedding(VideoPositionEncoding):
    """``mrope`` (Qwen2-VL M-RoPE) over ``(t, r, c)``.

    Each head's ``head_dim / 2`` channel pairs have the 1D RoPE frequencies
    ``base ** (-2j / head_dim)``; the first ``sections[0]`` pairs are rotated by the temporal
    coordinate, the next ``sections[1]`` by the row, the last ``sections[2]`` by the column.
    The temporal coordinate is the frame-token index ``t``, or, when ``frame_times [B, T']`` (in
    seconds, one per temporal token) is given, ``frame_times / time_unit`` (Qwen2.5-VL's absolute
    time). Angles ``[B, 1, K, head_dim / 2]`` in float32.
    """

    needs_num_heads = True
    takes_frame_times = True

    def __init__(
        self,
        grid_time: int,
        grid_height: int,
        grid_width: int,
        embed_dim: int,
        num_heads: int = 1,
        sections: tuple[int, int, int] | None = None,
        base: float = 10_000.0,
        time_unit: float = 1.0,
    ):
        super().__init__(grid_time, grid_height, grid_width, embed_dim)
        check_positive(num_heads, "num_heads")
        if embed_dim % num_heads or (embed_dim // num_heads) % 2:
            raise ValueError(f"mrope needs an even head_dim = embed_dim / num_heads, got {embed_dim} / {num_heads}.")
        pairs = embed_dim // num_heads // 2
        sections = tuple(sections) if sections is not None else mrope_sections(pairs)
        if len(sections) != 3 or min(sections) < 0 or sum(sections) != pairs:
            raise ValueError(
                f"sections must be 3 non-negative pair counts summing to head_dim / 2 = {pairs}, got {sections}."
            )
        if time_unit <= 0:
            raise ValueError(f"time_unit must be > 0 (seconds per temporal position), got {time_unit}.")
        self.sections = sections
        self.time_unit = time_unit
        # 1D RoPE frequencies base^(-2j / head_dim), head_dim = 2 * pairs
        self.register_buffer("freqs", base ** -(torch.arange(pairs, dtype=torch.float32) / pairs), persistent=False)
        self.register_buffer("axis", torch.repeat_interleave(torch.arange(3), torch.tensor(sections)), persistent=False)

    def coordinates(self, indices: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, K, 3]`` float coordinates ``(t, r, c)`` of the tokens at ``indices [B, K]``; ``t``
        in units of ``time_unit`` when ``frame_times [B, T']`` is given."""
        check_indices(indices, self.num_positions, "indices")
        t, r, c = self.time_row_col(indices.long())
        time = t.float()
        if frame_times is not None:
            if (
                frame_times.dim() != 2
                or frame_times.size(1) != self.grid_time
                or frame_times.size(0) != indices.size(0)
            ):
                raise ValueError(
                    f"frame_times must be [B, {self.grid_time}] with B={indices.size(0)}, got {tuple(frame_times.shape)}."
                )
            time = torch.gather(frame_times.float(), 1, t) / self.time_unit
        return torch.stack([time, r.float(), c.float()], dim=-1)

    def angles_from_coordinates(self, coordinates: torch.Tensor) -> torch.Tensor:
        """``[B, K, 3]`` coordinates -> angles ``[B, 1, K, head_dim / 2]``."""
        position_per_pair = coordinates[..., self.axis]  # [B, K, pairs]: each pair's own axis
        return (position_per_pair * self.freqs).unsqueeze(1)

    def angles(self, indices: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """Rotation angles ``[B, 1, K, head_dim / 2]`` of the tokens at ``indices [B, K]``."""
        return self.angles_from_coordinates(self.coordinates(indices, frame_times))

    def attention_positions(self, indices: torch.Tensor, frame_times: torch.Tensor | None = None) -> AttentionPositions:
        angles = self.angles(indices, frame_times)
        return AttentionPositions(rope=(angles.cos(), angles.sin()))


VIDEO_POSITION_EMBEDDINGS: dict[str, type[VideoPositionEncoding]] = {
    "sincos_3d": FixedSinCos3DPositionEmbedding,
    "learned_3d": Learned3DPositionEmbedding,
    "mrope": MultimodalRotaryPositionEmbedding,
}


def build_video_position_embedding(
    name: str, grid: tuple[int, int, int], embed_dim: int, num_heads: int = 1, **options
) -> VideoPositionEncoding:
    """A video position encoding by name (``sincos_3d``, ``learned_3d``, ``mrope``) for a
    ``(T', H', W')`` grid; ``options`` go to its constructor (e.g. ``sections``, ``time_unit``)."""
    if name not in VIDEO_POSITION_EMBEDDINGS:
        raise ValueError(f"video pos_embed must be one of {tuple(VIDEO_POSITION_EMBEDDINGS)}, got {name!r}.")
    cls = VIDEO_POSITION_EMBEDDINGS[name]
    extra = {"num_heads": num_heads} if getattr(cls, "needs_num_heads", False) else {}
    return cls(*grid, embed_dim, **extra, **options)


class VideoVisionTransformer(nn.Module):
    """ViT encoder on clips that runs only on the given tokens.

    ``forward(clips [B, C, T, H, W], patch_indices [B, K] | None, frame_times [B, T'] | None)
    -> [B, K, D]``; with no indices it encodes all ``T' H' W'`` tokens in row-major order.
    ``frame_times`` (seconds, one per temporal token) reach ``mrope``; the others ignore them.
    ``token_mask [B, K]`` (True for real tokens) marks padding among the indices.
    The blocks are the image encoder's :class:`ijepa.nn.vit.Transformer`, unchanged.
    """

    def __init__(
        self,
        num_frames: int = 16,
        image_size: int = 64,
        tubelet_size: int = 2,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.0,
        pos_embed: str = "sincos_3d",
        rescale_residuals: bool = True,
        **pos_options,
    ):
        super().__init__()
        self.patch_embed = TubeletEmbed(num_frames, image_size, tubelet_size, patch_size, in_channels, embed_dim)
        self.grid = self.patch_embed.grid
        self.num_patches = self.patch_embed.num_patches
        self.embed_dim = embed_dim
        position = build_video_position_embedding(pos_embed, self.grid, embed_dim, num_heads, **pos_options)
        self.transformer = Transformer(embed_dim, depth, num_heads, position, mlp_ratio, True, drop_path_rate)
        self.apply(init_vit_weights)
        if hasattr(position, "reset_parameters"):
            position.reset_parameters()
        if rescale_residuals:
            rescale_residual_branches(self.transformer.blocks)

    @property
    def position(self) -> VideoPositionEncoding:
        return self.transformer.position

    def pooled_features(
        self, clips: torch.Tensor, last_blocks: int = 1, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean over all tokens of the last ``last_blocks`` blocks' normed outputs, concatenated:
        ``[B, C, T, H, W] -> [B, last_blocks * D]`` (as :meth:`VisionTransformer.pooled_features`)."""
        return pooled_block_features(self, clips, last_blocks, frame_times)

    def forward(
        self,
        clips: torch.Tensor,
        patch_indices: torch.Tensor | None = None,
        frame_times: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens = self.patch_embed(clips)  # [B, N, D]
        if patch_indices is None:
            patch_indices = torch.arange(self.num_patches, device=clips.device).expand(clips.size(0), -1)
        else:
            check_indices(patch_indices, self.num_patches, "patch_indices")
            tokens = gather_patches(tokens, patch_indices)
        return self.transformer(tokens, patch_indices, frame_times=frame_times, token_mask=token_mask)
