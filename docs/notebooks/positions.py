"""Position embeddings, interactively: ``marimo edit docs/notebooks/positions.py``.

Choose a position type and a grid; see one channel of the table as a heat map, the cosine
similarity of every position with one chosen position (and ViT's Figure 7 for the whole grid),
for RoPE the attention score between two tokens as a function of their offset, and for the
relative bias its table as an offset image. Give a checkpoint path to see its learned tables.
Runs as a script too: ``python docs/notebooks/positions.py``. The computations are in
:mod:`ijepa.explore`.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import marimo as mo
    import torch

    from ijepa.explore import (
        bias_offset_map,
        load_model,
        position_channel_map,
        position_similarity_map,
        rope_offset_scores,
    )
    from ijepa.nn.position import build_position_encoding, position_names
    from ijepa.pictures import cosine_similarity_grid, heat_image, to_png

    return (
        build_position_encoding,
        cosine_similarity_grid,
        heat_image,
        load_model,
        mo,
        position_channel_map,
        position_names,
        position_similarity_map,
        bias_offset_map,
        rope_offset_scores,
        to_png,
        torch,
    )


@app.cell
def _(mo, position_names):
    kind = mo.ui.dropdown(options=list(position_names(2)), value="sincos", label="position type")
    grid = mo.ui.slider(2, 16, value=6, label="grid size G")
    width = mo.ui.slider(16, 256, step=16, value=64, label="width D")
    heads = mo.ui.slider(1, 8, value=4, label="heads")
    checkpoint = mo.ui.text(
        value="", label="or a checkpoint (its encoder's table; overrides the choices)", full_width=True
    )
    mo.vstack([mo.hstack([kind, grid, width, heads]), checkpoint])
    return checkpoint, grid, heads, kind, width


@app.cell
def _(build_position_encoding, checkpoint, grid, heads, kind, load_model, mo, width):
    if checkpoint.value:
        position = load_model(checkpoint.value).encoder.position
        source = f"`{checkpoint.value}`: encoder position `{type(position).__name__}`"
    else:
        position = build_position_encoding(kind.value, (grid.value, grid.value), width.value, heads.value)
        source = f"a freshly built `{kind.value}` ({type(position).__name__}) at init"
    mo.md(f"Showing {source} on a {position.grid_height}x{position.grid_width} grid.")
    return (position,)


@app.cell
def _(mo, position):
    num_positions = position.grid_height * position.grid_width
    channel = mo.ui.slider(0, max(position.embed_dim - 1, 1), value=0, label="channel")
    chosen = mo.ui.slider(0, num_positions - 1, value=num_positions // 2, label="position i = r*G + c")
    mo.hstack([channel, chosen])
    return channel, chosen


@app.cell
def _(
    AdditivePosition,
    channel,
    chosen,
    cosine_similarity_grid,
    heat_image,
    mo,
    position,
    position_channel_map,
    position_similarity_map,
    to_png,
):
    if isinstance(position, AdditivePosition):
        _channel_map = position_channel_map(position, min(channel.value, position.embed_dim - 1))
        _similarity = position_similarity_map(position, chosen.value)
        _figure7 = cosine_similarity_grid(position.table(), position.grid_height, position.grid_width)
        table_view = mo.hstack(
            [
                mo.vstack([mo.md(f"channel {channel.value}"), mo.image(to_png(heat_image(_channel_map, 24)))]),
                mo.vstack(
                    [
                        mo.md(f"cosine similarity with position {chosen.value}"),
                        mo.image(to_png(heat_image(_similarity, 24, low=-1.0, high=1.0))),
                    ]
                ),
                mo.vstack(
                    [mo.md("every position (ViT Figure 7)"), mo.image(to_png(_figure7.expand(3, -1, -1)), width=360)]
                ),
            ]
        )
    else:
        table_view = mo.md(f"`{type(position).__name__}` adds no table to the tokens.")
    table_view
    return (table_view,)


@app.cell
def _(bias_offset_map, heat_image, mo, position, rope_offset_scores, to_png, torch):
    _positions = position.attention_positions(torch.arange(position.num_positions)[None])
    if _positions is not None and _positions.rope is not None:
        _head_dim = 2 * _positions.rope[0].size(-1)
        _generator = torch.Generator().manual_seed(0)
        _q, _k = torch.randn(_head_dim, generator=_generator), torch.randn(_head_dim, generator=_generator)
        _scores = rope_offset_scores(position, _q, _k)
        relation_view = mo.vstack(
            [
                mo.md(
                    "RoPE: score `<R(p_q) q, R(p_k) k>` of two random vectors against the offset `p_q - p_k` "
                    "(centre = no offset; it depends on the offset only)"
                ),
                mo.image(to_png(heat_image(_scores, 16))),
            ]
        )
    elif _positions is not None and _positions.bias is not None:
        relation_view = mo.vstack(
            [
                mo.md("attention bias of head 0 against the offset (centre = no offset)"),
                mo.image(to_png(heat_image(bias_offset_map(position, 0), 16))),
            ]
        )
    else:
        relation_view = mo.md("")
    relation_view
    return (relation_view,)


@app.cell
def _():
    from ijepa.nn.position import AdditivePosition

    return (AdditivePosition,)


if __name__ == "__main__":
    app.run()
