"""Linear segmentation heads: mIoU and pixel accuracy equal an independent computation (and
torchmetrics'), the grid is each head's own 1x1 layer on the token map, its loss is the sum of
the heads' own losses, and a grid trained in one pass equals each head trained alone."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassJaccardIndex

from ijepa.classifiers import HeadGridTrainer, product_grid, segmentation
from ijepa.classifiers.segmentation import (
    SegmentationHeadGrid,
    confusion_matrices,
    grid_confusions,
    segmentation_grid_loss,
    segmentation_scores,
    upsample_logits,
)
from ijepa.data.batch import IGNORE_INDEX

CLASSES = 6  # targets in {0, 1, 2, 4}; 3 only predicted; 5 in neither


def brute_force(predictions: np.ndarray, targets: np.ndarray, num_classes: int) -> tuple[float, float, list]:
    """mmseg's definition, pixel by pixel: IoU per class over the whole split, the mean over the
    classes with a non-empty union, and the share of non-ignored pixels predicted right."""
    valid = targets != IGNORE_INDEX
    ious = []
    for c in range(num_classes):
        intersection = union = 0
        for p, t, keep in zip(predictions.ravel(), targets.ravel(), valid.ravel()):
            if keep:
                intersection += int(p == c and t == c)
                union += int(p == c or t == c)
        ious.append(intersection / union if union else None)
    present = [iou for iou in ious if iou is not None]
    accuracy = float((predictions[valid] == targets[valid]).mean())
    return sum(present) / len(present), accuracy, ious


def random_split(seed: int, batches: int = 3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        targets = torch.tensor([0, 1, 2, 4])[torch.randint(4, (2, 6, 5), generator=g)]
        targets[torch.rand(2, 6, 5, generator=g) < 0.2] = IGNORE_INDEX
        predictions = torch.randint(5, (2, 6, 5), generator=g)  # 0..4: 3 is predicted, never a target
        out.append((predictions, targets))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_miou_and_pixel_accuracy_equal_a_brute_force_count_with_ignored_pixels_and_an_absent_class(seed):
    split = random_split(seed)
    confusion = sum(confusion_matrices(p.unsqueeze(0), t, CLASSES)[0] for p, t in split)  # accumulated by batch
    scores = segmentation_scores(confusion)
    predictions = torch.cat([p for p, _ in split]).numpy()
    targets = torch.cat([t for _, t in split]).numpy()
    miou, accuracy, ious = brute_force(predictions, targets, CLASSES)
    assert scores["miou"] == pytest.approx(miou, abs=1e-12)
    assert scores["pixel_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert scores["iou"][5] is None and ious[5] is None  # absent from targets and predictions: not averaged
    assert scores["iou"][3] == 0.0  # predicted, never a target: an IoU of 0, averaged
    assert scores["iou"] == pytest.approx(ious, abs=1e-12)
    assert confusion.sum() == (targets != IGNORE_INDEX).sum()  # ignored pixels count nowhere

    # torchmetrics' macro Jaccard index, accumulated over the same batches, is the same number
    metric = MulticlassJaccardIndex(num_classes=CLASSES, average="macro", ignore_index=IGNORE_INDEX)
    for p, t in split:
        metric.update(p, t)
    assert float(metric.compute()) == pytest.approx(miou, abs=1e-6)


def test_confusion_matrices_are_per_head_and_refuse_a_class_out_of_range():
    predictions, targets = random_split(3, 1)[0]
    other = (predictions + 1) % 5
    both = confusion_matrices(torch.stack([predictions, other]), targets, CLASSES)
    assert torch.equal(both[0], confusion_matrices(predictions[None], targets, CLASSES)[0])
    assert torch.equal(both[1], confusion_matrices(other[None], targets, CLASSES)[0])
    targets[0, 0, 0] = 7
    with pytest.raises(ValueError, match=r"a mask holds class 7, outside 0..5 \(and not 255\)"):
        confusion_matrices(predictions[None], targets, CLASSES)


def test_the_grid_is_each_heads_1x1_layer_on_the_normed_token_map_in_row_major_order():
    grid = SegmentationHeadGrid(5, 3, 4, grid=(2, 3), batch_norm=True, seed=1)
    with torch.no_grad():
        for head in grid.heads:
            head.weight.normal_()
            head.bias.normal_()
    tokens = torch.randn(4, 6, 5)
    logits = grid(tokens)
    assert logits.shape == (4, 4, 3, 2, 3)
    feature_map = tokens.transpose(1, 2).reshape(4, 5, 2, 3)  # token k at row k // 3, column k % 3
    normed = F.batch_norm(feature_map, None, None, training=True, eps=grid.norm.eps)  # per channel over B, h, w
    for h, head in enumerate(grid.heads):
        expected = F.conv2d(normed, head.weight[:, :, None, None], head.bias)
        torch.testing.assert_close(logits[h], expected)
    with pytest.raises(ValueError, match=r"tokens must have shape \[B, 6, D\]"):
        grid(torch.randn(4, 5, 5))


def test_the_grid_loss_is_the_sum_of_each_heads_mean_cross_entropy_on_upsampled_logits():
    logits = torch.randn(3, 2, 4, 2, 2, dtype=torch.float64, requires_grad=True)
    masks = torch.randint(4, (2, 8, 8))
    masks[0, :3] = IGNORE_INDEX
    loss = segmentation_grid_loss(logits, masks)
    (together,) = torch.autograd.grad(loss, logits)
    expected = 0
    for h in range(3):
        up = F.interpolate(logits[h], size=(8, 8), mode="bilinear", align_corners=False)
        alone = F.cross_entropy(up, masks, ignore_index=IGNORE_INDEX)
        expected = expected + alone
        (grad,) = torch.autograd.grad(alone, logits)
        torch.testing.assert_close(together[h], grad[h], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(loss, expected)
    assert upsample_logits(logits, (8, 8)).shape == (3, 2, 4, 8, 8)
    # a batch of ignored pixels only: no loss, not NaN
    assert float(segmentation_grid_loss(logits.detach(), torch.full((2, 8, 8), IGNORE_INDEX))) == 0.0


@pytest.mark.parametrize("scale", [1.0, 300.0], ids=["plain", "underflowing"])
def test_the_chunked_loss_equals_the_reference_across_chunks_non_square_maps_and_logits_that_underflow(
    scale, monkeypatch
):
    monkeypatch.setattr(segmentation, "CHUNK", 5 * 12 * 10 * 2)  # two images a chunk: 3 heads x 3 chunks
    logits = (torch.randn(3, 5, 5, 3, 2, dtype=torch.float64) * scale).requires_grad_()
    masks = torch.randint(5, (5, 12, 10))
    masks[1, 2:5] = IGNORE_INDEX
    loss = segmentation_grid_loss(logits, masks)
    up = F.interpolate(logits.flatten(0, 1), size=(12, 10), mode="bilinear", align_corners=False)
    expected = F.cross_entropy(up, masks.repeat(3, 1, 1), ignore_index=IGNORE_INDEX, reduction="sum") / int(
        (masks != IGNORE_INDEX).sum()
    )
    (grad,) = torch.autograd.grad(loss, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"a mask holds class 5, outside 0..4"):
        segmentation_grid_loss(logits, masks.clamp_max(5) + (masks == 4).long())


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_segmentation_grid_trained_in_one_pass_equals_each_head_trained_alone_from_the_seed(kind):
    lrs, weight_decays = product_grid([1e-3, 1e-1, 1.0], [0.0, 5e-2])
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(12):
        masks = torch.randint(3, (4, 8, 8), generator=g)
        masks[:, 0] = IGNORE_INDEX
        data.append((torch.randn(4, 4, 6, generator=g, dtype=torch.float64), masks))

    def train(count, lrs, weight_decays):
        grid = SegmentationHeadGrid(6, 3, count, grid=(2, 2), batch_norm=True, seed=4).double()
        trainer = HeadGridTrainer([(grid, lambda x: x)], lrs, weight_decays, kind, len(data), 2, segmentation_grid_loss)
        for x, y in data:
            trainer.step(x, y)
        return grid

    together = train(len(lrs), lrs, weight_decays)
    for h, (lr, decay) in enumerate(zip(lrs, weight_decays)):
        alone = train(1, [lr], [decay])
        for p, q in zip(together.heads[h].parameters(), alone.heads[0].parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=f"head {h} (lr={lr}, wd={decay})")
    assert not torch.equal(together.heads[0].weight, together.heads[-1].weight)  # the heads did move apart

    # scored together, each head's confusion matrix is its own
    x, masks = torch.cat([d[0] for d in data]), torch.cat([d[1] for d in data])
    confusions = grid_confusions(together, x, masks, 3, batch_size=7)
    for h in (0, len(lrs) - 1):
        with torch.no_grad():
            logits = upsample_logits(together.eval()(x)[h : h + 1], (8, 8))
        assert torch.equal(confusions[h], confusion_matrices(logits.argmax(2), masks, 3)[0])
    assert torch.equal(grid_confusions(together, x, masks, 3, 7, heads=[2])[0], confusions[2])
