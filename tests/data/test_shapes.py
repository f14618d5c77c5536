import pytest
import torch
import torch.nn.functional as F
from torchvision import tv_tensors

from ijepa.data.shapes import BACKGROUNDS, CLASSES, ShapesDataset


def _border_colour(images: torch.Tensor) -> torch.Tensor:
    """Median colour of the 1-px border; images float [N, 3, H, W] -> [N, 3]."""
    border = torch.cat([images[..., 0, :], images[..., -1, :], images[..., :, 0], images[..., :, -1]], dim=-1)
    return border.median(dim=-1).values


def _foreground(images: torch.Tensor, threshold: float = 0.25) -> torch.Tensor:
    """Pixels far (RGB distance) from the background; uint8 [N, 3, H, W] -> bool [N, H, W]."""
    x = images.float() / 255
    return (x - _border_colour(x)[..., None, None]).norm(dim=1) > threshold


def test_items_shape_dtype_len():
    ds = ShapesDataset(25, image_size=32)
    assert len(ds) == 25
    assert ds.num_classes == len(CLASSES) == 10
    image, label = ds[3]
    assert isinstance(image, tv_tensors.Image)
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    assert isinstance(label, int) and label == ds.targets[3]
    assert torch.equal(ds[-1][0], ds[24][0])
    with pytest.raises(IndexError):
        ds[25]
    with pytest.raises(IndexError):
        ds[-26]


def test_labels_in_range_and_balanced():
    ds = ShapesDataset(200, image_size=16, cache=False)
    targets = torch.tensor(ds.targets)
    assert targets.min() >= 0 and targets.max() < ds.num_classes
    assert torch.bincount(targets, minlength=ds.num_classes).tolist() == [20] * ds.num_classes
    assert [ds[i][1] for i in range(0, 200, 17)] == ds.targets[::17]


@pytest.mark.parametrize("background", BACKGROUNDS)
def test_deterministic_and_cache_equivalent(background):
    kwargs = dict(num_samples=24, image_size=32, seed=3, background=background)
    a, b = ShapesDataset(**kwargs), ShapesDataset(**kwargs)
    assert torch.equal(a.images, b.images)
    lazy = ShapesDataset(**kwargs, cache=False)
    # access out of order so a lazy render cannot depend on previous calls
    order = list(range(23, -1, -3)) + list(range(24))
    for i in order:
        image, label = lazy[i]
        assert torch.equal(image, a.images[i]) and label == a.targets[i]


@pytest.mark.parametrize("other", [dict(seed=1), dict(split="val"), dict(background="busy")])
def test_seeds_splits_backgrounds_differ(other):
    base = ShapesDataset(30, image_size=32)
    alt = ShapesDataset(30, image_size=32, **other)
    differs = (base.images != alt.images).flatten(1).any(dim=1)
    assert differs.all()


def test_every_class_drawn_with_contrast():
    ds = ShapesDataset(40, image_size=32)
    assert set(ds.targets) == set(range(len(CLASSES)))
    fg = _foreground(ds.images)
    frac = fg.float().mean(dim=(1, 2))
    # the smallest shape (a thin bar at minimum scale) still covers > 3% of the image
    assert (frac > 0.02).all(), {CLASSES[t]: round(f, 3) for t, f in zip(ds.targets, frac.tolist())}
    assert (frac < 0.7).all()
    # hollow shapes have background at their centroid, filled ones do not
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    for mask, label in zip(fg, ds.targets):
        cy = int((ys * mask).sum() / mask.sum())
        cx = int((xs * mask).sum() / mask.sum())
        name = CLASSES[label]
        if name in ("ring", "frame"):
            assert not mask[cy, cx], name
        elif name in ("circle", "square", "cross", "star"):
            assert mask[cy, cx], name


def test_background_noise_levels():
    images = {bg: ShapesDataset(20, image_size=32, background=bg).images.float() for bg in BACKGROUNDS}
    # std over a background corner patch, in intensity levels
    patch_std = {bg: x[..., :5, :5].flatten(2).std(dim=-1).median().item() for bg, x in images.items()}
    assert patch_std["plain"] < 8 < 12 < patch_std["noisy"]
    # busy textures vary at low frequency, so they survive pooling that averages the noise away
    pooled = {bg: F.avg_pool2d(x[..., :4, :], 4) for bg, x in images.items()}
    spread = {bg: (p - p.median(dim=-1, keepdim=True).values).abs().mean() for bg, p in pooled.items()}
    assert spread["busy"] > 2.5 * spread["noisy"]
    # same index: same shape and colours, only the noise changes
    labels = ShapesDataset(20, image_size=32, background="noisy").targets
    assert labels == ShapesDataset(20, image_size=32).targets
    assert (images["noisy"] - images["plain"]).abs().mean() < 25


def test_classes_learnable_from_raw_pixels():
    """1-NN on grey 2x-downsampled pixels must beat chance (10%) clearly."""
    train = ShapesDataset(1000, image_size=32, split="train")
    val = ShapesDataset(300, image_size=32, split="val")

    def features(images):
        x = F.avg_pool2d(images.float().mean(dim=1, keepdim=True), 2).flatten(1)
        return F.normalize(x - x.mean(dim=1, keepdim=True), dim=1)

    nearest = (features(val.images) @ features(train.images).T).argmax(dim=1)
    pred = torch.tensor(train.targets)[nearest]
    acc = (pred == torch.tensor(val.targets)).float().mean().item()
    print(f"raw-pixel 1-NN accuracy: {acc:.3f}")
    assert acc > 3 / len(CLASSES)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_samples=0), "num_samples"),
        (dict(num_samples=2.5), "num_samples"),
        (dict(num_samples=4, image_size=7), "image_size"),
        (dict(num_samples=4, split="test"), "split"),
        (dict(num_samples=4, background="fancy"), "background"),
        (dict(num_samples=4, seed="0"), "seed"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name) as err:
        ShapesDataset(**kwargs)
    assert repr(kwargs[name]) in str(err.value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_objects=(0, 2)), r"num_objects must be \(min, max\) with 1 <= min <= max <= 8"),
        (dict(num_objects=(3, 2)), "num_objects"),
        (dict(num_objects=(1, 9)), "num_objects"),
        (dict(radius=(0.3, 0.2)), r"radius must be \(min, max\) with 0 < min <= max <= 0.5"),
        (dict(radius=(0.1, 0.6)), "radius"),
    ],
)
def test_bad_object_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShapesDataset(4, **kwargs)


def test_several_instances_per_image():
    """num_objects=(3, 3) draws three instances of the image's class: more foreground, more blobs,
    and the single-instance default is unchanged by the option's existence."""
    one = ShapesDataset(20, image_size=48, radius=(0.12, 0.14))
    three = ShapesDataset(20, image_size=48, radius=(0.12, 0.14), num_objects=(3, 3))
    assert three.targets == one.targets
    fg_one, fg_three = _foreground(one.images), _foreground(three.images)
    assert fg_three.float().mean() > 2.0 * fg_one.float().mean()
    # circles (class 0) never split into pieces: count them exactly where they do not touch
    blobs_one = [_components(m) for m, t in zip(fg_one, one.targets) if t == 0]
    blobs_three = [_components(m) for m, t in zip(fg_three, three.targets) if t == 0]
    assert blobs_one == [1, 1]
    assert max(blobs_three) == 3 and min(blobs_three) >= 1


def _components(mask: torch.Tensor) -> int:
    """Number of 4-connected foreground components of a boolean [H, W] mask (flood fill)."""
    seen = torch.zeros_like(mask)
    count = 0
    h, w = mask.shape
    for y in range(h):
        for x in range(w):
            if mask[y, x] and not seen[y, x]:
                count += 1
                stack = [(y, x)]
                seen[y, x] = True
                while stack:
                    cy, cx = stack.pop()
                    for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                        if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                            seen[ny, nx] = True
                            stack.append((ny, nx))
    return count


@pytest.mark.parametrize("size", [32, 48, 96])
def test_image_sizes(size):
    ds = ShapesDataset(10, image_size=size, background="busy")
    lazy = ShapesDataset(10, image_size=size, background="busy", cache=False)
    assert ds.images.shape == (10, 3, size, size)
    assert torch.equal(lazy[7][0], ds.images[7])
    frac = _foreground(ShapesDataset(10, image_size=size).images).float().mean(dim=(1, 2))
    assert (frac > 0.02).all()


def test_transform_applied():
    ds = ShapesDataset(5, image_size=16, transform=lambda x: x.float() / 255)
    image, _ = ds[2]
    assert image.dtype == torch.float32
    assert torch.allclose(image, ds.images[2].float() / 255)


def test_windowed_coverage_equals_testing_every_sub_sample_of_the_image():
    # _coverage tests each instance only in a window around it; the reference tests the whole grid.
    import math

    from ijepa.data.shapes import _SHAPE_FNS, CLASSES, _coverage, supersample

    def full_grid(instances, size):
        ss = supersample(size)
        grid = (torch.arange(size * ss, dtype=torch.float32) + 0.5) / ss
        xs, ys = grid.view(1, -1), grid.view(-1, 1)
        out = []
        for label, o in instances:
            dx, dy = xs - o["cx"], ys - o["cy"]
            u, v = dx * o["c"] + dy * o["s"], dy * o["c"] - dx * o["s"]
            inside = _SHAPE_FNS[CLASSES[label]](u, v)
            out.append(inside.view(size, ss, size, ss).sum((1, 3)).float() / (ss * ss))
        return torch.stack(out)

    g = torch.Generator().manual_seed(0)
    for size in (16, 48, 96):
        instances = []
        for label in range(len(CLASSES)):
            for _ in range(6):  # centres inside, at and beyond the edges; radii up to half the image
                radius = size * (0.05 + 0.45 * torch.rand(1, generator=g).item())
                cx, cy = (size * (1.4 * torch.rand(2, generator=g) - 0.2)).tolist()
                theta = 2 * math.pi * torch.rand(1, generator=g).item()
                instances.append((label, dict(cx=cx, cy=cy, c=math.cos(theta) / radius, s=math.sin(theta) / radius)))
        reference = full_grid(instances, size)
        assert reference.sum() > 0
        assert torch.equal(_coverage(instances, size), reference)
