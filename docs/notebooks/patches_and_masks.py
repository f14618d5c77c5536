"""Patches and I-JEPA masks, interactively: ``marimo edit docs/notebooks/patches_and_masks.py``.

Pick an image from a configured dataset and see its patch grid with row-major indices
``i = r*G + c``; sample I-JEPA masks with sliders for the mask settings and see the context and
each target block drawn over the image; see the mask statistics over many samples (how often
each position is a target or context, the context length). Runs as a script too. The
computations are in :mod:`ijepa.explore` and :mod:`ijepa.masks`.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    from pathlib import Path

    import marimo as mo
    import torch

    import ijepa
    from ijepa.cli import instantiate
    from ijepa.data.transforms import unnormalize
    from ijepa.explore import mask_statistics
    from ijepa.masks import MultiBlockMaskSampler
    from ijepa.pictures import heat_image, mask_overlay, patch_grid_image, to_png

    configs = Path(ijepa.__file__).resolve().parents[1] / "configs"
    return (
        MultiBlockMaskSampler,
        configs,
        heat_image,
        instantiate,
        mask_overlay,
        mask_statistics,
        mo,
        patch_grid_image,
        to_png,
        torch,
        unnormalize,
    )


@app.cell
def _(configs, mo):
    config = mo.ui.text(value=str(configs / "quickstart.yaml"), label="config", full_width=True)
    overrides = mo.ui.text(
        value="--data.source.train_size=64 --data.source.val_size=64 --data.num_workers=0",
        label="overrides (e.g. --data.source.root=/data for STL-10)",
        full_width=True,
    )
    mo.vstack([config, overrides])
    return config, overrides


@app.cell
def _(config, instantiate, mo, overrides):
    _model, datamodule = instantiate(config.value, overrides.value.split())
    datamodule.setup("validate")
    dataset = datamodule.split("probe_test")
    hp = datamodule.hparams
    opts = datamodule.masks  # the mask kind's options (data.masks)
    grid_size = hp.image_size // hp.patch_size
    mo.md(
        f"`{type(datamodule.source).__name__}`: {len(dataset)} held-out images of {hp.image_size} px, patch {hp.patch_size}, "
        f"grid {grid_size}x{grid_size} = {grid_size**2} patches"
    )
    return dataset, grid_size, hp, opts


@app.cell
def _(dataset, mo, opts):
    image_index = mo.ui.slider(0, len(dataset) - 1, value=0, label="image")
    num_blocks = mo.ui.slider(1, 8, value=opts.num_target_blocks, label="target blocks M")
    target_scale = mo.ui.range_slider(0.02, 0.5, step=0.01, value=list(opts.target_scale), label="target scale")
    aspect = mo.ui.range_slider(0.25, 4.0, step=0.05, value=list(opts.target_aspect_ratio), label="target aspect ratio")
    context_scale = mo.ui.range_slider(0.3, 1.0, step=0.01, value=list(opts.context_scale), label="context scale")
    min_keep = mo.ui.slider(1, 32, value=opts.min_keep, label="min_keep")
    seed = mo.ui.slider(0, 99, value=0, label="mask seed")
    mo.vstack([image_index, mo.hstack([num_blocks, min_keep, seed]), mo.hstack([target_scale, aspect, context_scale])])
    return aspect, context_scale, image_index, min_keep, num_blocks, seed, target_scale


@app.cell
def _(dataset, hp, image_index, mo, patch_grid_image, to_png, unnormalize):
    image = unnormalize(dataset[image_index.value][0][None])[0]
    mo.vstack(
        [
            mo.md("patch grid, row-major indices `i = r*G + c`"),
            mo.image(to_png(patch_grid_image(image, hp.patch_size, scale=max(1, 384 // hp.image_size)))),
        ]
    )
    return (image,)


@app.cell
def _(MultiBlockMaskSampler, aspect, context_scale, grid_size, min_keep, num_blocks, target_scale):
    sampler = MultiBlockMaskSampler(
        grid_size,
        num_blocks.value,
        tuple(target_scale.value),
        tuple(aspect.value),
        tuple(context_scale.value),
        min_keep=min_keep.value,
    )
    return (sampler,)


@app.cell
def _(hp, image, mask_overlay, mo, sampler, seed, to_png, torch):
    context, targets = sampler(1, torch.Generator().manual_seed(seed.value))
    _overlay = mask_overlay(image[None], context, targets, hp.patch_size)[0]
    _scale = max(1, 384 // hp.image_size)
    mo.vstack(
        [
            mo.md(
                f"context (blue, {context.size(1)} patches) and {targets.size(1)} target blocks of "
                f"{targets.size(2)} patches (one colour each); dark = neither"
            ),
            mo.image(to_png(_overlay.repeat_interleave(_scale, 1).repeat_interleave(_scale, 2))),
        ]
    )
    return context, targets


@app.cell
def _(heat_image, mask_statistics, mo, sampler, to_png):
    stats = mask_statistics(sampler, batch_size=64, num_batches=10)
    _lengths = stats["context_lengths"]
    mo.vstack(
        [
            mo.md(
                f"over 640 samples: targets cover {100 * stats['mean_target_fraction']:.1f}% of the grid on average, "
                f"the context {100 * stats['mean_context_fraction']:.1f}%; context length per batch "
                f"{min(_lengths)} to {max(_lengths)} patches (every batch is thinned to its smallest)"
            ),
            mo.hstack(
                [
                    mo.vstack(
                        [
                            mo.md("how often each position is a target"),
                            mo.image(to_png(heat_image(stats["target_frequency"], 24, low=0.0, high=1.0))),
                        ]
                    ),
                    mo.vstack(
                        [
                            mo.md("how often it is context"),
                            mo.image(to_png(heat_image(stats["context_frequency"], 24, low=0.0, high=1.0))),
                        ]
                    ),
                ]
            ),
        ]
    )
    return (stats,)


if __name__ == "__main__":
    app.run()
