"""Typed batches: each collator returns its record with the documented shapes, Lightning moves
every tensor field to the device, the DataLoader pins them, and the step reads them by name."""

import re
import warnings
from dataclasses import fields

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, TINY_MODEL
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader
from torch.utils.data._utils.pin_memory import pin_memory

from ijepa.data.batch import ClipBatch, GridBatch, LabeledBatch, LabeledClipBatch, PackedBatch
from ijepa.data.collate import MaskCollator
from ijepa.data.datamodule import labeled_collate
from ijepa.data.native import NativeSizeCrop, PackedMaskCollator
from ijepa.masks import MultiBlockMaskSampler, SpatioTemporalMaskSampler
from ijepa.module import IJEPA
from ijepa.nn.packing import Packed
from ijepa.nn.patch import gather_patches
from ijepa.step import StepOutput


def images(count: int, size: int = 32) -> list:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(3, size, size, generator=generator), i % 3, 100 + i) for i in range(count)]


def clips(count: int, times: bool = True) -> list:
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(count):
        clip = torch.randn(3, 4, 16, 16, generator=generator)
        samples.append((clip, i % 2, torch.arange(4) * 0.1, 7 + i) if times else (clip, i % 2, 7 + i))
    return samples


def packed_batch(count: int = 5) -> tuple[list, PackedBatch]:
    torch.manual_seed(0)
    crop = NativeSizeCrop(8, (3, 6))
    samples = [(crop(torch.randn(3, 48, 48)), i % 3, 1000 + i) for i in range(count)]
    masks = dict(num_target_blocks=3, target_scale=(0.15, 0.2), min_keep=2)
    return samples, PackedMaskCollator(8, (6, 6), 72, **masks)(samples)


def tensors(record) -> dict[str, torch.Tensor]:
    """Every tensor of a record by its path, ``full.values`` for a nested Packed's."""
    found = {}
    for field in fields(record):
        value = getattr(record, field.name)
        if isinstance(value, Packed):
            found |= {f"{field.name}.{k}": v for k, v in tensors(value).items()}
        elif torch.is_tensor(value):
            found[field.name] = value
    return found


@pytest.mark.parametrize("policy", ["thin", "pad", "static"])
@pytest.mark.parametrize("repeats", [1, 2])
def test_the_mask_collator_returns_a_grid_batch_with_the_documented_shapes(policy, repeats):
    sampler = MultiBlockMaskSampler(4, min_keep=2, context_policy=policy)
    batch = MaskCollator(sampler, masks_per_image=repeats)(images(5))
    rows = repeats * 5
    assert type(batch) is GridBatch and len(batch) == 5
    assert batch.images.shape == (5, 3, 32, 32) and batch.labels.tolist() == [0, 1, 2, 0, 1]
    assert batch.context_indices.shape[0] == rows and batch.context_indices.dim() == 2
    rows_, blocks, _ = batch.target_indices.shape
    assert (rows_, blocks) == (rows, 4)
    assert batch.patch_size is None and batch.frame_times is None
    if policy == "thin":
        assert batch.context_mask is None and batch.target_mask is None
    else:
        assert batch.context_mask.shape == batch.context_indices.shape and batch.context_mask.dtype == torch.bool
    if policy == "static":
        assert batch.target_mask.shape == batch.target_indices.shape and batch.target_mask.dtype == torch.bool
    elif policy == "pad":
        assert batch.target_mask is None


def test_a_flexivit_batch_names_its_patch_size_as_an_int():
    samplers = {p: MultiBlockMaskSampler(32 // p, min_keep=1) for p in (4, 8, 16)}
    collate = MaskCollator(MultiBlockMaskSampler(4), patch_samplers=samplers)
    sizes = [collate([(image, label, seed + 10 * k) for image, label, seed in images(3)]).patch_size for k in range(8)]
    assert set(sizes) <= {4, 8, 16} and len(set(sizes)) > 1 and all(type(size) is int for size in sizes)


def test_clips_collate_to_clip_records_with_their_frame_times():
    sampler = SpatioTemporalMaskSampler(2, 4, num_target_blocks=2, target_scale=(0.15, 0.2))
    batch = MaskCollator(sampler)(clips(3))
    assert type(batch) is ClipBatch and isinstance(batch, GridBatch)
    assert batch.images.shape == (3, 3, 4, 16, 16) and batch.frame_times.shape == (3, 4)
    assert batch.context_indices.shape[0] == 3 and batch.target_indices.shape[:2] == (3, 2)
    assert MaskCollator(sampler)(clips(3, times=False)).frame_times is None
    labeled = labeled_collate([sample[:3] for sample in clips(3)])
    assert type(labeled) is LabeledClipBatch and labeled.frame_times.shape == (3, 4)
    assert labeled.images.shape == (3, 3, 4, 16, 16) and labeled.labels.shape == (3,)


def test_labeled_collate_returns_a_labeled_batch_of_images():
    batch = labeled_collate([sample[:2] for sample in images(4)])
    assert type(batch) is LabeledBatch and batch.frame_times is None and len(batch) == 4
    assert batch.images.shape == (4, 3, 32, 32) and batch.labels.tolist() == [0, 1, 2, 0]


def test_the_packed_collator_returns_a_packed_batch_with_the_documented_shapes():
    samples, batch = packed_batch()
    assert type(batch) is PackedBatch and len(batch) == len(samples) == batch.labels.size(0)
    sequences, slots = batch.full.image_ids.shape
    assert batch.full.values.shape == (sequences, slots, 3 * 8 * 8) and batch.full.positions.shape == (sequences, slots)
    assert batch.context.values.shape[:2] == batch.context.positions.shape == batch.context.image_ids.shape
    assert batch.pred.values is None
    layout = batch.pred.positions.shape
    assert batch.pred.image_ids.shape == batch.pred.groups.shape == layout
    assert batch.pred_context_slot.shape == batch.pred_target_slot.shape == layout
    # every patch of every image once in full, and each image's targets point into it
    assert int(batch.full.real.sum()) == sum((s[0].size(-2) // 8) * (s[0].size(-1) // 8) for s in samples)
    assert int(batch.pred_target_slot.max()) < sequences * slots


def all_records() -> list:
    sampler = MultiBlockMaskSampler(4, min_keep=2, context_policy="static")
    clip_sampler = SpatioTemporalMaskSampler(2, 4, num_target_blocks=2, target_scale=(0.15, 0.2))
    return [
        MaskCollator(sampler)(images(4)),
        MaskCollator(clip_sampler)(clips(2)),
        packed_batch()[1],
        labeled_collate([sample[:2] for sample in images(2)]),
        labeled_collate([sample[:3] for sample in clips(2)]),
    ]


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_lightnings_batch_transfer_moves_every_tensor_field_of_each_record(record):
    moved = LightningModule().transfer_batch_to_device(record, torch.device("meta"), 0)
    assert type(moved) is type(record)
    before, after = tensors(record), tensors(moved)
    assert after.keys() == before.keys() and len(after) >= 2
    assert all(t.device.type == "meta" for t in after.values())
    assert all(t.device.type == "cpu" for t in before.values())  # the collated record is left as it was
    assert all(after[k].shape == before[k].shape and after[k].dtype == before[k].dtype for k in before)
    if isinstance(record, GridBatch):
        assert moved.patch_size == record.patch_size


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_the_dataloaders_pinning_pins_every_tensor_field_of_each_record(record, monkeypatch):
    # torch pins objects that have a pin_memory method; a CPU-only machine cannot pin, so each
    # tensor's pin_memory is replaced by a copy that says it was pinned
    pinned = set()

    def fake_pin(tensor, device=None):
        copy = tensor.clone()
        pinned.add(id(copy))
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    result = pin_memory(record)  # what the DataLoader's pin-memory thread calls on each batch
    assert type(result) is type(record)
    after = tensors(result)
    assert after.keys() == tensors(record).keys() and all(id(t) in pinned for t in after.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA device")
def test_a_pinned_dataloader_hands_over_records_in_page_locked_memory():
    sampler = MultiBlockMaskSampler(4, min_keep=2, context_policy="pad")
    loader = DataLoader(images(8), batch_size=4, collate_fn=MaskCollator(sampler), pin_memory=True)
    batch = next(iter(loader))
    assert type(batch) is GridBatch and all(t.is_pinned() for t in tensors(batch).values())


def test_the_grid_step_reads_the_record_and_gives_the_independent_loss():
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL).eval()
    batch = MaskCollator(MultiBlockMaskSampler(4, min_keep=2), masks_per_image=2)(images(4))
    with torch.no_grad():
        out = model.predict(batch)
        loss, features = model.jepa_step(batch)
        # the same math, written out from the record's fields: R = 2 mask sets on one target pass
        full = model.target_encoder(batch.images)
        normed = F.layer_norm(full, full.shape[-1:], eps=1e-5).repeat(2, 1, 1)
        targets = gather_patches(normed, batch.target_indices.flatten(1)).view(*batch.target_indices.shape, -1)
        context = model.encoder(batch.images.repeat(2, 1, 1, 1), batch.context_indices)
        predictions = model.predictor(context, batch.context_indices, batch.target_indices)
    assert isinstance(out, StepOutput) and out.context_pooled is None and out.context_mask is None
    assert out.predictions.shape == out.targets.shape == (8, 4, batch.target_indices.size(-1), 32)
    assert torch.equal(out.targets, targets) and torch.equal(out.predictions, predictions)
    assert torch.equal(out.context, context) and torch.equal(features, full)
    assert torch.equal(loss, F.smooth_l1_loss(predictions, targets))


def test_the_packed_step_returns_a_step_output_with_pooled_context():
    samples, batch = packed_batch()
    torch.manual_seed(0)
    model = IJEPA(**{**TINY_MODEL, "image_size": 48, "predictor_mode": "one_pass"}).eval()
    with torch.no_grad():
        out = model.predict(batch)
        pooled = model.pooled_target_features(batch)
    targets = int((batch.pred_target_slot >= 0).sum())
    assert isinstance(out, StepOutput) and out.target_mask is None
    assert out.predictions.shape == out.targets.shape == (targets, 32)
    assert out.context.shape == (*batch.context.image_ids.shape, 32)
    assert torch.equal(out.context_mask, batch.context.real)
    assert out.context_pooled.shape == out.target_features.shape == (len(samples), 32)
    torch.testing.assert_close(pooled, out.target_features)


def test_no_code_asks_a_batch_dict_which_keys_it_holds():
    pattern = re.compile(r'batch\[\s*"|batch\.get\(|"full_values"|out\.get\(|\bin batch\b')
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "ijepa").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_validation_weighs_each_batch_by_its_images_without_guessing(make_datamodule, make_trainer):
    # batches of 16, 16 and 8 images; a thin batch has no context_mask, a None field Lightning
    # would call an ambiguous batch size if the step did not say it
    data = make_datamodule(val_size=40, batch_size=16)
    torch.manual_seed(0)
    model = IJEPA(**TINY_MODEL)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*infer the `batch_size`.*")
        logged = make_trainer().validate(model, datamodule=data, verbose=False)[0]["val/loss"]
    data.setup("validate")
    with torch.no_grad():
        losses = [(model.jepa_loss(batch), len(batch)) for batch in data.val_dataloader()]
    assert [size for _, size in losses] == [16, 16, 8]
    expected = sum(loss * size for loss, size in losses) / 40
    assert logged == pytest.approx(float(expected), rel=1e-6)


def test_a_dict_batch_is_refused_with_the_record_to_build():
    model = IJEPA(**TINY_MODEL)
    batch = MaskCollator(MultiBlockMaskSampler(4, min_keep=2))(images(2))
    legacy = {"images": batch.images, "context_indices": batch.context_indices, "target_indices": batch.target_indices}
    with pytest.raises(
        TypeError, match=r"GridBatch, ClipBatch or PackedBatch.*got a dict.*GridBatch\(images, context_indices"
    ):
        model.jepa_loss(legacy)
