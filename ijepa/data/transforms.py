"""Pixel normalisation shared by every data source and by the pictures that undo it, and the
evaluation transform.

Dense samples: every transform here also takes ``(image, target)``, ``target`` a dict holding a
``tv_tensors.Mask`` (:class:`~ijepa.data.shapes.ShapesDataset` with ``dense=True``, image folders
with ``masks``), and returns ``(image, target)`` with the mask resized and cropped as the image
(nearest: class ids are never interpolated) and left unnormalised, as torchvision's v2
transforms do when called with both."""

from __future__ import annotations

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ClipToTensor:
    """``uint8 [T, 3, H, W]`` clip -> normalised float ``[3, T, H, W]`` (channels first, as Conv3d
    takes them)."""

    def __init__(self):
        self.mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)

    def __call__(self, clip: torch.Tensor) -> torch.Tensor:
        return ((clip.float() / 255 - self.mean) / self.std).permute(1, 0, 2, 3).contiguous()


class ToNormalizedFloat:
    """``uint8 [3, H, W]`` image (or a float one in [0, 1]) -> ImageNet-normalised float32, bit for
    bit what ``v2.ToDtype(torch.float32, scale=True)`` then ``v2.Normalize`` give (the same tensor
    operations), without their per-call dispatch, which cost more than the arithmetic on small
    images: a DataLoader worker then competes less with the training step for the cores."""

    def __init__(self, mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD):
        self.mean_std = (tuple(mean), tuple(std))
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, image: torch.Tensor, *rest):
        """The normalised image; with more arguments (``(image, target)``, a dense sample),
        ``(normalised image, *rest)``, ``rest`` (the mask among it) unchanged."""
        if rest:
            return (self(image), *rest)
        image = image.as_subclass(torch.Tensor)
        if image.dtype == torch.uint8:
            image = image.to(torch.float32).mul_(1.0 / 255)
        elif image.is_floating_point():
            image = image.to(torch.float32)
        else:
            raise TypeError(f"ToNormalizedFloat takes uint8 or float images, got {image.dtype}.")
        return image.sub(self.mean).div_(self.std)

    def __repr__(self) -> str:
        return f"ToNormalizedFloat(mean={self.mean_std[0]}, std={self.mean_std[1]})"


class ResizeCentreCrop:
    """``v2.Resize(size)`` then ``v2.CenterCrop(size)``, returning an image already
    ``size x size`` as it is (what those two return for it) without calling them."""

    def __init__(self, size: int):
        self.size = size
        self.resize = v2.Resize(size, antialias=True)
        self.crop = v2.CenterCrop(size)

    def __call__(self, image: torch.Tensor, *rest):
        """The resized, cropped image; with more arguments (``(image, target)``, a dense sample)
        the tuple with the masks in ``rest`` resized and cropped alike (nearest)."""
        if isinstance(image, torch.Tensor) and tuple(image.shape[-2:]) == (self.size, self.size):
            if not rest:
                return image
            if all(tuple(mask.shape[-2:]) == (self.size, self.size) for mask in _masks(rest)):
                return (image, *rest)
        if rest:  # the v2 transforms refuse a mask whose size is not its image's
            return self.crop(*self.resize(image, *rest))
        return self.crop(self.resize(image))

    def __repr__(self) -> str:
        return f"ResizeCentreCrop(size={self.size})"


def _masks(values) -> list[torch.Tensor]:
    """The ``tv_tensors.Mask`` leaves of nested tuples, lists and dicts."""
    if isinstance(values, tv_tensors.Mask):
        return [values]
    if isinstance(values, dict):
        values = list(values.values())
    if isinstance(values, (tuple, list)):
        return [mask for value in values for mask in _masks(value)]
    return []


def eval_transform(size: int) -> v2.Compose:
    """The deterministic evaluation transform of the probes, ``predict`` and ``ijepa eval``: resize
    the short side to ``size``, centre crop, ImageNet-normalise; ``uint8`` or PIL image ->
    ``float32 [3, size, size]``. Called as ``transform(image, target)`` (a dense sample) it
    returns ``(image, target)`` with ``target``'s mask resized (nearest) and cropped alike, its
    class ids unchanged."""
    return v2.Compose([v2.ToImage(), ResizeCentreCrop(size), ToNormalizedFloat(IMAGENET_MEAN, IMAGENET_STD)])


def unnormalize(images: torch.Tensor) -> torch.Tensor:
    """ImageNet-normalised ``[B, 3, H, W]`` (or clips ``[B, 3, T, H, W]``) -> ``[0, 1]``."""
    shape = (1, 3) + (1,) * (images.dim() - 2)
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(shape)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(shape)
    return (images.float() * std + mean).clamp(0, 1)
