"""Pictures: the tensor-to-image helpers behind the TensorBoard callbacks and the notebooks.

Plain functions on tensors, no Lightning. Images are float ``[3, H, W]`` (batches ``[B, 3, H, W]``)
in [0, 1]; maps over the patch grid are ``[G_h, G_w]``, row-major (``i = r * G_w + c``).

* :func:`heat_image` / :func:`heat_map`: a map (or per-position values) as a dark-to-yellow image;
* :func:`patch_grid_image`: an image with its patch grid and patch indices drawn on it;
* :func:`mask_overlay` / :func:`clip_mask_overlay`: context and target blocks tinted over images or clips;
* :func:`cosine_similarity_grid`: ViT's Figure 7 for a position table;
* :func:`enlarged`: an image blown up to a readable size (at least 256 px a side in TensorBoard);
* :func:`line_chart`: panels of lines with error bars (the studies' figures);
* :func:`to_png`: PNG bytes for a notebook or a file.
"""

from __future__ import annotations

import io
import math

import torch
import torch.nn.functional as F
from PIL import ImageDraw
from torchvision.transforms.v2.functional import pil_to_tensor, to_pil_image

# Context tint and one colour per target block (RGB in [0, 1]).
CONTEXT_COLOUR = (0.2, 0.4, 1.0)
TARGET_COLOURS = ((1.0, 0.2, 0.2), (1.0, 0.8, 0.1), (0.2, 0.9, 0.3), (1.0, 0.3, 1.0), (0.1, 0.9, 0.9), (1.0, 0.5, 0.0))


def to_png(image: torch.Tensor) -> bytes:
    """``[3 or 1, H, W]`` in [0, 1] -> PNG bytes (for ``marimo.image`` or a file)."""
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    buffer = io.BytesIO()
    to_pil_image(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def heat_image(
    values: torch.Tensor, cell: int = 16, low: float | None = None, high: float | None = None
) -> torch.Tensor:
    """A ``[G_h, G_w]`` map -> ``[3, G_h * cell, G_w * cell]`` image, dark (low) to bright yellow
    (high), scaled between ``low`` and ``high`` (default: the map's finite min and max); NaN is grey."""
    grid = values.detach().float().cpu()
    finite = torch.isfinite(grid)
    if low is None or high is None:
        low_, high_ = (float(grid[finite].min()), float(grid[finite].max())) if finite.any() else (0.0, 1.0)
        low = low_ if low is None else low
        high = high_ if high is None else high
    scaled = ((grid - low) / (high - low + 1e-12)).clamp(0, 1)
    image = torch.stack([scaled, scaled**2, 0.3 * (1 - scaled)])  # a simple perceptual-ish ramp
    image = torch.where(finite, image, torch.full_like(image, 0.5))
    return image.repeat_interleave(cell, 1).repeat_interleave(cell, 2)


def heat_map(values: torch.Tensor, grid_size: int | tuple[int, int, int], cell: int = 8) -> torch.Tensor:
    """``[N]`` values -> ``[3, G * cell, G * cell]`` image, dark (low) to bright yellow (high);
    positions never predicted (NaN) are grey (:func:`heat_image`). For a clip
    grid ``(T', H', W')`` the ``T'`` time slices sit side by side: ``[3, H' * cell, T' W' * cell]``."""
    if isinstance(grid_size, int):
        grid = values.view(grid_size, grid_size)
    else:
        grid_t, grid_h, grid_w = grid_size
        grid = values.view(grid_t, grid_h, grid_w).permute(1, 0, 2).reshape(grid_h, grid_t * grid_w)
    return heat_image(grid, cell).to(values.device)


def patch_grid_image(image: torch.Tensor, patch_size: int, scale: int = 4, indices: bool = True) -> torch.Tensor:
    """``image [3, H, W]`` upscaled ``scale`` times, with white lines between patches and, if
    ``indices``, each patch's row-major index ``r * G + c`` written in its top-left corner."""
    if image.dim() != 3 or image.size(1) % patch_size or image.size(2) % patch_size:
        raise ValueError(
            f"image must be [C, H, W] with H and W multiples of patch_size={patch_size}, got {tuple(image.shape)}."
        )
    big = image.detach().float().cpu().repeat_interleave(scale, 1).repeat_interleave(scale, 2).clone()
    step = patch_size * scale
    big[:, ::step, :] = 1.0
    big[:, :, ::step] = 1.0
    if indices:
        picture = to_pil_image(big)
        draw = ImageDraw.Draw(picture)
        grid_w = image.size(2) // patch_size
        for r in range(image.size(1) // patch_size):
            for c in range(grid_w):
                draw.text((c * step + 2, r * step + 1), str(r * grid_w + c), fill=(255, 255, 0))
        big = pil_to_tensor(picture).float() / 255
    return big


def _token_tints(
    batch: int, num_tokens: int, context_indices: torch.Tensor, target_indices: torch.Tensor, device
) -> tuple[torch.Tensor, torch.Tensor]:
    # Per token: its tint [B, N, 3] (context blue, block m its colour, drawn over the context)
    # and whether it is painted at all [B, N].
    colour = torch.zeros(batch, num_tokens, 3, device=device)
    painted = torch.zeros(batch, num_tokens, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)[:, None]
    colour[rows, context_indices] = torch.tensor(CONTEXT_COLOUR, device=device)
    painted[rows, context_indices] = True
    for block in range(target_indices.size(1)):
        colour[rows, target_indices[:, block]] = torch.tensor(
            TARGET_COLOURS[block % len(TARGET_COLOURS)], device=device
        )
        painted[rows, target_indices[:, block]] = True
    return colour, painted


def mask_overlay(
    images: torch.Tensor,
    context_indices: torch.Tensor,
    target_indices: torch.Tensor,
    patch_size: int,
    alpha: float = 0.5,
) -> torch.Tensor:
    """Images ``[B, 3, H, W]`` in [0, 1] with the context patches tinted blue and each target
    block ``m`` tinted with ``TARGET_COLOURS[m]`` (targets drawn over the context); patches in
    neither are darkened. Returns ``[B, 3, H, W]`` in [0, 1]."""
    batch, _, height, width = images.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    colour, painted = _token_tints(batch, grid_h * grid_w, context_indices, target_indices, images.device)
    # per-patch maps -> per-pixel maps
    colour = colour.view(batch, grid_h, grid_w, 3).permute(0, 3, 1, 2)
    colour = colour.repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    painted = painted.view(batch, 1, grid_h, grid_w).repeat_interleave(patch_size, 2).repeat_interleave(patch_size, 3)
    tinted = (1 - alpha) * images + alpha * colour
    return torch.where(painted, tinted, 0.35 * images)


def clip_mask_overlay(
    clips: torch.Tensor,
    context_indices: torch.Tensor,
    target_indices: torch.Tensor,
    patch_size: int,
    tubelet_size: int,
    alpha: float = 0.5,
) -> torch.Tensor:
    """Clips ``[B, 3, T, H, W]`` in [0, 1] with the masks of their ``T' x H' x W'`` token grid:
    the first frame of each tubelet, tinted as :func:`mask_overlay` does, side by side in time
    order. Returns ``[B, 3, H, T' * W]``."""
    batch, _, frames, height, width = clips.shape
    grid_t, grid_h, grid_w = frames // tubelet_size, height // patch_size, width // patch_size
    colour, painted = _token_tints(batch, grid_t * grid_h * grid_w, context_indices, target_indices, clips.device)
    colour = colour.view(batch, grid_t, grid_h, grid_w, 3).permute(0, 4, 1, 2, 3)  # [B, 3, T', H', W']
    colour = colour.repeat_interleave(patch_size, 3).repeat_interleave(patch_size, 4)
    painted = (
        painted.view(batch, 1, grid_t, grid_h, grid_w).repeat_interleave(patch_size, 3).repeat_interleave(patch_size, 4)
    )
    shown = clips[:, :, ::tubelet_size]  # [B, 3, T', H, W]
    tinted = torch.where(painted, (1 - alpha) * shown + alpha * colour, 0.35 * shown)
    return tinted.permute(0, 1, 3, 2, 4).reshape(batch, 3, height, grid_t * width)


def cosine_similarity_grid(
    table: torch.Tensor, grid_height: int, grid_width: int, pad: int = 1, own_range: bool = False
) -> torch.Tensor:
    """ViT's Figure 7: for every position ``(r, c)`` a ``grid_height x grid_width`` tile of the
    cosine similarity of its embedding with every position, tiles laid out on the grid.

    ``table [N, D] -> image [1, H * (h + pad) - pad, W * (w + pad) - pad]`` with values in [0, 1]:
    the similarity mapped from [-1, 1], or with ``own_range`` from the table's own lowest to
    highest similarity (sinusoidal tables span a narrow band near 1, which the fixed range shows
    as one white square); padding is 0.
    """
    n = grid_height * grid_width
    if table.dim() != 2 or table.size(0) != n:
        raise ValueError(f"table must be [{n}, D] for a {grid_height}x{grid_width} grid, got {tuple(table.shape)}.")
    unit = F.normalize(table.detach().float(), dim=1)
    similarity = unit @ unit.T
    low, high = (similarity.min(), similarity.max()) if own_range else (-1.0, 1.0)
    tiles = ((similarity - low) / max(float(high - low), 1e-12)).view(grid_height, grid_width, grid_height, grid_width)
    tiles = F.pad(tiles, (0, pad, 0, pad))  # pad each tile's right and bottom
    image = tiles.permute(0, 2, 1, 3).reshape(grid_height * (grid_height + pad), grid_width * (grid_width + pad))
    return image[: image.size(0) - pad, : image.size(1) - pad].unsqueeze(0)


def enlarged(image: torch.Tensor, min_side: int = 256) -> torch.Tensor:
    """``image [C, H, W]`` enlarged by the smallest whole factor that gives its short side at
    least ``min_side`` pixels, each pixel a block (no smoothing across cells); as it is when
    already that large. What the TensorBoard callbacks log: a 6 x 6 grid is readable."""
    factor = max(1, math.ceil(min_side / min(image.shape[-2:])))
    return image.repeat_interleave(factor, -2).repeat_interleave(factor, -1) if factor > 1 else image


# Line colours of line_chart (RGB 0-255), distinct on white.
LINE_COLOURS = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)


def line_chart(
    panels: list[tuple[str, dict[str, list[tuple[float, float, float]]]]],
    x_label: str,
    y_label: str,
    x_ticks: list[float],
    log_x: bool = True,
    size: tuple[int, int] = (420, 320),
) -> torch.Tensor:
    """Side-by-side panels of lines with error bars -> ``[3, H, W]`` in [0, 1] (:func:`to_png` writes it).

    ``panels``: ``(title, {line name: [(x, y, spread), ...]})``. The panels share the x ticks
    ``x_ticks`` (log-scaled when ``log_x``) and one legend, in the lines' first-seen order; each
    has its own y range. ``spread`` draws a bar ``y ± spread``."""
    width, height = size
    left, right, top, bottom = 52, 12, 26, 40
    names = list(dict.fromkeys(name for _, lines in panels for name in lines))
    legend_height = 16 * math.ceil(len(names) / 4) + 8
    canvas_w, canvas_h = width * len(panels), height + legend_height
    image = to_pil_image(torch.full((3, canvas_h, canvas_w), 255, dtype=torch.uint8))
    draw = ImageDraw.Draw(image)
    fx = (lambda x: math.log2(x)) if log_x else (lambda x: x)
    x_low, x_high = fx(min(x_ticks)), fx(max(x_ticks))
    x_span = (x_high - x_low) or 1.0

    for p, (title, lines) in enumerate(panels):
        ox = p * width
        values = [(y - s, y + s) for points in lines.values() for _, y, s in points]
        y_low, y_high = min(v[0] for v in values), max(v[1] for v in values)
        pad = 0.05 * (y_high - y_low or 1.0)
        y_low, y_high = y_low - pad, y_high + pad

        def to_xy(x: float, y: float, ox=ox, y_low=y_low, y_high=y_high) -> tuple[float, float]:
            px = ox + left + (fx(x) - x_low) / x_span * (width - left - right)
            py = top + (y_high - y) / (y_high - y_low) * (height - top - bottom)
            return px, py

        draw.rectangle([ox + left, top, ox + width - right, height - bottom], outline=(0, 0, 0))
        draw.text((ox + left, 6), f"{title} ({y_label})" if p == 0 else title, fill=(0, 0, 0))
        for x in x_ticks:
            px, _ = to_xy(x, y_low)
            draw.line([px, height - bottom, px, height - bottom + 4], fill=(0, 0, 0))
            draw.text((px - 8, height - bottom + 6), f"{x:.2g}", fill=(0, 0, 0))
        for i in range(5):
            y = y_low + (y_high - y_low) * i / 4
            _, py = to_xy(x_ticks[0], y)
            draw.line([ox + left - 4, py, ox + left, py], fill=(0, 0, 0))
            draw.text((ox + 4, py - 6), f"{y:.1f}", fill=(0, 0, 0))
        draw.text((ox + left + (width - left - right) // 2 - 30, height - 16), x_label, fill=(0, 0, 0))
        for name, points in lines.items():
            colour = LINE_COLOURS[names.index(name) % len(LINE_COLOURS)]
            xy = [to_xy(x, y) for x, y, _ in sorted(points)]
            if len(xy) > 1:
                draw.line(xy, fill=colour, width=2)
            for (x, y, s), (px, py) in zip(sorted(points), xy):
                _, lo = to_xy(x, y - s)
                _, hi = to_xy(x, y + s)
                draw.line([px, lo, px, hi], fill=colour)
                draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colour)
    for i, name in enumerate(names):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        lx, ly = 10 + (i % 4) * (canvas_w - 20) // 4, height + 4 + 16 * (i // 4)
        draw.line([lx, ly + 6, lx + 18, ly + 6], fill=colour, width=3)
        draw.text((lx + 24, ly), name, fill=(0, 0, 0))
    return pil_to_tensor(image).float() / 255
