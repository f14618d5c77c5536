"""Debug the encoder on the device you have: ``marimo edit docs/notebooks/encoder_debug.py``.

Build the model from a config (or load a checkpoint), draw a masked batch the way training does,
run the online encoder on the gathered context indices and on all patches, on the chosen device,
and see shapes, feature statistics and how large the gradient reaching each part is. Runs as a
script too. The computations are in :func:`ijepa.explore.encoder_report`.
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
    from ijepa.data.batch import GridBatch
    from ijepa.explore import encoder_report, load_model

    configs = Path(ijepa.__file__).resolve().parents[1] / "configs"
    return GridBatch, configs, encoder_report, instantiate, load_model, mo, torch


@app.cell
def _(configs, mo, torch):
    config = mo.ui.text(value=str(configs / "quickstart.yaml"), label="config", full_width=True)
    overrides = mo.ui.text(
        value="--data.source.train_size=64 --data.source.val_size=64 --data.num_workers=0",
        label="overrides",
        full_width=True,
    )
    checkpoint = mo.ui.text(
        value="", label="checkpoint (optional: its weights instead of a fresh init)", full_width=True
    )
    _devices = (
        ["cpu"]
        + (["cuda"] if torch.cuda.is_available() else [])
        + (["mps"] if torch.backends.mps.is_available() else [])
    )
    device = mo.ui.dropdown(options=_devices, value=_devices[-1], label="device")
    batch_size = mo.ui.slider(1, 64, value=8, label="batch")
    mo.vstack([config, overrides, checkpoint, mo.hstack([device, batch_size])])
    return batch_size, checkpoint, config, device, overrides


@app.cell
def _(checkpoint, config, device, instantiate, load_model, overrides):
    model, datamodule = instantiate(config.value, overrides.value.split())
    if checkpoint.value:
        model = load_model(checkpoint.value, image_size=datamodule.hparams.image_size)
    model = model.to(device.value).train()
    encoder = model.encoder
    return datamodule, encoder, model


@app.cell
def _(batch_size, datamodule, device, torch):
    _hp = datamodule.hparams
    _generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size.value, 3, _hp.image_size, _hp.image_size, generator=_generator).to(device.value)
    context_indices, target_indices = datamodule.mask_sampler(batch_size.value, _generator)
    context_indices, target_indices = context_indices.to(device.value), target_indices.to(device.value)
    return context_indices, images, target_indices


@app.cell
def _(context_indices, encoder, encoder_report, images, mo):
    on_context = encoder_report(encoder, images, context_indices)
    on_all = encoder_report(encoder, images)

    def _rows(report):
        return {k: v for k, v in report.items() if k != "grad_norms"}

    mo.vstack(
        [
            mo.md(
                f"online encoder `{type(encoder.transformer.position).__name__}` positions, on `{on_context['device']}`"
            ),
            mo.ui.table(
                [{"run": "context indices", **_rows(on_context)}, {"run": "all patches", **_rows(on_all)}],
                selection=None,
            ),
            mo.md("gradient norm reaching each part (loss = mean squared output); a zero or NaN here is a broken path"),
            mo.ui.table(
                [
                    {
                        "part": part,
                        "context indices": on_context["grad_norms"][part],
                        "all patches": on_all["grad_norms"].get(part),
                    }
                    for part in on_context["grad_norms"]
                ],
                selection=None,
            ),
        ]
    )
    return on_all, on_context


@app.cell
def _(GridBatch, context_indices, images, mo, model, target_indices, torch):
    with torch.no_grad():
        loss = model.jepa_loss(GridBatch(images, context_indices, target_indices))
    mo.md(
        f"the I-JEPA loss of this batch: {float(loss):.4f} (context `{tuple(context_indices.shape)}`, "
        f"targets `{tuple(target_indices.shape)}`)"
    )
    return (loss,)


if __name__ == "__main__":
    app.run()
