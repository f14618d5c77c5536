"""Procedurally generated, labelled shapes dataset for offline experiments.

Every image shows one shape class: by default one coloured geometric shape (random
position, scale, rotation and hue), optionally several instances of the same class
(``num_objects``), on a plain, noisy or textured background. Images are a pure
function of ``(seed, split, index, image_size, background)``, so the dataset
needs no download and train/val splits are reproducible everywhere. With ``dense=True``
items also carry a per-pixel class mask (from the renderer's own supersampled coverage:
a pixel is its shape's when the shape covers at least half of it) and the number of
instances drawn, for the segmentation and counting evaluations.

Determinism note: the pixel-grid arithmetic only uses IEEE correctly rounded
ops (+, -, *, /, abs, floor, comparisons) with per-image scalars precomputed in
Python. Transcendental functions (sin, atan2, exp) are vectorised differently
depending on tensor size and thread count, which would make a batch-rendered
(cached) image differ by an ulp from the same image rendered alone.
"""

from __future__ import annotations

import colorsys
import math
import operator
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors

# The renderer's public pieces, shared with the moving-shapes clips (ijepa.data.moving_shapes).
__all__ = [
    "BACKGROUNDS",
    "CHUNK_POINTS",
    "CLASSES",
    "MIN_CONTRAST",
    "SPLITS",
    "ShapesDataset",
    "index_seed",
    "render_scenes",
    "render_scenes_with_masks",
    "rgb_distance",
    "supersample",
]

CLASSES: tuple[str, ...] = (
    "circle",
    "ring",
    "square",
    "frame",
    "triangle",
    "star",
    "cross",
    "crescent",
    "half_disk",
    "bar",
)
BACKGROUNDS: tuple[str, ...] = ("plain", "noisy", "busy")
SPLITS: tuple[str, ...] = ("train", "val")

_NOISE_STD = {"plain": 0.02, "noisy": 0.08, "busy": 0.02}
_RADIUS_RANGE = (0.2, 0.42)  # default shape radius as a fraction of image size
_MAX_OBJECTS = 8  # instances drawn per image (fixed draw count); the first n are used
MIN_CONTRAST = 0.4  # min RGB distance between shape and plain background
CHUNK_POINTS = 1 << 23  # sub-sample points per render chunk, bounds memory
_N_GRATINGS, _N_BLOBS = 3, 2
_N_OBJECT_U = 7  # per instance: radius, cx, cy, angle + fg colour (h, s, v)
_N_SHAPE_U = 1 + _N_OBJECT_U * _MAX_OBJECTS + 4 * 3  # count + instances + 4 candidate bg colours
_N_TEXTURE_U = 6 * _N_GRATINGS + 6 * _N_BLOBS
_MASK64 = (1 << 64) - 1


# --------------------------------------------------------------------------
# shape inside-tests on local coordinates (u, v), shape extent ~ unit disk


def _polygon(u: Tensor, v: Tensor, verts: Sequence[tuple[float, float]]) -> Tensor:
    """Inside test for a convex polygon with CCW ``verts``; u, v: [...] -> bool [...]."""
    inside = torch.ones_like(u, dtype=torch.bool)
    for (x0, y0), (x1, y1) in zip(verts, verts[1:] + verts[:1]):
        inside &= (v - y0) * (x1 - x0) - (u - x0) * (y1 - y0) >= 0
    return inside


def _regular_vertices(n: int, radius: float = 1.0, phase: float = math.pi / 2) -> list:
    return [
        (radius * math.cos(phase + 2 * math.pi * k / n), radius * math.sin(phase + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _pentagram_lines() -> list:
    # the 5 lines extending the edges of the inner pentagon, as (a, b, d) with a*u + b*v <= d inside
    d = math.cos(2 * math.pi / 5)  # distance of the inner pentagon edges from the centre
    lines = []
    for k in range(5):
        a = math.pi / 2 + 2 * math.pi * k / 5  # each edge normal points at the tip beyond it
        lines.append((math.cos(a), math.sin(a), d))
    return lines


_TRIANGLE = _regular_vertices(3)
_PENTAGRAM = _pentagram_lines()


def _circle(u, v):
    return u * u + v * v <= 1.0


def _ring(u, v):
    r2 = u * u + v * v
    return (r2 <= 1.0) & (r2 >= 0.55**2)


def _square(u, v):
    return (u.abs() <= 0.7) & (v.abs() <= 0.7)


def _frame(u, v):
    return _square(u, v) & ~((u.abs() <= 0.4) & (v.abs() <= 0.4))


def _triangle(u, v):
    return _polygon(u, v, _TRIANGLE)


def _star(u, v):
    # pentagram: the pentagon core violates none of the 5 edge lines, a tip exactly
    # one, every point outside the star at least two; avoids a non-exact atan2
    outside = torch.zeros_like(u, dtype=torch.uint8)
    for a, b, d in _PENTAGRAM:
        outside += u * a + v * b > d
    return outside <= 1


def _cross(u, v):
    au, av = u.abs(), v.abs()
    return ((au <= 0.3) & (av <= 0.95)) | ((av <= 0.3) & (au <= 0.95))


def _crescent(u, v):
    du = u - 0.45
    return (u * u + v * v <= 1.0) & (du * du + v * v > 0.8**2)


def _half_disk(u, v):
    # shifted down so the half disk is roughly centred on the origin
    dv = v + 0.35
    return (u * u + dv * dv <= 0.95**2) & (dv >= 0)


def _bar(u, v):
    return (u.abs() <= 0.95) & (v.abs() <= 0.22)


_SHAPE_FNS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "circle": _circle,
    "ring": _ring,
    "square": _square,
    "frame": _frame,
    "triangle": _triangle,
    "star": _star,
    "cross": _cross,
    "crescent": _crescent,
    "half_disk": _half_disk,
    "bar": _bar,
}
assert tuple(_SHAPE_FNS) == CLASSES


# --------------------------------------------------------------------------
# per-index parameters


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def index_seed(seed: int, split: str, index: int) -> int:
    """Well-mixed int63 seed; a plain linear combination would let e.g. train
    index 7919 collide with val index 0."""
    h = _splitmix64(seed & _MASK64)
    h = _splitmix64(h ^ SPLITS.index(split))
    h = _splitmix64(h ^ index)
    return h >> 1


def rgb_distance(a: Sequence[float], b: Sequence[float]) -> float:
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))


def _sample_params(
    seed: int,
    split: str,
    index: int,
    image_size: int,
    num_classes: int,
    num_objects: tuple[int, int] = (1, 1),
    radius_range: tuple[float, float] = _RADIUS_RANGE,
) -> dict:
    """Draw all random quantities of one image from its own generator.

    Draw order and count are fixed (texture and ``_MAX_OBJECTS`` instances are drawn
    even when unused) so the same index shares shape, colours and noise pattern
    across backgrounds.
    """
    g = torch.Generator().manual_seed(index_seed(seed, split, index))
    u = torch.rand(_N_SHAPE_U + _N_TEXTURE_U, generator=g, dtype=torch.float64).tolist()
    noise = torch.randn(3, image_size, image_size, generator=g)

    count = num_objects[0] + min(int(u[0] * (num_objects[1] - num_objects[0] + 1)), num_objects[1] - num_objects[0])
    lo, hi = radius_range
    objects = []
    for k in range(count):
        w = u[1 + _N_OBJECT_U * k : 1 + _N_OBJECT_U * (k + 1)]
        radius = image_size * (lo + (hi - lo) * w[0])
        theta = 2 * math.pi * w[3]
        objects.append(
            dict(
                cx=radius + (image_size - 2 * radius) * w[1],
                cy=radius + (image_size - 2 * radius) * w[2],
                # rotation and scale folded into two scalars: u = (dx*c + dy*s), v = (dy*c - dx*s)
                c=math.cos(theta) / radius,
                s=math.sin(theta) / radius,
                fg=colorsys.hsv_to_rgb(w[4], 0.65 + 0.35 * w[5], 0.75 + 0.25 * w[6]),
            )
        )

    # rejection over a fixed number of candidates keeps the draw count constant
    b = u[1 + _N_OBJECT_U * _MAX_OBJECTS :]
    candidates = [colorsys.hsv_to_rgb(b[3 * k], 0.35 * b[1 + 3 * k], 0.05 + 0.9 * b[2 + 3 * k]) for k in range(4)]

    def contrast(c):
        return min(rgb_distance(c, o["fg"]) for o in objects)

    bg = next((c for c in candidates if contrast(c) >= MIN_CONTRAST), None)
    if bg is None:
        bg = max(((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)), key=contrast)

    t = u[_N_SHAPE_U:]
    gratings = []
    for k in range(_N_GRATINGS):
        a, f, ph, r, gg, b = t[6 * k : 6 * k + 6]
        a *= 2 * math.pi
        freq = (1.5 + 4.5 * f) / image_size  # cycles per pixel
        amp = [0.25 * (2 * c - 1) for c in (r, gg, b)]
        gratings.append((math.cos(a) * freq, math.sin(a) * freq, ph, amp))
    t = t[6 * _N_GRATINGS :]
    blobs = []
    for k in range(_N_BLOBS):
        bx, by, br, h, s, v = t[6 * k : 6 * k + 6]
        br = image_size * (0.1 + 0.25 * br)
        blobs.append((bx * image_size, by * image_size, 1.0 / (br * br), colorsys.hsv_to_rgb(h, s, v)))

    return dict(
        label=index % num_classes,
        objects=objects,
        bg=bg,
        gratings=gratings,
        blobs=blobs,
        noise=noise,
    )


# --------------------------------------------------------------------------
# rendering


def _col(values: Sequence[float]) -> Tensor:
    """Per-image scalars -> float32 [B, 1, 1] for broadcasting over a pixel grid."""
    return torch.tensor(values, dtype=torch.float32).view(-1, 1, 1)


def supersample(image_size: int) -> int:
    # sub-samples per pixel side; large images already resolve edges finely
    return 4 if image_size <= 64 else 2


def _coverage(instances: list[tuple[int, dict]], image_size: int) -> Tensor:
    """Anti-aliased coverage in [0, 1] of ``(label, object)`` instances; -> float32 [I, H, W].

    Every shape lies in a disc of ``radius * sqrt(2)`` around its centre, so each instance is
    tested only in a square window around it (a few times fewer sub-samples than the whole
    image). The window's sub-sample coordinates are the whole image's, computed the same way,
    so the coverage is bit-identical to testing every sub-sample of the image.
    """
    ss = supersample(image_size)
    alpha = torch.zeros(len(instances), image_size, image_size)
    labels = torch.tensor([label for label, _ in instances])
    for label in labels.unique().tolist():
        idx = (labels == label).nonzero().flatten()
        sub = [instances[i][1] for i in idx.tolist()]
        reach = [1.5 / math.hypot(o["c"], o["s"]) for o in sub]  # radius * 1.5 > radius * sqrt(2)
        x0 = [math.floor(o["cx"] - r) for o, r in zip(sub, reach)]
        y0 = [math.floor(o["cy"] - r) for o, r in zip(sub, reach)]
        width = max(math.floor(o["cx"] + r) - x for o, r, x in zip(sub, reach, x0)) + 1
        height = max(math.floor(o["cy"] + r) - y for o, r, y in zip(sub, reach, y0)) + 1
        side = min(max(width, height), image_size)  # one window size for the group
        x0 = [min(max(x, 0), image_size - side) for x in x0]  # windows inside the image
        y0 = [min(max(y, 0), image_size - side) for y in y0]
        steps = torch.arange(side * ss)
        # sub-sample centres in pixel units, exactly as (arange(n) + 0.5) / ss over the image
        xs = ((torch.tensor(x0).view(-1, 1) * ss + steps).float() + 0.5).div(ss).view(len(sub), 1, -1)
        ys = ((torch.tensor(y0).view(-1, 1) * ss + steps).float() + 0.5).div(ss).view(len(sub), -1, 1)
        dx = xs - _col([o["cx"] for o in sub])
        dy = ys - _col([o["cy"] for o in sub])
        c, s = _col([o["c"] for o in sub]), _col([o["s"] for o in sub])
        u = dx * c + dy * s
        v = dy * c - dx * s
        inside = _SHAPE_FNS[CLASSES[label]](u, v)
        # integer sub-sample counts are exact, so no reduction-order effects
        count = inside.view(len(sub), side, ss, side, ss).sum((2, 4)).float() / (ss * ss)
        for j, i in enumerate(idx.tolist()):
            alpha[i, y0[j] : y0[j] + side, x0[j] : x0[j] + side] = count[j]
    return alpha


def _tri(t: Tensor) -> Tensor:
    """Triangle wave with period 1 in [-1, 1]; a sine substitute using exact ops."""
    return (t - t.floor() - 0.5).abs() * 4 - 1


def _texture(params: list[dict], image_size: int) -> Tensor:
    """Busy background: gratings plus soft blobs over the base colour; -> [B, 3, H, W]."""
    grid = torch.arange(image_size, dtype=torch.float32) + 0.5
    xs, ys = grid.view(1, 1, -1), grid.view(1, -1, 1)
    bg = _col([c for p in params for c in p["bg"]]).view(-1, 3, 1, 1).expand(-1, -1, image_size, image_size)
    for k in range(_N_GRATINGS):
        fx = _col([p["gratings"][k][0] for p in params])
        fy = _col([p["gratings"][k][1] for p in params])
        phase = _col([p["gratings"][k][2] for p in params])
        amp = _col([a for p in params for a in p["gratings"][k][3]]).view(-1, 3, 1, 1)
        bg = bg + amp * _tri(xs * fx + ys * fy + phase).unsqueeze(1)
    for k in range(_N_BLOBS):
        dx = xs - _col([p["blobs"][k][0] for p in params])
        dy = ys - _col([p["blobs"][k][1] for p in params])
        q = 1.0 / (1.0 + (dx * dx + dy * dy) * _col([p["blobs"][k][2] for p in params]))
        w = (q * q).unsqueeze(1)  # Cauchy-like soft blob, no exp needed
        colour = _col([c for p in params for c in p["blobs"][k][3]]).view(-1, 3, 1, 1)
        bg = bg + w * (colour - bg)
    return bg


def render_scenes(params: list[dict], image_size: int, background: str, base: Tensor | None = None) -> Tensor:
    """Render a batch of images from their parameters; -> uint8 [B, 3, H, W]. ``base [B, 3, H, W]``
    (float in [0, 1]), when given, replaces the background."""
    return _render(params, image_size, background, base, masks=False)[0]


def render_scenes_with_masks(
    params: list[dict], image_size: int, background: str, base: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`render_scenes` (the same images, bit for bit) and each image's class mask, uint8
    [B, H, W]: ``label + 1`` where a shape covers at least half of the pixel (its supersampled
    coverage, the one the pixel is painted with), ``0`` (background) elsewhere."""
    return _render(params, image_size, background, base, masks=True)


def _render(
    params: list[dict], image_size: int, background: str, base: Tensor | None, masks: bool
) -> tuple[Tensor, Tensor | None]:
    mask = torch.zeros(len(params), image_size, image_size, dtype=torch.uint8) if masks else None
    if base is not None:
        img = base
    elif background == "busy":
        img = _texture(params, image_size)
    else:
        img = _col([c for p in params for c in p["bg"]]).view(-1, 3, 1, 1).expand(-1, -1, image_size, image_size)
    # One writable copy (the background may be an expanded view or the caller's tensor), painted
    # in place, instance layer by instance layer (all first objects, then all second ones, ...).
    img = img.clone(memory_format=torch.contiguous_format)
    for layer in range(max(len(p["objects"]) for p in params)):
        owners = [i for i, p in enumerate(params) if len(p["objects"]) > layer]
        instances = [(params[i]["label"], params[i]["objects"][layer]) for i in owners]
        alpha = _coverage(instances, image_size).unsqueeze(1)
        fg = _col([c for _, o in instances for c in o["fg"]]).view(-1, 3, 1, 1)
        painted = img[owners]
        img[owners] = painted + alpha * (fg - painted)
        if mask is not None:
            # every instance of an image is of its class, so overlaps need no order
            values = torch.tensor([label + 1 for label, _ in instances], dtype=torch.uint8).view(-1, 1, 1)
            mask[owners] = torch.where(alpha.squeeze(1) >= 0.5, values, mask[owners])
    img = img + _NOISE_STD[background] * torch.stack([p["noise"] for p in params])
    return img.clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8), mask


# --------------------------------------------------------------------------
# dataset


def _check_choice(name: str, value, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_shape_options(background: str, num_objects: tuple[int, int], radius: tuple[float, float]) -> None:
    """The checks of the options a :class:`ShapesDataset` and its source
    (:class:`ijepa.data.sources.ShapesSource`) share, so the source refuses them when built."""
    _check_choice("background", background, BACKGROUNDS)
    if len(num_objects) != 2 or not 1 <= num_objects[0] <= num_objects[1] <= _MAX_OBJECTS:
        raise ValueError(
            f"num_objects must be (min, max) with 1 <= min <= max <= {_MAX_OBJECTS}, got {tuple(num_objects)}"
        )
    # `not a <= b` also refuses NaN
    if len(radius) != 2 or not 0.0 < radius[0] <= radius[1] <= 0.5:
        raise ValueError(f"radius must be (min, max) with 0 < min <= max <= 0.5, got {tuple(radius)}")


class ShapesDataset(Dataset):
    """Labelled images of one random geometric shape each, rendered procedurally.

    Items are ``(image, label)``: image a ``tv_tensors.Image`` uint8 [3, H, W]
    (after ``transform`` if given), label an int in ``[0, num_classes)``.
    Labels are ``index % num_classes``, so classes are balanced.

    With ``dense=True`` items are ``(image, {"label": int, "mask": Mask, "count": int})``:
    ``mask`` a ``tv_tensors.Mask`` int64 [H, W], ``label + 1`` on the pixels a shape covers at
    least half of (the renderer's own supersampled coverage), ``0`` on the background; ``count``
    the number of instances drawn. The images are those of ``dense=False``, bit for bit, and
    ``transform`` is called as ``transform(image, target)``, so that torchvision v2 transforms
    crop, resize and flip the mask with the image (nearest interpolation for the mask).

    Args:
        num_samples: dataset length, >= 1.
        image_size: H = W in pixels, >= 8.
        split: "train" or "val"; mixed into the per-index seed so splits differ.
        seed: base seed; same (seed, split, index, image_size, background)
            always gives the same image.
        background: "plain" (uniform colour, noise std 0.02), "noisy" (noise std
            0.08) or "busy" (random gratings and blobs). Shape, colours and
            noise pattern of an index are shared across backgrounds.
        cache: render everything once at construction ([N, 3, H, W] uint8,
            N*3*H*W bytes) instead of per access; both give identical images.
        transform: optional callable applied to the image.
        num_objects: (min, max) instances of the image's class per image, each with its
            own position, scale, rotation and hue; 1 <= min <= max <= 8.
        radius: (min, max) instance radius as a fraction of image_size, in (0, 0.5].
        dense: also return each image's class mask and object count (above); with ``cache``
            the masks are rendered once too ([N, H, W] uint8, N*H*W bytes).
    """

    classes: tuple[str, ...] = CLASSES

    def __init__(
        self,
        num_samples: int,
        image_size: int = 48,
        split: str = "train",
        seed: int = 0,
        background: str = "plain",
        cache: bool = True,
        transform: Callable | None = None,
        num_objects: tuple[int, int] = (1, 1),
        radius: tuple[float, float] = _RADIUS_RANGE,
        dense: bool = False,
    ) -> None:
        _check_int("num_samples", num_samples, 1)
        _check_int("image_size", image_size, 8)
        _check_choice("split", split, SPLITS)
        check_shape_options(background, num_objects, radius)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not isinstance(dense, bool):
            raise ValueError(f"dense must be a bool (True: items carry masks and counts), got {dense!r}")
        self.dense = dense
        self.num_objects = (int(num_objects[0]), int(num_objects[1]))
        self.radius = (float(radius[0]), float(radius[1]))
        self.num_samples = num_samples
        self.image_size = image_size
        self.split = split
        self.seed = seed
        self.background = background
        self.transform = transform
        self.targets: list[int] = [i % self.num_classes for i in range(num_samples)]
        self.masks: Tensor | None = None  # uint8 [N, H, W], with dense and cache
        self.counts: Tensor | None = None  # int64 [N], with dense and cache
        self.images: Tensor | None = self._render_all() if cache else None

    @property
    def num_classes(self) -> int:
        """Number of shape classes, ``len(CLASSES)``."""
        return len(CLASSES)

    def _params(self, indices: Sequence[int]) -> list[dict]:
        return [
            _sample_params(self.seed, self.split, i, self.image_size, self.num_classes, self.num_objects, self.radius)
            for i in indices
        ]

    def render(self, indices: Sequence[int]) -> Tensor:
        """Render the given (non-negative, in range) indices; -> uint8 [len(indices), 3, H, W]."""
        return render_scenes(self._params(indices), self.image_size, self.background)

    def render_dense(self, indices: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
        """Render the given indices with their class masks and object counts; -> images uint8
        [n, 3, H, W] (those of :meth:`render`), masks uint8 [n, H, W] (``0`` background, ``label
        + 1`` on a shape), counts int64 [n]."""
        params = self._params(indices)
        images, masks = render_scenes_with_masks(params, self.image_size, self.background)
        return images, masks, torch.tensor([len(p["objects"]) for p in params], dtype=torch.int64)

    def _render_all(self) -> Tensor:
        chunk = max(1, CHUNK_POINTS // (self.image_size * supersample(self.image_size)) ** 2)
        out = torch.empty(self.num_samples, 3, self.image_size, self.image_size, dtype=torch.uint8)
        if self.dense:
            self.masks = torch.empty(self.num_samples, self.image_size, self.image_size, dtype=torch.uint8)
            self.counts = torch.empty(self.num_samples, dtype=torch.int64)
        for start in range(0, self.num_samples, chunk):
            stop = min(start + chunk, self.num_samples)
            if self.dense:
                out[start:stop], self.masks[start:stop], self.counts[start:stop] = self.render_dense(range(start, stop))
            else:
                out[start:stop] = self.render(range(start, stop))
        return out

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, int] | tuple[tv_tensors.Image, dict]:
        i = operator.index(index)
        if i < 0:
            i += self.num_samples
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {index} out of range for ShapesDataset of length {self.num_samples}")
        if self.dense:
            return self._dense_item(i)
        image = self.images[i] if self.images is not None else self.render([i])[0]
        image = tv_tensors.Image(image)
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[i]

    def _dense_item(self, i: int) -> tuple[tv_tensors.Image, dict]:
        if self.images is not None and self.masks is not None:
            image, mask, count = self.images[i], self.masks[i], int(self.counts[i])
        else:
            images, masks, counts = self.render_dense([i])
            image, mask, count = images[0], masks[0], int(counts[0])
        target = {"label": self.targets[i], "mask": tv_tensors.Mask(mask.to(torch.int64)), "count": count}
        image = tv_tensors.Image(image)
        if self.transform is not None:
            return self.transform(image, target)
        return image, target

    def extra_repr(self) -> str:
        return (
            f"num_samples={self.num_samples}, image_size={self.image_size}, split={self.split!r}, "
            f"seed={self.seed}, background={self.background!r}, num_objects={self.num_objects}, "
            f"radius={self.radius}, dense={self.dense}, cached={self.images is not None}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"
