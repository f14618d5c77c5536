"""TensorBoard pictures: the mask overlay marks exactly the sampled patches, the loss map sums
back to the loss, and the callback logs them."""

import pytest
import torch
from conftest import TINY_CLIP_MODEL, TINY_MODEL
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ijepa.callbacks import JEPAImages, position_loss_map
from ijepa.data.batch import GridBatch
from ijepa.data.sources import MovingShapesSource
from ijepa.masks import MultiBlockMaskSampler, SpatioTemporalMasks
from ijepa.module import IJEPA
from ijepa.pictures import CONTEXT_COLOUR, TARGET_COLOURS, clip_mask_overlay, mask_overlay


def test_overlay_marks_exactly_the_sampled_patches():
    patch, grid = 4, 5
    images = torch.full((2, 3, grid * patch, grid * patch), 0.5)
    context = torch.tensor([[0, 1, 7], [3, 4, 24]])
    targets = torch.tensor([[[12, 13]], [[0, 5]]])
    out = mask_overlay(images, context, targets, patch, alpha=0.5)
    for b in range(2):
        for index in range(grid * grid):
            r, c = divmod(index, grid)
            pixel = out[b, :, r * patch + 1, c * patch + 2]  # inside the patch
            if index in targets[b, 0].tolist():
                expected = 0.25 + 0.5 * torch.tensor(TARGET_COLOURS[0])
            elif index in context[b].tolist():
                expected = 0.25 + 0.5 * torch.tensor(CONTEXT_COLOUR)
            else:
                expected = torch.full((3,), 0.35 * 0.5)
            torch.testing.assert_close(pixel, expected, msg=f"image {b}, patch {index}")


def test_loss_map_sums_back_to_the_loss():
    model = IJEPA(**TINY_MODEL)
    context, targets = MultiBlockMaskSampler(4, 3, (0.1, 0.2), min_keep=2)(6, torch.Generator().manual_seed(0))
    batch = GridBatch(torch.randn(6, 3, 32, 32), context, targets)
    loss_sum, count = position_loss_map(model, batch)
    assert loss_sum.shape == count.shape == (16,)
    assert count.sum() == targets.numel()
    with torch.no_grad():
        assert float(loss_sum.sum() / count.sum()) == pytest.approx(float(model.jepa_loss(batch)), rel=1e-5)


def test_callback_logs_images_and_histograms(tmp_path, make_datamodule, make_trainer):
    data = make_datamodule(train_size=40, val_size=32, batch_size=16)
    logger = TensorBoardLogger(tmp_path, name="", version=0)
    trainer = make_trainer(callbacks=[JEPAImages(num_images=4)], logger=logger)
    trainer.validate(IJEPA(**{**TINY_MODEL, "pos_embed": "learned"}), datamodule=data, verbose=False)
    logger.experiment.flush()
    events = EventAccumulator(str(tmp_path / "version_0"), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    assert {"jepa/masks", "jepa/loss_map"} <= set(events.Tags()["images"])
    assert {"hist/target_features", "hist/positions_encoder", "hist/positions_predictor"} <= set(
        events.Tags()["histograms"]
    )
    masks = events.Images("jepa/masks")[0]
    # make_grid of 4 images (four a row), padding 2, enlarged 8 times: the short side at least 256 px
    assert (masks.width, masks.height) == (8 * (4 * 32 + 5 * 2), 8 * (32 + 2 * 2))


def test_clip_overlay_marks_each_time_slice():
    patch, tubelet = 4, 2
    clips = torch.full((1, 3, 4, 8, 8), 0.5)  # grid (2, 2, 2): token (t, r, c) = 4t + 2r + c
    context = torch.tensor([[0, 7]])  # (0, 0, 0) and (1, 1, 1)
    targets = torch.tensor([[[1, 4]]])  # (0, 0, 1) and (1, 0, 0)
    out = clip_mask_overlay(clips, context, targets, patch, tubelet, alpha=0.5)
    assert out.shape == (1, 3, 8, 2 * 8)  # two time slices side by side
    blue, red = 0.25 + 0.5 * torch.tensor(CONTEXT_COLOUR), 0.25 + 0.5 * torch.tensor(TARGET_COLOURS[0])
    dark = torch.full((3,), 0.35 * 0.5)
    for t, r, c, expected in [
        (0, 0, 0, blue),
        (0, 0, 1, red),
        (0, 1, 0, dark),
        (1, 0, 0, red),
        (1, 1, 1, blue),
        (1, 0, 1, dark),
    ]:
        torch.testing.assert_close(out[0, :, r * patch + 1, t * 8 + c * patch + 1], expected, msg=f"token {(t, r, c)}")


def test_callbacks_log_clip_pictures(tmp_path, make_datamodule, make_trainer):
    """JEPAImages and PositionSimilarityImages on a clip model with M-RoPE timestamps (masks,
    loss map per time slice) and with a ``learned_3d`` table (Figure 7 of the first slice and
    the time-slice similarity)."""
    from ijepa.callbacks import PositionSimilarityImages

    data = make_datamodule(
        source=MovingShapesSource(train_size=16, val_size=8, fps=10.0),
        num_frames=4,
        tubelet_size=2,
        image_size=16,
        patch_size=4,
        batch_size=8,
        masks=SpatioTemporalMasks(target_scale=(0.1, 0.15), min_keep=4),
    )
    for version, pos_embed in enumerate(("mrope", "learned_3d")):
        logger = TensorBoardLogger(tmp_path, name="", version=version)
        trainer = make_trainer(callbacks=[JEPAImages(num_images=3), PositionSimilarityImages()], logger=logger)
        model = IJEPA(**TINY_CLIP_MODEL, pos_embed=pos_embed, predictor_pos_embed=pos_embed, time_unit=0.2)
        trainer.validate(model, datamodule=data, verbose=False)
        logger.experiment.flush()
        events = EventAccumulator(str(tmp_path / f"version_{version}"), size_guidance={"images": 0, "histograms": 0})
        events.Reload()
        tags = set(events.Tags()["images"])
        assert {"jepa/masks", "jepa/loss_map"} <= tags
        masks, loss_map = events.Images("jepa/masks")[0], events.Images("jepa/loss_map")[0]
        # one clip per row, 2 slices; enlarged by the whole factor that makes the short side >= 256 px
        assert (masks.width, masks.height) == (8 * (2 * 16 + 2 * 2), 8 * (3 * 16 + 4 * 2))
        assert (loss_map.width, loss_map.height) == (8 * 2 * 4 * 8, 8 * 4 * 8)
        if pos_embed == "learned_3d":
            assert {"positions/encoder", "positions/encoder_time", "positions/predictor_time"} <= tags
            time_image = events.Images("positions/encoder_time")[0]
            assert (time_image.width, time_image.height) == (8 * 2 * 16, 8 * 2 * 16)


def test_the_logged_position_picture_after_a_short_run_is_large_and_spans_its_range(
    tmp_path, make_trainer, make_datamodule
):
    # The sincos table's similarities lie in a narrow band near 1: mapped from [-1, 1], the tile of
    # position (0, 0) spanned grey levels 216-255 only (a white square), 19 x 19 px on a 4 x 4 grid.
    import io

    import numpy as np
    from PIL import Image

    from ijepa.callbacks import EMATargetUpdate, PositionSimilarityImages

    logger = TensorBoardLogger(tmp_path, name="", version=0)
    trainer = make_trainer(
        callbacks=[EMATargetUpdate(), PositionSimilarityImages()], logger=logger, max_steps=2, limit_val_batches=1
    )
    trainer.fit(IJEPA(**TINY_MODEL, optim={"warmup_steps": 1}), datamodule=make_datamodule())
    logger.experiment.flush()
    events = EventAccumulator(str(tmp_path / "version_0"), size_guidance={"images": 0})
    events.Reload()
    picture = events.Images("positions/encoder")[-1]
    pixels = np.asarray(Image.open(io.BytesIO(picture.encoded_image_string)).convert("L"), dtype=np.int32)
    grid = 32 // 8  # TINY_MODEL's 4 x 4 patches: tiles of 4 x 4, one pixel of padding between them
    factor = pixels.shape[1] // (grid * (grid + 1) - 1)
    assert min(pixels.shape) >= 256 and factor * (grid * (grid + 1) - 1) == pixels.shape[1]
    tile = pixels[: grid * factor, : grid * factor]  # position (0, 0) against every position
    assert tile.max() - tile.min() >= 128, (tile.min(), tile.max())
    assert len(np.unique(tile)) >= grid * grid // 2  # many levels, not one colour
