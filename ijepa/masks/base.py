"""The mask kind: what a batch's context and target patches are, chosen in YAML by ``class_path``
with its own options, exactly as data sources are::

    data:
      masks:
        class_path: ijepa.masks.MultiBlockMasks
        init_args: {target_scale: [0.15, 0.2], min_keep: 4}

A kind holds options only; the grid comes at setup: the DataModule asks :meth:`Masks.sampler`
for each grid it needs (the main grid, each FlexiViT patch size's, a clip's token grid) and
:meth:`Masks.native_sampler` for each native-resolution image. A new mask sampler is one
:class:`Masks` subclass in its own file of ``ijepa/masks/``; the DataModule does not change.
"""

from __future__ import annotations

import abc
import copy
from typing import Protocol

import torch

from ijepa.registry import class_path, concrete_subclasses, from_config, import_modules

Grid = int | tuple[int, int] | tuple[int, int, int]


class MaskSampler(Protocol):
    """What a kind's :meth:`Masks.sampler` returns: ``sampler(batch_size, generator)`` ->
    ``(context_indices [B, Kc], target_indices [B, M, Kt])``, row-major patch indices below
    ``num_patches``, each row sorted, contexts and targets disjoint per image; ``context_policy``
    says how rows of different lengths were made equal (``ijepa.masks.policies``); ``check()``
    fails fast (ValueError) on settings this grid cannot satisfy."""

    num_patches: int
    context_policy: str

    def __call__(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def check(self, tries: int = 8, batch_size: int = 64) -> None: ...


class Masks(abc.ABC):
    """Base class of the mask kinds. Subclasses set ``clips`` (True: for a clip's ``(T, H, W)``
    token grid, which needs ``data.num_frames > 0``; False: for images; None: either) and
    implement :meth:`sampler`. Every option is an attribute of the same name (:meth:`config`
    stores them in checkpoints). ``masks_per_image``, shared by every kind: mask sets sampled per
    pretraining image, each predicted from its own context against one target-encoder pass
    (data2vec 2.0's multi-mask); validation keeps one."""

    clips: bool | None = False

    def __init__(self, masks_per_image: int = 1):
        if int(masks_per_image) != masks_per_image or masks_per_image < 1:
            raise ValueError(f"masks_per_image must be an integer >= 1, got {masks_per_image}.")
        self.masks_per_image = int(masks_per_image)

    @abc.abstractmethod
    def sampler(self, grid: Grid, context_policy: str | None = None) -> MaskSampler:
        """The sampler of these options on ``grid``: a side (square images), ``(height, width)``
        or, for clips, ``(time, height, width)``; ``context_policy`` overrides the kind's own
        where it has one (the static-shape benchmark asks for ``static``)."""

    def native_sampler(self, grid: tuple[int, int], canvas: tuple[int, int]) -> MaskSampler:
        """The sampler of one native-resolution image of ``grid = (h, w)`` patches on the model's
        ``canvas`` (one image per call: contexts are kept whole, nothing is padded)."""
        return self.sampler(grid, context_policy="pad")

    def config(self) -> dict:
        """``{"class_path", "init_args"}``: plain values that rebuild these masks
        (:func:`masks_from_config`), stored in checkpoints instead of the object."""
        return {"class_path": class_path(self), "init_args": copy.deepcopy(vars(self))}

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({args})"


def mask_kinds() -> tuple[type[Masks], ...]:
    """The concrete mask kinds of every module of ``ijepa.masks``, in the order they were defined:
    the registry the CLI's choices, the generated docs and the tests read."""
    import_modules("ijepa.masks")
    return concrete_subclasses(Masks)


def masks_from_config(config: dict | Masks) -> Masks:
    """The mask kind a :meth:`Masks.config` dict describes (a kind itself is returned as is)."""
    return config if isinstance(config, Masks) else from_config(config, Masks)
