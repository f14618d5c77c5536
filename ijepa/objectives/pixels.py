"""A pixel target: the predictor's hidden states at the target positions also predict those
patches' pixels (MAE's norm-pix loss, CAE's pixel head beside a latent one).

With ``latent_weight: 0`` the latent (JEPA) loss leaves the graph and the step is a pixel
reconstruction model from the same masks, encoder and predictor: the I-JEPA paper's MAE-style
baseline, run by the same code (``configs/ablations/pixel_only.yaml``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.nn.checks import check_range
from ijepa.nn.patch import gather_patches
from ijepa.objectives.base import Objective
from ijepa.step import StepOutput, repeat_rows


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[B, C, H, W] -> [B, N, C * p * p]``: each non-overlapping ``p x p`` patch's pixels, in the
    patch embedding's row-major token order (channel, then row, then column within a patch)."""
    b, c, h, w = images.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"images of {h}x{w} do not split into {p}x{p} patches.")
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)


def norm_pix(patches: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """MAE's normalised pixels: each patch ``[..., P]`` minus its mean, over its standard deviation
    (``sqrt(var + eps)``, the unbiased variance as MAE's ``.var()`` computes it)."""
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + eps).sqrt()


class PixelTarget(Objective):
    """A light head (a linear layer, or an MLP of ``hidden_dim``) from the predictor's last hidden
    states at the target positions (``[R * B, M, Kt, Dp]``, before its output projection) to the
    pixels of the target patches, normalised per patch (``norm_pix``, MAE's best) or raw. The loss
    becomes ``latent_weight * jepa_loss + weight * pixel_loss`` (the mean squared error over the
    real target patches, logged ``train/pixel_loss``); ``latent_weight: 0`` is a pixel-only model.
    Images only, at the model's patch size (per-batch FlexiViT patch sizes are refused); grid batches.

    Args:
        weight: the pixel loss's weight (>= 0).
        latent_weight: the JEPA loss's weight (>= 0); 0 drops it (and the predictor's output
            projection gets no gradient).
        norm_pix: normalise each target patch's pixels (mean 0, std 1).
        hidden_dim: the head's hidden width (0: one linear layer).
    """

    def __init__(self, weight: float = 1.0, latent_weight: float = 1.0, norm_pix: bool = True, hidden_dim: int = 0):
        check_range(weight, "PixelTarget weight", 0)
        check_range(latent_weight, "PixelTarget latent_weight", 0)
        check_range(hidden_dim, "PixelTarget hidden_dim", 0)
        if weight == 0 and latent_weight == 0:
            raise ValueError("PixelTarget weight and latent_weight are both 0: the step would have no loss.")
        super().__init__(weight=weight, latent_weight=latent_weight, norm_pix=norm_pix, hidden_dim=hidden_dim)
        self.weight, self.latent, self.norm_pix, self.hidden_dim = (
            float(weight),
            float(latent_weight),
            norm_pix,
            hidden_dim,
        )
        self.head: nn.Module | None = None
        self.patch_size = 0

    def build(self, model: nn.Module) -> None:
        hp = model.hparams
        if hp.num_frames:
            raise ValueError(
                "PixelTarget is for image models (model.num_frames=0): clips' tubelets have no pixel head here."
            )
        width = model.predictor.output_proj.in_features
        pixels = hp.in_channels * hp.patch_size**2
        self.patch_size = hp.patch_size
        if self.hidden_dim:
            self.head = nn.Sequential(nn.Linear(width, self.hidden_dim), nn.GELU(), nn.Linear(self.hidden_dim, pixels))
        else:
            self.head = nn.Linear(width, pixels)

    def needs_hidden(self) -> bool:
        return self.weight > 0

    def latent_weight(self) -> float:
        return self.latent

    def grid_only(self) -> bool:
        return True

    def pixel_targets(self, images: torch.Tensor, target_indices: torch.Tensor) -> torch.Tensor:
        """The target patches' pixels ``[R * B, M, Kt, C p p]`` of ``images [B, C, H, W]``
        (normalised per patch with ``norm_pix``)."""
        rows, blocks, count = target_indices.shape
        pixels = patchify(images.float(), self.patch_size)  # [B, N, C p p]
        if self.norm_pix:
            pixels = norm_pix(pixels)
        pixels = repeat_rows(pixels, rows // images.size(0))
        return gather_patches(pixels, target_indices.flatten(1)).view(rows, blocks, count, -1)

    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        if self.weight == 0:
            return loss, {}
        if out.predictor_hidden is None or out.images is None:
            raise ValueError("PixelTarget needs the step's predictor hidden states and images (grid batches).")
        side = out.images.size(-1) // out.grid[-1]
        if side != self.patch_size:
            raise ValueError(
                f"PixelTarget predicts {self.patch_size}-px patches (model.patch_size); this batch is cut at {side} px "
                "(data.train_patch_sizes): leave per-batch patch sizes off with a pixel target."
            )
        with torch.no_grad():
            targets = self.pixel_targets(out.images, out.target_indices)
        per_value = F.mse_loss(self.head(out.predictor_hidden).float(), targets, reduction="none")
        if out.target_mask is None:
            term = per_value.mean()
        else:
            weights = out.target_mask.to(per_value.dtype)[..., None]
            term = (per_value * weights).sum() / (weights.sum() * per_value.size(-1))
        return loss + self.weight * term, {"pixel_loss": term.detach()}
