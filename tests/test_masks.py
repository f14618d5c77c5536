import math

import pytest
import torch

from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler, context_padding_mask


@pytest.mark.parametrize("policy", ["pad", "thin"])
def test_mask_invariants_over_many_batches(policy):
    grid = 12
    sampler = MultiBlockMaskSampler(grid, context_policy=policy)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        context, targets = sampler(16, gen)
        real = context_padding_mask(context)
        b, m, kt = targets.shape
        assert (b, m) == (16, 4) and context.shape[0] == 16
        assert context.min() >= 0 and context.max() < grid * grid
        assert targets.min() >= 0 and targets.max() < grid * grid
        assert real.sum(1).min() >= sampler.min_keep
        if policy == "thin":
            assert real.all()
        for i in range(b):
            kept = context[i][real[i]].tolist()
            assert kept == sorted(set(kept)), "real context indices are unique and increasing"
            assert (context[i][~real[i]] == kept[-1]).all(), "padding repeats the last real index"
            ctx = set(kept)
            for block in targets[i]:
                cells = block.tolist()
                assert not ctx & set(cells), "context and targets must be disjoint"
                rows = {c // grid for c in cells}
                cols = {c % grid for c in cells}
                # a contiguous rectangle of exactly len(rows) x len(cols) cells
                assert len(cells) == len(rows) * len(cols) == kt
                assert max(rows) - min(rows) + 1 == len(rows)
                assert max(cols) - min(cols) + 1 == len(cols)


def test_pad_keeps_every_context_patch_that_thin_cuts():
    pad = MultiBlockMaskSampler(12, context_policy="pad")
    thin = MultiBlockMaskSampler(12, context_policy="thin")
    kept_pad = kept_thin = 0
    for seed in range(40):
        padded, targets_pad = pad(32, torch.Generator().manual_seed(seed))
        thinned, targets_thin = thin(32, torch.Generator().manual_seed(seed))
        assert torch.equal(targets_pad, targets_thin)  # same draws up to the context policy
        real = context_padding_mask(padded)
        for i in range(32):
            full = set(padded[i][real[i]].tolist())
            assert set(thinned[i].tolist()) <= full
        assert thinned.shape[1] == int(real.sum(1).min())  # thin keeps the batch's shortest
        kept_pad += int(real.sum())
        kept_thin += thinned.numel()
    # thin discards a large share of the context on a 12x12 grid (measured: 32-41%, docs/data_and_masks.md)
    assert 0.2 < 1 - kept_thin / kept_pad < 0.5


def uniform_coverage(grid: int, height: int, width: int) -> torch.Tensor:
    """Probability that each cell is inside one ``height x width`` block whose corner is uniform
    over the ``(G - h + 1) x (G - w + 1)`` positions inside the grid, ``[G, G]``."""

    def axis(size):
        starts = torch.arange(grid - size + 1)
        cells = torch.arange(grid)
        return ((cells[None] >= starts[:, None]) & (cells[None] < starts[:, None] + size)).float().mean(0)

    return axis(height)[:, None] * axis(width)[None, :]


def test_block_corners_are_uniform_over_every_valid_position():
    sampler = MultiBlockMaskSampler(12)
    top, left = sampler.place_blocks(200_000, 4, 3, torch.Generator().manual_seed(0))
    assert int(top.min()) == 0 and int(top.max()) == 12 - 4  # the last row is reachable, never past it
    assert int(left.min()) == 0 and int(left.max()) == 12 - 3
    freq = torch.bincount(top, minlength=9).float() / top.numel()
    assert torch.allclose(freq, torch.full((9,), 1 / 9), atol=0.005)  # edges no likelier than the rest


def test_target_coverage_matches_the_uniform_placement_distribution_centre_highest():
    grid, count = 12, 50_000
    sampler = MultiBlockMaskSampler(grid)
    top, left = sampler.place_blocks(count, 4, 5, torch.Generator().manual_seed(1))
    coverage = sampler._block_masks(top, left, 4, 5).float().mean(0).view(grid, grid)
    expected = uniform_coverage(grid, 4, 5)
    assert torch.allclose(coverage, expected, atol=0.01)
    # covered most at the centre and least at the corners, as in I-JEPA's placement
    assert expected[5:7, 5:7].min() == expected.max() and expected[0, 0] == expected.min()
    assert float(expected[0, 0]) == pytest.approx(1 / 9 * 1 / 8)


def test_block_shapes_respect_scale_and_aspect_ranges():
    grid = 32  # large grid: rounding to whole patches costs little
    sampler = MultiBlockMaskSampler(grid, target_scale=(0.15, 0.2), target_aspect_ratio=(0.75, 1.5))
    gen = torch.Generator().manual_seed(1)
    n = grid * grid
    for _ in range(300):
        h, w = sampler.block_shape(sampler.target_scale, sampler.target_aspect_ratio, gen)
        # rounding h and w each by at most 1/2 patch
        lo = (math.sqrt(0.15 * n * 0.75) - 0.5) * (math.sqrt(0.15 * n / 1.5) - 0.5) / n
        hi = (math.sqrt(0.2 * n * 1.5) + 0.5) * (math.sqrt(0.2 * n / 0.75) + 0.5) / n
        assert lo <= h * w / n <= hi
        assert 0.75 * 0.9 <= h / w <= 1.5 * 1.1
    context_h, context_w = sampler.block_shape(sampler.context_scale, sampler.context_aspect_ratio, gen)
    assert context_h == context_w and 0.85 * n * 0.9 <= context_h * context_w <= n


def test_every_position_is_a_target_and_the_grid_is_covered_symmetrically():
    for grid in (6, 12):
        sampler = MultiBlockMaskSampler(grid)
        gen = torch.Generator().manual_seed(2)
        counts = torch.zeros(grid * grid)
        for _ in range(400):
            _, targets = sampler(32, gen)
            counts += torch.bincount(targets.flatten(), minlength=grid * grid)
        freq = (counts / counts.sum()).view(grid, grid)
        # every cell reachable; the last row as often as the first (the official sampler never
        # masks the last row and column)
        assert counts.min() > 0
        assert freq[-1].mean() / freq[0].mean() == pytest.approx(1.0, rel=0.15)
        assert freq[:, -1].mean() / freq[:, 0].mean() == pytest.approx(1.0, rel=0.15)
        assert freq[grid // 2].mean() > freq[0].mean()  # the centre more than the edges


def test_contexts_equal_length_and_thinned_without_spatial_bias():
    sampler = MultiBlockMaskSampler(8, context_policy="thin")
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(64)
    for _ in range(300):
        context, _ = sampler(16, gen)
        counts += torch.bincount(context.flatten(), minlength=64)
    grid = counts.view(8, 8)
    # Truncating sorted indices would starve the bottom rows; random thinning does not.
    assert grid[-1].sum() / grid[0].sum() == pytest.approx(1.0, rel=0.15)


def test_sampler_is_reproducible_with_a_generator():
    sampler = MultiBlockMaskSampler(10)
    a = sampler(8, torch.Generator().manual_seed(5))
    b = sampler(8, torch.Generator().manual_seed(5))
    c = sampler(8, torch.Generator().manual_seed(6))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not (torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]))


def test_small_grids_never_hang_and_unsatisfiable_settings_raise():
    # a 2x2 grid works with small targets
    context, targets = MultiBlockMaskSampler(2, num_target_blocks=1, target_scale=(0.25, 0.25), min_keep=1)(4)
    assert context.shape[1] >= 1 and targets.shape == (4, 1, 1)
    # targets covering the whole grid leave no context: a clear error, not a hang
    sampler = MultiBlockMaskSampler(4, num_target_blocks=4, target_scale=(0.9, 1.0), min_keep=2)
    with pytest.raises(ValueError, match="min_keep=2 .* 4x4 grid"):
        sampler.check()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(grid_size=1), "grid_size"),
        (dict(grid_size=6, num_target_blocks=0), "num_target_blocks"),
        (dict(grid_size=6, target_scale=(0.2, 0.1)), r"target_scale must be \(min, max\) with 0.0 < min <= max <= 1.0"),
        (dict(grid_size=6, target_scale=(0.2, 1.5)), "target_scale"),
        (dict(grid_size=6, context_scale=(0.0, 1.0)), "context_scale"),
        (dict(grid_size=6, target_aspect_ratio=(-1.0, 1.0)), "target_aspect_ratio"),
        (dict(grid_size=6, min_keep=36), r"min_keep must be in \[1, 35\]"),
        (dict(grid_size=6, context_policy="drop"), "context_policy must be one of"),
    ],
)
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiBlockMaskSampler(**kwargs)


def test_collator_builds_masked_batch():
    collate = MaskCollator(MultiBlockMaskSampler(4, min_keep=1, context_policy="pad"))
    samples = [(torch.randn(3, 32, 32), i) for i in range(5)]
    batch = collate(samples)
    assert batch.images.shape == (5, 3, 32, 32)
    assert batch.labels.tolist() == [0, 1, 2, 3, 4]
    assert batch.context_indices.shape[0] == 5
    assert batch.target_indices.shape[:2] == (5, 4)
    assert torch.equal(batch.context_mask, context_padding_mask(batch.context_indices))
    assert MaskCollator(MultiBlockMaskSampler(4, min_keep=1, context_policy="thin"))(samples).context_mask is None


def test_collator_samples_several_mask_sets_per_image_in_blocks_of_the_batch():
    collate = MaskCollator(MultiBlockMaskSampler(6, min_keep=2), masks_per_image=3)
    samples = [(torch.randn(3, 48, 48), i) for i in range(4)]
    batch = collate(samples)
    assert batch.images.shape[0] == 4
    assert batch.context_indices.shape[0] == 12 and batch.target_indices.shape[:2] == (12, 4)
    # each image gets three different mask sets (rows i, 4 + i, 8 + i)
    for i in range(4):
        sets = {tuple(batch.target_indices[r * 4 + i].flatten().tolist()) for r in range(3)}
        assert len(sets) == 3
    with pytest.raises(ValueError, match="masks_per_image"):
        MaskCollator(MultiBlockMaskSampler(6), masks_per_image=0)
