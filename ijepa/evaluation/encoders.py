"""The frozen encoder an evaluation reads: from an ``ijepa fit`` checkpoint (or a weights-only
``ijepa convert ... ckpt``), a Hugging Face ``IJepaModel`` folder, or raw pixels as a baseline.

Every kind answers the same two questions, so the protocols never ask which kind they hold:
:meth:`FrozenEncoder.block_means` (mean-pooled, normed outputs of the last blocks, what linear
heads, logistic regression and k-NN read) and :meth:`FrozenEncoder.tokens` (every token of the
last block, what the attentive probe reads).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from ijepa.interop.encoder import load_encoder
from ijepa.interop.huggingface import load_hf
from ijepa.nn.vit import VisionTransformer

PIXELS = "pixels"  # the checkpoint value that evaluates raw pixels


class FrozenEncoder(nn.Module):
    """An encoder in eval mode without gradients. ``depth`` blocks of width ``width``; images
    ``[B, 3, image_size, image_size]``."""

    depth: int
    width: int
    image_size: int

    @torch.no_grad()
    def block_means(self, images: torch.Tensor, last_blocks: int) -> torch.Tensor:
        """``[B, 3, H, W] -> [B, last_blocks, D]``: each of the last blocks' normed outputs,
        averaged over the tokens (oldest block first)."""
        raise NotImplementedError

    @torch.no_grad()
    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W] -> [B, K, D]``: the last block's normed output at every token."""
        raise NotImplementedError


class ViTEncoder(FrozenEncoder):
    """A trained :class:`~ijepa.nn.vit.VisionTransformer`."""

    def __init__(self, network: VisionTransformer):
        super().__init__()
        self.network = network.eval().requires_grad_(False)
        self.depth = len(network.transformer.blocks)
        self.width = network.embed_dim
        self.image_size = network.patch_embed.image_size

    @torch.no_grad()
    def block_means(self, images: torch.Tensor, last_blocks: int) -> torch.Tensor:
        if not 1 <= last_blocks <= self.depth:
            raise ValueError(f"last_blocks must be in 1..{self.depth} (the encoder's depth), got {last_blocks}.")
        outputs = self.network.block_outputs(images, last_blocks)
        return torch.stack([output.mean(dim=1) for output in outputs], dim=1)

    @torch.no_grad()
    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images)


class PixelEncoder(FrozenEncoder):
    """Raw pixels as features, the floor every encoder should clear: the pooled feature is the
    whole (normalised) image flattened, ``[B, 1, 3 H W]``; the tokens are its patches,
    ``[B, (H/p)^2, 3 p p]``. One block."""

    def __init__(self, image_size: int, patch_size: int):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size {patch_size} must divide image_size {image_size} for the pixel baseline.")
        self.patch_size, self.image_size, self.depth = patch_size, image_size, 1
        self.width = 3 * image_size * image_size

    @torch.no_grad()
    def block_means(self, images: torch.Tensor, last_blocks: int) -> torch.Tensor:
        if last_blocks != 1:
            raise ValueError(f"last_blocks must be 1 for raw pixels (one 'block'), got {last_blocks}.")
        return images.flatten(1).unsqueeze(1)

    @torch.no_grad()
    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        patches = images.unfold(2, p, p).unfold(3, p, p)  # [B, C, H/p, W/p, p, p]
        return patches.permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)


def file_digest(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (names and contents, in sorted order)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def open_encoder(
    checkpoint: str, encoder: str = "target", image_size: int | None = None, patch_size: int = 16
) -> tuple[FrozenEncoder, dict]:
    """``(frozen encoder, description)`` of ``checkpoint``: an ``ijepa fit`` checkpoint, a
    weights-only conversion, a Hugging Face ``IJepaModel`` folder, or ``pixels``. The description
    (path, SHA-256, format, encoder) goes into the results file and keys the feature cache.
    ``image_size`` / ``patch_size`` only size the pixel baseline."""
    if encoder not in ("target", "online"):
        raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
    if checkpoint == PIXELS:
        if image_size is None:
            raise ValueError("checkpoint=pixels needs data.image_size (the pixel baseline has no size of its own).")
        frozen = PixelEncoder(image_size, patch_size)
        return frozen, {"path": PIXELS, "sha256": None, "format": PIXELS, "encoder": None}
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint={checkpoint!r} does not exist.")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"checkpoint={checkpoint!r} is a folder without config.json: neither an ijepa checkpoint nor an "
                "exported Hugging Face IJepaModel folder (ijepa convert ... hf)."
            )
        network, kind = load_hf(path), "hf"
        if encoder != "target":
            raise ValueError("encoder=online: a Hugging Face folder holds one encoder (the one it was exported from).")
    else:
        try:
            network, kind = load_encoder(path, encoder), "ijepa"
        except ValueError as error:
            raise ValueError(
                f"checkpoint={checkpoint!r} is not an ijepa checkpoint or an exported encoder ({error}). Official "
                "I-JEPA checkpoints: convert them first (ijepa convert SOURCE DEST ckpt, docs/interop.md)."
            ) from error
    if network.is_clip_encoder:
        raise ValueError(f"checkpoint={checkpoint!r} holds a clip encoder; ijepa eval evaluates image encoders.")
    return ViTEncoder(network), {
        "path": str(path.resolve()),
        "sha256": file_digest(path),
        "format": kind,
        "encoder": encoder,
    }
