"""Batching for pretraining: stack samples and sample each batch's masks, in the DataLoader's
worker processes."""

from __future__ import annotations

import torch
from torch.utils.data import default_collate

from ijepa.data.batch import ClipBatch, DenseBatch, GridBatch, LabeledBatch, LabeledClipBatch
from ijepa.data.sampling import mix_seed
from ijepa.masks import MaskSampler, context_padding_mask
from ijepa.nn.checks import check_indices


class MaskCollator:
    """DataLoader ``collate_fn``: stacks ``(image, label)`` samples (or ``(clip, label,
    frame_times)``) and samples masks for the batch.

    Returns a :class:`~ijepa.data.batch.GridBatch` (clips: a :class:`~ijepa.data.batch.ClipBatch`)
    with ``images [B, C, H, W]`` (clips ``[B, C, T, H, W]``), ``labels [B]``, ``context_indices
    [R * B, Kc]``, ``target_indices [R * B, M, Kt]``, with the sampler's ``context_policy="pad"`` or
    ``"static"`` also ``context_mask [R * B, Kc]`` (True for real context tokens), with ``"static"``
    also ``target_mask [R * B, M, Kt]`` (True for real target tokens), and, for clips that carry
    them, ``frame_times [B, T]`` (seconds). With ``masks_per_image = R > 1`` row ``r * B + i`` of the
    mask tensors is the ``r``-th mask set of image ``i`` (the first ``B`` rows are an ordinary
    batch's masks), so one target-encoder pass serves ``R`` predictions per image (data2vec 2.0's
    multi-mask). Runs in the DataLoader's worker processes. Samples whose last
    element is a per-sample seed (an ``int`` after the label, from
    :class:`ijepa.data.sampling.SeededSamples`) seed the batch's masks from all of them, so masks
    never depend on the worker or the global RNG.

    ``patch_samplers`` (FlexiViT): ``{patch_size: sampler on that patch size's grid}``. Each batch
    then draws its patch size uniformly from the keys (from the batch's seed), samples its masks
    on that grid and says which in ``patch_size``; the model cuts its patches to match.
    """

    def __init__(
        self,
        sampler: MaskSampler,
        masks_per_image: int = 1,
        patch_samplers: dict[int, MaskSampler] | None = None,
    ):
        if masks_per_image < 1:
            raise ValueError(f"masks_per_image must be >= 1, got {masks_per_image}.")
        if patch_samplers is not None and not patch_samplers:
            raise ValueError("patch_samplers must name at least one patch size, or be None.")
        self.sampler = sampler
        self.masks_per_image = masks_per_image
        self.patch_samplers = dict(sorted(patch_samplers.items())) if patch_samplers else None

    def __call__(self, samples: list) -> GridBatch:
        samples, generator = split_seeds(samples)
        labeled = labeled_collate(samples)
        sampler, patch_size = self.sampler, None
        if self.patch_samplers is not None:
            sizes = list(self.patch_samplers)
            patch_size = sizes[int(torch.randint(len(sizes), (1,), generator=generator))]
            sampler = self.patch_samplers[patch_size]
        context_indices, target_indices = sampler(self.masks_per_image * len(labeled), generator)
        # The range check the model skips in its hot path, here on CPU tensors (no device sync).
        check_indices(context_indices, sampler.num_patches, "context_indices")
        check_indices(target_indices.flatten(1), sampler.num_patches, "target_indices")
        return masked_batch(
            labeled.images, sampler, context_indices, target_indices, labeled.labels, patch_size, labeled.frame_times
        )


def split_seeds(samples: list) -> tuple[list, torch.Generator | None]:
    """Samples without their trailing per-sample seeds, and a generator seeded from all of them
    (None when the samples carry no seed): a batch's masks then depend on its samples only."""
    if len(samples[0]) > 2 and isinstance(samples[0][-1], int):
        generator = torch.Generator().manual_seed(mix_seed(*(sample[-1] for sample in samples)))
        return [sample[:-1] for sample in samples], generator
    return samples, None


def masked_batch(
    images: torch.Tensor,
    sampler: MaskSampler,
    context_indices: torch.Tensor,
    target_indices: torch.Tensor,
    labels: torch.Tensor | None = None,
    patch_size: int | None = None,
    frame_times: torch.Tensor | None = None,
) -> GridBatch:
    """The masked batch of ``images`` (clips ``[B, C, T, H, W]``: a :class:`ClipBatch`) with the
    masks ``sampler`` drew and what its context policy adds: ``context_mask`` (``pad``,
    ``static``) and ``target_mask`` (``static``: blocks padded to one size)."""
    context_mask = target_mask = None
    if sampler.context_policy in ("pad", "static"):
        context_mask = context_padding_mask(context_indices)
    if sampler.context_policy == "static":
        target_mask = context_padding_mask(target_indices.flatten(0, 1)).view_as(target_indices)
    masks = dict(context_mask=context_mask, target_mask=target_mask, patch_size=patch_size)
    if images.dim() == 5:
        return ClipBatch(images, context_indices, target_indices, labels, **masks, frame_times=frame_times)
    return GridBatch(images, context_indices, target_indices, labels, **masks)


def labeled_collate(samples: list) -> LabeledBatch:
    """Stack ``(image, label)`` or ``(clip, label[, frame_times])`` samples into a
    :class:`LabeledBatch` (clips: a :class:`LabeledClipBatch`): the labelled collate of the
    probes' loaders and of ``ijepa eval``. Dense samples (a dict target) go to
    :func:`dense_collate`."""
    if len(samples[0]) > 1 and isinstance(samples[0][1], dict):
        return dense_collate(samples)
    columns = default_collate(samples)
    if columns[0].dim() == 5:
        # a third column of [B, T] floats is the frame times; anything else after the label (the
        # per-sample seed SeededSamples appends, [B]) is dropped
        times = columns[2] if len(columns) > 2 and columns[2].dim() == 2 else None
        return LabeledClipBatch(columns[0], columns[1], times)
    return LabeledBatch(*columns[:2])


def dense_collate(samples: list) -> DenseBatch:
    """Stack dense samples ``(image, {"label": int, "mask": Mask [H, W], "count": int})`` into a
    :class:`~ijepa.data.batch.DenseBatch`: ``images [B, C, H, W]``, ``labels [B]``, ``masks [B, H,
    W]`` (int64) and ``counts [B]`` (int64). Anything after the target (the per-sample seed
    :class:`~ijepa.data.sampling.SeededSamples` appends) is dropped."""
    if not samples:
        raise ValueError("dense_collate needs at least one sample.")
    images, labels, masks, counts = [], [], [], []
    for index, sample in enumerate(samples):
        if len(sample) < 2 or not isinstance(sample[1], dict):
            raise TypeError(
                f"dense_collate: sample {index} must be (image, {{'label', 'mask', 'count'}}), "
                f"got a {type(sample).__name__} of {len(sample)} element(s)."
            )
        image, target = sample[0], sample[1]
        missing = {"label", "mask", "count"} - set(target)
        if missing:
            raise KeyError(f"dense_collate: sample {index}'s target lacks {sorted(missing)}.")
        images.append(torch.as_tensor(image).as_subclass(torch.Tensor))
        masks.append(torch.as_tensor(target["mask"]).as_subclass(torch.Tensor).to(torch.int64))
        labels.append(int(target["label"]))
        counts.append(int(target["count"]))
    shapes = {tuple(mask.shape) for mask in masks}
    if len(shapes) > 1 or masks[0].dim() != 2:
        raise ValueError(f"dense_collate: masks must all be [H, W] of one size, got shapes {sorted(shapes)}.")
    return DenseBatch(
        torch.stack(images),
        torch.tensor(labels, dtype=torch.int64),
        torch.stack(masks),
        torch.tensor(counts, dtype=torch.int64),
    )
