"""Mask statistics of ``docs/data_and_masks.md``: where targets land and how much context survives.

    python -m ijepa.studies.mask_coverage --grid 12 --batches 2000 --batch-size 256

Prints, for target blocks placed three ways with the sampler's own block shapes,

* ``ours``: the corner uniform over ``[0, G - h]`` (:meth:`MultiBlockMaskSampler.place_blocks`),
* ``official``: the official I-JEPA sampler's ``randint(0, G - h)``, i.e. ``[0, G - h - 1]``,
* ``clamped``: this project's earlier placement, a corner in ``[-(h - 1), G - 1]`` pushed back
  inside the grid,

the share of images whose targets cover each row (averaged over the columns), and then the
context each image keeps under the context policies (``pad`` keeps it all, ``thin`` cuts it to
the batch's shortest, ``static`` cuts or pads it to one count per run and pads every target
block to one size).
"""

from __future__ import annotations

import argparse

import torch

from ijepa.masks import MultiBlockMaskSampler, context_padding_mask


def corners(policy: str, count: int, size: int, grid: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` block corners along one axis for a block of ``size`` cells under ``policy``."""
    if policy == "ours":
        return torch.randint(0, grid - size + 1, (count,), generator=generator)
    if policy == "official":
        return torch.randint(0, max(grid - size, 1), (count,), generator=generator)
    return torch.randint(-(size - 1), grid, (count,), generator=generator).clamp(0, grid - size)


def row_coverage(policy: str, grid: int, batches: int, batch_size: int, num_blocks: int, seed: int = 0) -> torch.Tensor:
    """Share of images whose target blocks cover each cell, ``[G, G]``, block shapes drawn per batch."""
    sampler = MultiBlockMaskSampler(grid, num_blocks)
    generator = torch.Generator().manual_seed(seed)
    covered = torch.zeros(grid * grid)
    for _ in range(batches):
        height, width = sampler.block_shape(sampler.target_scale, sampler.target_aspect_ratio, generator)
        n = batch_size * num_blocks
        top = corners(policy, n, height, grid, generator)
        left = corners(policy, n, width, grid, generator)
        masks = sampler._block_masks(top, left, height, width).view(batch_size, num_blocks, -1).any(1)
        covered += masks.float().sum(0)
    return (covered / (batches * batch_size)).view(grid, grid)


def context_sizes(grid: int, batches: int, batch_size: int, seed: int = 0) -> dict[str, float]:
    """Context kept per image under ``pad``, ``thin`` and ``static`` on the same draws, and the
    target slots ``static`` pads."""
    pad = MultiBlockMaskSampler(grid, context_policy="pad")
    static = MultiBlockMaskSampler(grid, context_policy="static")
    generator = torch.Generator().manual_seed(seed)
    available, thinned, small, target_sizes = [], [], 0, []
    for _ in range(batches):
        context, targets = pad(batch_size, generator)
        sizes = context_padding_mask(context).sum(1).float()
        available.append(sizes)
        thinned.append(sizes.min().expand_as(sizes))
        small += int(sizes.min() <= 17)
        target_sizes.append(targets.size(-1))
    available, thinned = torch.cat(available), torch.cat(thinned)
    kept_static = available.clamp(max=static.static_context)
    return {
        "pad_mean": float(available.mean()),
        "thin_mean": float(thinned.mean()),
        "discarded": float(1 - thinned.sum() / available.sum()),
        "batches_min_le_17": small / batches,
        "num_patches": grid * grid,
        "static_context": static.static_context,
        "static_mean": float(kept_static.mean()),
        "static_discarded": float(1 - kept_static.sum() / available.sum()),
        "static_padded_images": float((available < static.static_context).float().mean()),
        "static_targets": static.static_targets,
        "target_mean": sum(target_sizes) / len(target_sizes),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=int, default=12)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args(argv)
    maps = {
        p: row_coverage(p, args.grid, args.batches, args.batch_size, args.blocks)
        for p in ("ours", "official", "clamped")
    }
    print(
        f"Share of images whose {args.blocks} target blocks cover a cell, by row (mean over columns), "
        f"{args.grid}x{args.grid} grid, {args.batches} batches of {args.batch_size}:\n"
    )
    print("| row | " + " | ".join(str(r) for r in range(args.grid)) + " |")
    print("|---|" + "---|" * args.grid)
    for policy, coverage in maps.items():
        print(f"| {policy} | " + " | ".join(f"{v:.2f}" for v in coverage.mean(1).tolist()) + " |")
    print()
    sizes = context_sizes(args.grid, args.batches // 4, args.batch_size)
    print(
        f"Context per image ({sizes['num_patches']} patches): pad keeps {sizes['pad_mean']:.1f} on average, "
        f"thin {sizes['thin_mean']:.1f} ({100 * sizes['discarded']:.0f}% discarded); batches whose shortest "
        f"context is <= 17 patches: {100 * sizes['batches_min_le_17']:.0f}%."
    )
    print(
        f"static: every context cut or padded to {sizes['static_context']} patches keeps {sizes['static_mean']:.1f} "
        f"on average ({100 * sizes['static_discarded']:.0f}% discarded, {100 * sizes['static_padded_images']:.0f}% of "
        f"images padded); target blocks average {sizes['target_mean']:.1f} patches, padded to "
        f"{sizes['static_targets']} (the same blocks: target coverage is unchanged)."
    )


if __name__ == "__main__":
    main()
