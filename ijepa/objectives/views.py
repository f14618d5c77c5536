"""Views: what the context encoder sees, and what ties two views of one image together.

* :class:`Recolour`: each mask row's copy of an image gets its own photometric change before the
  context encoder (channel permutation, per-channel gain, grayscale, brightness, contrast); the
  target encoder sees the original. Asymmetric on purpose: the same change on both branches
  leaves the prediction task as it was and, measured for I-JEPA, hurts.
* :class:`ViewInvariance`: with two or more mask rows per image (``data.masks_per_image``), the
  pooled context embeddings of an image's rows are pulled together (VICReg's invariance term,
  on I-JEPA's context views).

Both act on batched tensors inside the step (on the accelerator), not in the data workers.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F

from ijepa.nn.checks import check_range
from ijepa.objectives.base import Objective
from ijepa.regularizers import Projector
from ijepa.step import StepOutput

INVARIANCE_LOSSES = ("mse", "cosine")


def recolour(
    images: torch.Tensor,
    permute: float = 1.0,
    gain: tuple[float, float] = (0.6, 1.4),
    grayscale: float = 0.2,
    brightness: float = 0.2,
    contrast: float = 0.2,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Each image of ``images [N, C, ...]`` (normalised tensors; clips' frames alike) recoloured
    on its own: with probability ``permute`` its channels in a random order; each channel times a
    gain drawn from ``gain``; with probability ``grayscale`` every channel replaced by their mean;
    its contrast scaled around its own mean by ``1 + u * contrast`` and ``u * brightness`` added,
    ``u`` uniform in [-1, 1]. Channel permutation and grayscale need ``C > 1``."""
    n, c = images.shape[:2]
    ones = (1,) * (images.dim() - 2)
    device, dtype = images.device, images.dtype

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, device=device, dtype=dtype, generator=generator)

    x = images
    if c > 1 and permute > 0:
        order = torch.argsort(uniform(n, c), dim=1)
        keep = torch.arange(c, device=device).expand(n, c)
        order = torch.where((uniform(n) < permute)[:, None], order, keep)
        x = x.gather(1, order.view(n, c, *ones).expand_as(x))
    low, high = gain
    x = x * (low + (high - low) * uniform(n, c)).view(n, c, *ones)
    if c > 1 and grayscale > 0:
        gray = (uniform(n) < grayscale).view(n, 1, *ones)
        x = torch.where(gray, x.mean(dim=1, keepdim=True).expand_as(x), x)
    if contrast > 0:
        mean = x.mean(dim=tuple(range(1, x.dim())), keepdim=True)
        x = (x - mean) * (1 + contrast * (2 * uniform(n) - 1)).view(n, 1, *ones) + mean
    if brightness > 0:
        x = x + brightness * (2 * uniform(n) - 1).view(n, 1, *ones)
    return x


class Recolour(Objective):
    """Asymmetric recolouring: every mask row's copy of an image (``[R * B, C, ...]``) gets its own
    photometric change (:func:`recolour`) before the context encoder; the target encoder sees the
    batch's images unchanged, so the context must predict the original's features. The change acts
    on the normalised tensors: a gain scales a channel's deviation from the data set's mean.

    Args:
        permute: probability of a random channel order (0..1).
        gain: per-channel gain range ``[low, high]`` (0 < low <= high).
        grayscale: probability of replacing the channels by their mean (0..1).
        brightness: half-width of the added offset (>= 0, in normalised units).
        contrast: half-width of the contrast factor around 1 (0..1).
    """

    def __init__(
        self,
        permute: float = 1.0,
        gain: tuple[float, float] = (0.6, 1.4),
        grayscale: float = 0.2,
        brightness: float = 0.2,
        contrast: float = 0.2,
    ):
        check_range(permute, "Recolour permute", 0, 1)
        check_range(grayscale, "Recolour grayscale", 0, 1)
        check_range(brightness, "Recolour brightness", 0)
        check_range(contrast, "Recolour contrast", 0, 1)
        gain = tuple(float(g) for g in gain)
        if len(gain) != 2 or not 0 < gain[0] <= gain[1]:
            raise ValueError(f"Recolour gain must be [low, high] with 0 < low <= high, got {list(gain)}.")
        super().__init__(
            permute=permute, gain=list(gain), grayscale=grayscale, brightness=brightness, contrast=contrast
        )
        self.permute, self.gain, self.grayscale = float(permute), gain, float(grayscale)
        self.brightness, self.contrast = float(brightness), float(contrast)

    def context_view(self, images: torch.Tensor, step: int) -> torch.Tensor:
        if not self.training:  # validation scores the step as trained, on the images themselves
            return images
        return recolour(images, self.permute, self.gain, self.grayscale, self.brightness, self.contrast)

    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        return loss, {}


def pooled_rows(context: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Each mask row's mean real context token: ``[R * B, Kc, D] -> [R * B, D]``."""
    if mask is None:
        return context.mean(dim=1)
    weights = mask.to(context.dtype)[..., None]
    return (context * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1)


def invariance_loss(views: torch.Tensor, kind: str = "mse") -> torch.Tensor:
    """The mean over every pair of views ``views [R, B, E]`` (``R >= 2``) of ``kind``: the mean
    squared difference (``mse``) or ``1 - cosine similarity`` (``cosine``), averaged over images."""
    terms = []
    for a, b in itertools.combinations(range(views.size(0)), 2):
        if kind == "mse":
            terms.append(F.mse_loss(views[a], views[b]))
        else:
            terms.append((1 - F.cosine_similarity(views[a], views[b], dim=-1)).mean())
    return torch.stack(terms).mean()


class ViewInvariance(Objective):
    """View invariance: the pooled context embeddings of one image's ``R`` mask rows (``R =
    data.masks_per_image >= 2``, each a different context, recoloured on its own with
    :class:`Recolour`) are pulled together, optionally through a projector. The loss becomes
    ``loss + weight * term``, ``term`` the mean over pairs of views of the MSE or ``1 - cosine``
    (:func:`invariance_loss`), logged as ``train/view_invariance``. Its gradient reaches the
    context encoder (and the projector) only. An invariance term alone collapses the pooled
    features: keep the weight light, or pair it with the variance-covariance regulariser
    (``ijepa.regularizers.VarianceCovariance`` with ``input: pooled``) on the same embeddings.

    Args:
        weight: the term's weight (>= 0); 0 switches it off.
        loss: ``mse`` or ``cosine``.
        projector: widths of an MLP between the pooled embeddings and the term (``[]``: none).
    """

    def __init__(self, weight: float = 0.05, loss: str = "mse", projector: list[int] | None = None):
        check_range(weight, "ViewInvariance weight", 0)
        if loss not in INVARIANCE_LOSSES:
            raise ValueError(f"ViewInvariance loss must be one of {INVARIANCE_LOSSES}, got {loss!r}.")
        projector = list(projector or ())
        if any(not isinstance(w, int) or w < 1 for w in projector):
            raise ValueError(f"ViewInvariance projector widths must be positive ints ([]: none), got {projector}.")
        super().__init__(weight=weight, loss=loss, projector=projector)
        self.weight, self.loss, self.widths = float(weight), loss, projector
        self.projector: nn.Module = nn.Identity()

    def build(self, model: nn.Module) -> None:
        if self.widths:
            self.projector = Projector(model.hparams.embed_dim, self.widths)

    def grid_only(self) -> bool:
        return self.weight > 0

    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        if self.weight == 0:
            return loss, {}
        images = out.target_features.size(0)
        views = out.context.size(0) // images
        if views < 2:
            if not self.training:  # validation batches may hold one mask row per image
                return loss, {}
            raise ValueError(
                "ViewInvariance needs two or more context views per image: set data.masks.init_args.masks_per_image "
                f">= 2 (this batch has {views})."
            )
        pooled = self.projector(pooled_rows(out.context, out.context_mask))  # [R * B, E]
        term = invariance_loss(pooled.view(views, images, -1), self.loss)
        return loss + self.weight * term, {"view_invariance": term.detach()}
