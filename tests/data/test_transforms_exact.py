"""The data pipeline's own pixel transforms give, bit for bit, what the torchvision v2 pipeline
they replace gives (so changing them changed no run), for every input kind a source hands over."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from ijepa.data.datamodule import IJEPADataModule
from ijepa.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ToNormalizedFloat


def torchvision_eval(size: int) -> v2.Compose:
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(size, antialias=True),
            v2.CenterCrop(size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


@pytest.mark.parametrize("shape", [(3, 48, 48), (3, 60, 50), (3, 40, 70), (3, 48, 96)])
def test_the_eval_transform_equals_torchvision_resize_crop_to_dtype_normalize_bit_for_bit(shape):
    generator = torch.Generator().manual_seed(sum(shape))
    pixels = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    ours, theirs = IJEPADataModule(image_size=48, patch_size=8).eval_transform(), torchvision_eval(48)
    inputs = [
        pixels,
        tv_tensors.Image(pixels),
        Image.fromarray(pixels.permute(1, 2, 0).numpy()),
        pixels.float() / 255,  # float images are not rescaled, only normalised
    ]
    for image in inputs:
        expected = theirs(image).as_subclass(torch.Tensor)
        got = ours(image)
        assert got.dtype == torch.float32 and got.shape == expected.shape == (3, 48, 48)
        assert torch.equal(got, expected), type(image)


def test_the_training_transform_with_crops_equals_torchvision_under_the_same_seed():
    data = IJEPADataModule(image_size=32, patch_size=8, crop_scale=(0.3, 1.0), horizontal_flip=True)
    theirs = v2.Compose(
        [
            v2.ToImage(),
            v2.RandomResizedCrop(32, scale=(0.3, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    pixels = torch.randint(0, 256, (3, 57, 45), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    for seed in range(5):
        torch.manual_seed(seed)
        expected = theirs(pixels).as_subclass(torch.Tensor)
        torch.manual_seed(seed)
        assert torch.equal(data.train_transform()(pixels), expected)


def test_to_normalized_float_refuses_integer_images_other_than_uint8():
    with pytest.raises(TypeError, match="uint8 or float images, got torch.int32"):
        ToNormalizedFloat()(torch.zeros(3, 4, 4, dtype=torch.int32))
