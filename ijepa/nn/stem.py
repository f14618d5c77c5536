"""The convolutional stem: "Early Convolutions Help Transformers See Better" (Xiao et al., 2021).

In place of the ViT's one ``patch_size`` x ``patch_size`` projection (:class:`~ijepa.nn.patch.PatchEmbed`),
``k = log2(patch_size)`` stride-2 3x3 convolutions, each normalised and followed by GELU, then a
1x1 convolution to the width. The tokens are on the patch grid, row-major, as ``PatchEmbed``'s.

Two ways to run it (``model.stem``): ``conv`` embeds the image whole, as Xiao et al. do, so a
token's 3x3 windows reach into the patches above and to its left; ``conv_in_patch`` runs the same
convolutions on each patch alone (zero padding at the patch border), so a token sees its own patch
only, as a patch projection's does. A masked-prediction objective needs the second: with the first,
a context token next to a target block sees pixels of that (masked) target.

The stem has no patch kernel: what reads one (FlexiViT's per-call patch sizes, NaViT's packed
patches, a patch-size change on load, the exports to formats that hold a patch projection) is
refused by :func:`refuse_conv_stem`, in one line.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ijepa.nn.patch import grid_size

# ``model.stem``: the token embedding of an image encoder.
STEMS = ("patch", "conv", "conv_in_patch")
# Stage widths are rounded up to a multiple of this and are at least MIN_WIDTH channels, so that
# small encoders (embed_dim 64 at patch 16: 8, 16, 32, 64) still get stages wide enough to see.
WIDTH_MULTIPLE = 8
MIN_WIDTH = 16


def check_stem(stem: str) -> None:
    """Raise ValueError naming ``stem`` and its choices unless it is one of :data:`STEMS`."""
    if stem not in STEMS:
        raise ValueError(f"stem must be one of {STEMS}, got {stem!r}.")


def stem_widths(patch_size: int, embed_dim: int, stem: str = "conv") -> tuple[int, ...]:
    """The output channels of the ``k`` stride-2 convolutions for ``patch_size = 2^k`` (``k >= 2``):
    ``embed_dim / 2^(k-1)``, doubling up to ``embed_dim``, each rounded up to a multiple of
    :data:`WIDTH_MULTIPLE` and at least :data:`MIN_WIDTH`; e.g. (8, 128) -> (32, 64, 128)."""
    if patch_size < 4 or patch_size & (patch_size - 1):
        raise ValueError(
            f"patch_size={patch_size}: stem={stem!r} needs a power of two >= 4 (4, 8, 16, 32: one stride-2 "
            "convolution per factor of 2); use stem='patch' for this patch size."
        )
    if embed_dim <= 0:
        raise ValueError(f"embed_dim must be > 0, got {embed_dim}.")
    k = patch_size.bit_length() - 1
    return tuple(
        max(MIN_WIDTH, math.ceil(embed_dim / 2 ** (k - 1 - i) / WIDTH_MULTIPLE) * WIDTH_MULTIPLE) for i in range(k)
    )


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of each pixel, ``[B, C, H, W] -> [B, C, H, W]``.

    Not BatchNorm: the target encoder follows the online one by an EMA of parameters, so running
    statistics (buffers) would stay at their init there. Not GroupNorm(1, C) either: its statistics
    run over the whole image, so every token would depend on every pixel (the target blocks' too)
    and on the image size; per pixel, a token depends on its receptive field only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNormAct(nn.Module):
    """A stride-2 3x3 convolution (padding 1, no bias: the norm removes it), :class:`LayerNorm2d`,
    GELU: ``[B, C, H, W] -> [B, C', H / 2, W / 2]``."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1, bias=False)
        self.norm = LayerNorm2d(out_channels, eps=1e-6)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class ConvStem(nn.Module):
    """Xiao et al.'s convolutional stem on the patch grid: ``[B, C, H, W] -> [B, N, D]``,
    ``N = (H / P) * (W / P)`` row-major, as :class:`~ijepa.nn.patch.PatchEmbed`'s.

    ``P = 2^k`` (``k >= 2``): ``k`` :class:`ConvNormAct` of :func:`stem_widths` channels, then a 1x1
    convolution to ``embed_dim``. Token ``(r, c)`` sees pixel rows ``P r - (P - 1) .. P r + P - 1``
    (columns alike): its own patch and up to ``P - 1`` pixels of the patches above and to the left,
    since each stride-2 convolution's window reaches one pixel back. The weights do not depend on
    the image size (only the grid does), so a checkpoint moves to another ``image_size`` as a patch
    embedding's does; not to another ``patch_size`` (another number of convolutions).

    It offers what the encoder and its callers read of a patch embedding: ``grid``,
    ``image_size``, ``patch_size``, ``num_patches``, ``in_channels`` and ``embed_dim``; it has no
    ``proj`` (no kernel to resize or export).

    ``within_patch``: the convolutions run on each ``P x P`` patch alone (``[B * N, C, P, P]``, zero
    padding at its border), so token ``(r, c)`` sees exactly its own patch; the weights are the same
    shapes either way.
    """

    def __init__(
        self, image_size: int, patch_size: int, in_channels: int = 3, embed_dim: int = 192, within_patch: bool = False
    ):
        super().__init__()
        self.within_patch = bool(within_patch)
        widths = stem_widths(patch_size, embed_dim, "conv_in_patch" if within_patch else "conv")
        side = grid_size(image_size, patch_size)
        self.grid = (side, side)
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_patches = side * side
        self.in_channels = in_channels
        self.embed_dim = embed_dim
        self.stages = nn.Sequential(*(ConvNormAct(c_in, c_out) for c_in, c_out in zip((in_channels, *widths), widths)))
        self.pointwise = nn.Conv2d(widths[-1], embed_dim, kernel_size=1)

    def forward(self, images: torch.Tensor, patch_size: int | None = None) -> torch.Tensor:
        if patch_size not in (None, self.patch_size):
            refuse_conv_stem(self, f"a per-call patch_size={patch_size} (FlexiViT, data.train_patch_sizes)")
        if images.dim() != 4:
            raise ValueError(f"images must have shape [B, C, H, W], got {tuple(images.shape)}.")
        if images.size(1) != self.in_channels:
            raise ValueError(
                f"images have {images.size(1)} channels, the conv stem expects in_channels={self.in_channels}."
            )
        h, w = images.shape[-2:]
        if (h, w) != (self.image_size, self.image_size):
            raise ValueError(
                f"images are {h}x{w}, the model was built for image_size={self.image_size} "
                f"(resize the data or rebuild the model)."
            )
        if self.within_patch:  # [B, C, H, W] -> [B * N, C, P, P], row-major patches -> [B * N, D, 1, 1]
            b, c, p = images.size(0), self.in_channels, self.patch_size
            rows, cols = self.grid
            patches = images.reshape(b, c, rows, p, cols, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, p, p)
            return self.pointwise(self.stages(patches)).reshape(b, rows * cols, self.embed_dim)
        return self.pointwise(self.stages(images)).flatten(2).transpose(1, 2)  # [B, D, H', W'] -> [B, N, D]


def refuse_conv_stem(embedding: nn.Module, what: str) -> None:
    """Raise ValueError if ``embedding`` is a :class:`ConvStem`: ``what`` (the feature, and the
    option that asks for it) needs the patch projection's kernel, which the stem does not have."""
    if isinstance(embedding, ConvStem):
        raise ValueError(
            f"{what} needs a patch projection's kernel, and this encoder has a convolutional stem "
            "(model.stem: conv or conv_in_patch), which has none: only stem='patch' encoders can."
        )
