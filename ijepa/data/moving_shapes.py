"""Generated labelled clips whose class is the motion (or, with ``label="shape"``, what moves).

Each clip shows one shape (any of the ten image classes, random size, rotation and colour) moving
at constant velocity on a torus: it leaves one edge and comes back at the opposite one. With
``background="texture"`` (the default) the whole scene pans: a smooth random colour texture
around mid-grey moves with the shape, so every patch of every frame shows the motion. With ``"plain"`` the background
is a flat colour and only the patches the shape crosses move; ``"noisy"`` adds the image
quickstart's light pixel noise (std 0.08, fresh in every frame) to the flat colour. The label is the direction of
motion. Because of the wrap-around, the content of any single frame has the same distribution
whatever the direction, so no single frame carries the label: a probe has to use time
(``tests/nn/test_video.py`` checks both halves of that claim on pixels).

With ``label="shape"`` the class is the moving shape's kind (the ten image classes) and the
motion a nuisance: a random-init encoder's tokens already carry the direction of a panning
texture (its tubelet embedding is a temporal filter), but not the shape, so this label is the one
on which pretraining can show (``docs/video.md``). The video quickstart uses it as the clip
version of the image quickstart: several instances of the class's shape (``num_objects`` a
range) on a noisy flat background, all drifting together.

Why the texture: a small model learns the motion of a dense texture within a few dozen
supervised steps, but not that of one small shape on a flat background, where most tubelet
tokens are static and carry no motion at all (docs/video.md has the figures).

Clips are ``uint8 [T, 3, H, W]``, deterministic per ``(seed, split, index)``, rendered with the
image generator's own shape functions (:mod:`ijepa.data.shapes`).
"""

from __future__ import annotations

import colorsys
import math

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ijepa.data.shapes import CHUNK_POINTS, CLASSES, MIN_CONTRAST, index_seed, render_scenes, rgb_distance, supersample

DIRECTIONS: tuple[str, ...] = ("right", "down_right", "down", "down_left", "left", "up_left", "up", "up_right")
BACKGROUNDS: tuple[str, ...] = ("texture", "plain", "noisy")
LABELS: tuple[str, ...] = ("direction", "shape")
_TEXTURE_CUTOFF = 3.0 / 32  # Gaussian low-pass width of the texture, in cycles per pixel
_TEXTURE_CONTRAST = 0.25  # standard deviation of the texture around the background colour


def translating_texture(noise: Tensor, velocity: tuple[float, float], num_frames: int, cutoff: float) -> Tensor:
    """A smooth periodic texture and its translations: ``noise [C, H, W]`` white noise ->
    ``[T, C, H, W]`` with unit standard deviation, frame ``t`` shifted by ``t * velocity``
    (``(vx, vy)`` pixels) on the torus.

    The texture is band-limited (a Gaussian low-pass of width ``cutoff`` cycles per pixel), so a
    sub-pixel shift is exact: it is a phase ramp on the Fourier coefficients.
    """
    height, width = noise.shape[-2:]
    fy = torch.fft.fftfreq(height, dtype=torch.float64).view(-1, 1)
    fx = torch.fft.fftfreq(width, dtype=torch.float64).view(1, -1)
    spectrum = torch.fft.fft2(noise.double()) * torch.exp(-(fx**2 + fy**2) / (2 * cutoff**2))
    t = torch.arange(num_frames, dtype=torch.float64).view(-1, 1, 1, 1)
    phase = torch.exp(-2j * math.pi * t * (fx * velocity[0] + fy * velocity[1]))
    frames = torch.fft.ifft2(spectrum * phase).real
    return (frames / frames[0].std().clamp_min(1e-12)).float()


def object_range(num_objects) -> tuple[int, int]:
    """``num_objects`` (an int, or an inclusive ``(min, max)`` range) as ``(min, max)``."""
    values = (num_objects, num_objects) if isinstance(num_objects, int) else tuple(num_objects)
    if (
        len(values) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in values)
        or not 1 <= values[0] <= values[1]
    ):
        raise ValueError(
            f"num_objects must be an int >= 1 or a range (min, max) with 1 <= min <= max, got {num_objects!r}."
        )
    return values


def check_clip_options(
    num_directions: int,
    speed: tuple[float, float],
    radius: tuple[float, float],
    background: str,
    num_objects,
    label: str,
    fps: float | None,
    directions_name: str = "num_directions",
) -> None:
    """The checks of the options a :class:`MovingShapesClips` and its source
    (:class:`ijepa.data.sources.MovingShapesSource`, whose option is ``directions``) share, so the
    source refuses them when built (the upper bound of ``speed`` depends on the image size and is
    checked with the clips)."""
    if num_directions not in (4, 8):
        raise ValueError(f"{directions_name} must be 4 or 8, got {num_directions}.")
    if len(speed) != 2 or not 0 < speed[0] <= speed[1] < math.inf:
        raise ValueError(f"speed must be (min, max) pixels per frame with 0 < min <= max, got {speed}.")
    if len(radius) != 2 or not 0 < radius[0] <= radius[1] <= 0.5:
        raise ValueError(f"radius must be (min, max) with 0 < min <= max <= 0.5, got {radius}.")
    if background not in BACKGROUNDS:
        raise ValueError(f"background must be one of {BACKGROUNDS}, got {background!r}.")
    object_range(num_objects)
    if label not in LABELS:
        raise ValueError(f"label must be one of {LABELS}, got {label!r}.")
    if fps is not None and not 0 < fps < math.inf:
        raise ValueError(f"fps must be > 0 or None, got {fps}.")


class MovingShapesClips(Dataset):
    """``num_samples`` clips of ``num_frames`` frames at ``image_size`` px; label = direction (or shape).

    Args:
        num_samples: clips in the split.
        num_frames: frames per clip.
        image_size: frame side in pixels.
        split: ``train`` or ``val`` (independent draws).
        seed: generator seed.
        num_directions: 4 (right, down, left, up) or 8 (with the diagonals).
        speed: (min, max) pixels per frame, drawn per clip.
        radius: (min, max) shape radius as a fraction of ``image_size``.
        background: ``texture`` (a smooth colour texture moving with the shape) or ``plain``.
        num_objects: instances of the clip's shape (own position, size, rotation, colour), an
            int or an inclusive ``(min, max)`` range drawn per clip, all
            moving with the same velocity.
        fps: when set, the clips' nominal frame rate: items become ``(clip, label, frame_times)``
            with ``frame_times [T] = t / fps`` seconds (for M-RoPE's timestamps).
        label: ``direction`` (the class is the motion) or ``shape`` (the class is the shape's
            kind; directions are drawn at random).
        transform: applied to the ``uint8 [T, 3, H, W]`` clip.
        cache: render every clip once at construction (``N * T * 3 * H * W`` bytes; frames
            rendered in batches) instead of on every access; both give the same clips.
    """

    def __init__(
        self,
        num_samples: int,
        num_frames: int = 8,
        image_size: int = 32,
        split: str = "train",
        seed: int = 0,
        num_directions: int = 4,
        speed: tuple[float, float] = (1.0, 2.0),
        radius: tuple[float, float] = (0.12, 0.2),
        background: str = "texture",
        fps: float | None = None,
        num_objects: int | tuple[int, int] = 1,
        label: str = "direction",
        transform=None,
        cache: bool = False,
    ):
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
        if num_frames < 2:
            raise ValueError(f"num_frames must be >= 2 (motion needs two frames), got {num_frames}.")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8 pixels, got {image_size}.")
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}.")
        check_clip_options(num_directions, speed, radius, background, num_objects, label, fps)
        if not speed[1] < image_size / 2:
            raise ValueError(
                f"speed must be (min, max) pixels per frame with 0 < min <= max < image_size / 2, got {speed}."
            )
        self.num_samples, self.num_frames, self.image_size = num_samples, num_frames, image_size
        self.split, self.seed, self.num_directions = split, seed, num_directions
        self.speed, self.radius, self.transform = tuple(speed), tuple(radius), transform
        self.object_range = object_range(num_objects)
        self.background, self.fps, self.num_objects, self.label = background, fps, num_objects, label
        self.directions = DIRECTIONS[:: 8 // num_directions]
        if label == "direction":
            self.directions_of = [i % num_directions for i in range(num_samples)]
            self.targets = self.directions_of
        else:  # balanced shapes; the direction a function of the clip's seed
            self.targets = [i % len(CLASSES) for i in range(num_samples)]
            self.directions_of = [index_seed(seed + 7919, split, i) % num_directions for i in range(num_samples)]
        self.clips: Tensor | None = self._render_all() if cache else None

    @property
    def num_classes(self) -> int:
        return self.num_directions if self.label == "direction" else len(CLASSES)

    def __len__(self) -> int:
        return self.num_samples

    def clip_parameters(self, index: int) -> dict:
        """Everything random about clip ``index``: shape, colours, start, velocity."""
        g = torch.Generator().manual_seed(index_seed(self.seed, self.split, index))
        u = torch.rand(12, generator=g, dtype=torch.float64).tolist()
        size = self.image_size
        angle = (
            2 * math.pi * self.directions_of[index] / self.num_directions
        )  # 0 = right, clockwise in image coordinates
        speed = self.speed[0] + (self.speed[1] - self.speed[0]) * u[0]
        radius = size * (self.radius[0] + (self.radius[1] - self.radius[0]) * u[1])
        theta = 2 * math.pi * u[2]
        fg = colorsys.hsv_to_rgb(u[3], 0.65 + 0.35 * u[4], 0.75 + 0.25 * u[5])
        bg = colorsys.hsv_to_rgb(u[6], 0.35 * u[7], 0.05 + 0.9 * u[8])
        if rgb_distance(fg, bg) < MIN_CONTRAST:
            bg = max(((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)), key=lambda c: rgb_distance(c, fg))
        objects = [
            dict(
                x0=size * u[10],
                y0=size * u[11],
                radius=radius,
                c=math.cos(theta) / radius,
                s=math.sin(theta) / radius,
                fg=fg,
            )
        ]
        noise = torch.randn(self.num_frames, 3, size, size, generator=g)
        texture = torch.randn(3, size, size, generator=g)
        low, high = self.object_range
        count = low if low == high else low + int(torch.randint(high - low + 1, (1,), generator=g))
        for _ in range(count - 1):  # more instances of the clip's shape, all moving together
            x, y, r, a, h, sat, val = torch.rand(7, generator=g, dtype=torch.float64).tolist()
            r = size * (self.radius[0] + (self.radius[1] - self.radius[0]) * r)
            objects.append(
                dict(
                    x0=size * x,
                    y0=size * y,
                    radius=r,
                    c=math.cos(2 * math.pi * a) / r,
                    s=math.sin(2 * math.pi * a) / r,
                    fg=colorsys.hsv_to_rgb(h, 0.65 + 0.35 * sat, 0.75 + 0.25 * val),
                )
            )
        shape = self.targets[index] if self.label == "shape" else int(u[9] * len(CLASSES)) % len(CLASSES)
        return dict(
            shape=shape,
            objects=objects,
            vx=speed * math.cos(angle),
            vy=speed * math.sin(angle),
            bg=bg,
            noise=noise,
            texture=texture,
        )

    def frames(self, index: int) -> tuple[list[dict], Tensor | None]:
        """Clip ``index``'s per-frame render parameters and its background ``[T, 3, H, W]`` (or
        ``None`` on a plain background)."""
        p, size = self.clip_parameters(index), self.image_size
        frames = []
        for t in range(self.num_frames):
            copies = []
            for o in p["objects"]:
                cx, cy = (o["x0"] + p["vx"] * t) % size, (o["y0"] + p["vy"] * t) % size
                # the torus: the shape and its copies one image-width away, so it wraps at the edges
                reach = 1.5 * o["radius"]  # every shape fits in a disc of its radius * sqrt(2)
                copies += [
                    dict(cx=cx + dx, cy=cy + dy, c=o["c"], s=o["s"], fg=o["fg"])
                    for dx in (-size, 0, size)
                    for dy in (-size, 0, size)
                    if -reach < cx + dx < size + reach and -reach < cy + dy < size + reach
                ]
            frames.append(dict(label=p["shape"], objects=copies, bg=p["bg"], noise=p["noise"][t]))
        if self.background != "texture":
            return frames, None
        texture = translating_texture(p["texture"], (p["vx"], p["vy"]), self.num_frames, _TEXTURE_CUTOFF * 32 / size)
        # Around mid-grey, not the clip's background colour: a colour shared by a whole clip is
        # an easy, motion-free latent that the JEPA's features and the probes latch onto.
        return frames, 0.5 + _TEXTURE_CONTRAST * texture

    def render_many(self, indices) -> Tensor:
        """Clips ``indices`` as ``uint8 [n, T, 3, H, W]``, their frames rendered in one batch."""
        frames, bases = [], []
        for index in indices:
            clip_frames, base = self.frames(index)
            frames += clip_frames
            bases.append(base)
        base = None if self.background != "texture" else torch.cat(bases)
        size = self.image_size
        noise = "noisy" if self.background == "noisy" else "plain"  # the noise level of render_scenes
        return render_scenes(frames, size, noise, base=base).view(len(indices), self.num_frames, 3, size, size)

    def render(self, index: int) -> Tensor:
        """Clip ``index`` as ``uint8 [T, 3, H, W]``."""
        if self.clips is not None:
            return self.clips[index]
        return self.render_many([index])[0]

    def _render_all(self) -> Tensor:
        per_clip = self.num_frames * (self.image_size * supersample(self.image_size)) ** 2
        chunk = max(1, CHUNK_POINTS // per_clip)
        out = torch.empty(self.num_samples, self.num_frames, 3, self.image_size, self.image_size, dtype=torch.uint8)
        for start in range(0, self.num_samples, chunk):
            stop = min(start + chunk, self.num_samples)
            out[start:stop] = self.render_many(range(start, stop))
        return out

    def __getitem__(self, index: int) -> tuple[Tensor, int] | tuple[Tensor, int, Tensor]:
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} clips")
        index %= self.num_samples
        clip = self.render(index)
        if self.transform is not None:
            clip = self.transform(clip)
        if self.fps is None:
            return clip, self.targets[index]
        return clip, self.targets[index], torch.arange(self.num_frames, dtype=torch.float32) / self.fps
