"""The defining property of every member of the position-encoding family."""

import pytest
import torch

from ijepa.nn import Predictor, VisionTransformer, apply_rotary, build_position_encoding
from ijepa.nn.position import (
    POSITION_ENCODINGS,
    AdditivePosition,
    PegPosition,
    PositionEncoding,
    RelativeBiasPosition,
    RopeAxialPosition,
    RopeMixedPosition,
    position_names,
)

ALL = position_names(2)


def config_class_name(name: str) -> str:
    return "".join(part.upper() if part[0].isdigit() else part.capitalize() for part in name.split("_")) + "Position"


@pytest.mark.parametrize("name", list(POSITION_ENCODINGS))
def test_every_member_is_registered_under_its_config_name_and_named_after_it(name):
    cls = POSITION_ENCODINGS[name]
    assert cls.name == name and cls.__name__ == config_class_name(name)  # rope_axial -> RopeAxialPosition
    assert issubclass(cls, PositionEncoding) and cls.dims in (2, 3)
    grid = (2, 4, 4)[-cls.dims :]
    encoding = build_position_encoding(name, grid, 16, num_heads=2)
    assert type(encoding) is cls and encoding.grid == grid and encoding.num_positions == 4 * 4 * (cls.dims - 1)
    # its options are its own keyword arguments, with their defaults
    for option, default in cls.options().items():
        assert type(build_position_encoding(name, grid, 16, 2, {option: default})) is cls


def test_building_a_member_checks_grid_rank_and_options():
    with pytest.raises(ValueError, match=r"'mrope' works on clip grids \(T, H, W\), not on the grid \(4, 4\)"):
        build_position_encoding("mrope", (4, 4), 16)
    with pytest.raises(ValueError, match=r"unknown options \['temperature'\] for position encoding 'rope_axial'"):
        build_position_encoding("rope_axial", (4, 4), 16, 1, {"temperature": 2.0})
    with pytest.raises(ValueError, match="its options: none"):
        build_position_encoding("learned", (4, 4), 16, 1, {"base": 2.0})
    assert build_position_encoding("sincos", (4, 4), 16, 1, {"axis_order": "row_col"}).axis_order == "row_col"


def test_parameter_counts_of_learned_tables():
    learned = build_position_encoding("learned", (5, 7), 16)
    factorized = build_position_encoding("learned_2d", (5, 7), 16)
    assert sum(p.numel() for p in learned.parameters()) == 5 * 7 * 16
    assert sum(p.numel() for p in factorized.parameters()) == (5 + 7) * 16
    # factorized: every position is row + column
    idx = torch.tensor([[3 * 7 + 4]])
    assert torch.allclose(factorized(idx)[0, 0], factorized.row[3] + factorized.col[4])
    assert torch.allclose(factorized.table()[3 * 7 + 4], factorized.row[3] + factorized.col[4])


def rotate_score(encoding, q, k, p1, p2):
    """<R(p1) q, R(p2) k> per head for single tokens at patch indices p1, p2."""
    angles = encoding.angles(torch.tensor([[p1, p2]]))
    cos, sin = angles.cos(), angles.sin()
    rq = apply_rotary(q, cos[:, :, :1], sin[:, :, :1])
    rk = apply_rotary(k, cos[:, :, 1:], sin[:, :, 1:])
    return (rq * rk).sum(-1).flatten()


@pytest.mark.parametrize("cls", [RopeAxialPosition, RopeMixedPosition])
def test_rope_is_relative_and_norm_preserving(cls):
    g = 8
    encoding = cls((g, g), 32, num_heads=2)
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)

    def at(r, c):
        return r * g + c

    a = rotate_score(encoding, q, k, at(1, 2), at(3, 5))
    b = rotate_score(encoding, q, k, at(4, 1), at(6, 4))  # both shifted by (+3, -1)
    assert torch.allclose(a, b, atol=1e-4)
    c = rotate_score(encoding, q, k, at(1, 2), at(3, 6))
    assert not torch.allclose(a, c, atol=1e-3)
    angles = encoding.angles(torch.tensor([[at(5, 7)]]))
    rotated = apply_rotary(q, angles.cos(), angles.sin())
    assert torch.allclose(rotated.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    assert angles.dtype == torch.float32


def test_axial_rope_row_and_column_effects_separate():
    g = 8
    encoding = RopeAxialPosition((g, g), 16, num_heads=1)
    angles = encoding.angles(torch.tensor([[0, 3, 2 * g]]))[0, 0]  # (0,0), (0,3), (2,0)
    quarter = 16 // 4
    # a column move rotates only the column pairs, a row move only the row pairs
    assert torch.equal(angles[1, :quarter], angles[0, :quarter]) and not torch.equal(
        angles[1, quarter:], angles[0, quarter:]
    )
    assert torch.equal(angles[2, quarter:], angles[0, quarter:]) and not torch.equal(
        angles[2, :quarter], angles[0, :quarter]
    )


def test_rope_mixed_can_mix_axes():
    encoding = RopeMixedPosition((4, 4), 16, num_heads=2)
    # a column step changes the angle of pairs that a row step also changes (diagonal frequencies)
    angles = encoding.angles(torch.tensor([[0, 1, 4]]))[0]
    col_step, row_step = angles[:, 1] - angles[:, 0], angles[:, 2] - angles[:, 0]
    assert ((col_step.abs() > 1e-4) & (row_step.abs() > 1e-4)).any()
    assert encoding.freqs.requires_grad


def test_rope_head_dim_errors():
    with pytest.raises(ValueError, match="rope_axial needs a head dimension divisible by 4"):
        build_position_encoding("rope_axial", (4, 4), 24, num_heads=4)
    with pytest.raises(ValueError, match="num_heads=5 must be a positive divisor"):
        build_position_encoding("rope_mixed", (4, 4), 24, num_heads=5)


def test_relative_bias_indexes_the_offset_table():
    g = 4
    bias = RelativeBiasPosition((g, g), 8, num_heads=2)
    indices = torch.tensor([[0, 5, 15]])  # (0,0), (1,1), (3,3)
    out = bias.attention_positions(indices).bias
    assert out.shape == (1, 2, 3, 3)
    table = bias.table.view(2 * g - 1, 2 * g - 1, 2)
    # query (1,1) attending key (3,3): offset (-2, -2) -> row g-1-2, col g-1-2
    assert torch.equal(out[0, :, 1, 2], table[g - 3, g - 3])
    # the same offset anywhere reads the same entry
    other = bias.attention_positions(torch.tensor([[4, 14]])).bias  # (1,0) -> (3,2): (-2,-2)
    assert torch.equal(other[0, :, 0, 1], out[0, :, 1, 2])
    assert torch.isfinite(out).all()


def test_peg_scatter_gather_matches_full_grid_convolution():
    g, d = 4, 8
    peg = PegPosition((g, g), d)
    tokens = torch.randn(2, 5, d)
    indices = torch.tensor([[0, 3, 6, 9, 15], [1, 2, 4, 8, 12]])
    grid = peg.scatter_to_grid(tokens, indices)
    assert grid.shape == (2, d, g, g)
    for b in range(2):
        for k, i in enumerate(indices[b].tolist()):
            assert torch.equal(grid[b, :, i // g, i % g], tokens[b, k])
    assert grid.abs().sum() == pytest.approx(tokens.abs().sum().item(), rel=1e-5)  # absent cells are zero
    out = peg.after_block(0, tokens, indices)
    full = peg.conv(grid).flatten(2).transpose(1, 2)
    for b in range(2):
        assert torch.allclose(out[b], tokens[b] + full[b, indices[b]], atol=1e-6)
    assert torch.equal(peg.after_block(1, tokens, indices), tokens)


@pytest.mark.parametrize("name", ALL)
def test_positions_on_a_subset_equal_the_full_grid_restricted(name):
    encoding = build_position_encoding(name, (4, 4), 16, num_heads=2)
    subset = torch.tensor([[2, 7, 11, 13]])
    full = torch.arange(16)[None]
    if isinstance(encoding, AdditivePosition):
        assert torch.allclose(encoding(subset), encoding(full)[:, subset[0]])
    if hasattr(encoding, "angles"):
        a_full = encoding.angles(full)
        assert torch.allclose(encoding.angles(subset), a_full[:, :, subset[0]])
    if isinstance(encoding, RelativeBiasPosition):
        b_full = encoding.attention_positions(full).bias
        assert torch.equal(encoding.attention_positions(subset).bias, b_full[:, :, subset[0]][:, :, :, subset[0]])


@pytest.mark.parametrize("name", ALL)
def test_every_type_in_encoder_is_permutation_equivariant_and_position_sensitive(name):
    torch.manual_seed(0)
    encoder = VisionTransformer.for_images(32, 8, embed_dim=32, depth=2, num_heads=2, pos_embed=name).eval()
    if name == "peg":
        torch.nn.init.normal_(encoder.position.conv.weight, std=0.5)
    images = torch.randn(1, 3, 32, 32)
    idx = torch.tensor([[0, 5, 10, 14]])
    perm = torch.tensor([[10, 0, 14, 5]])
    out, out_perm = encoder(images, idx), encoder(images, perm)
    assert torch.allclose(out_perm, out[:, [2, 0, 3, 1]], atol=1e-5)
    # the same pixels at two different indices: outputs differ unless there are no positions
    same = images.clone()
    same[:, :, 0:8, 0:8] = same[:, :, 24:32, 24:32]
    both = encoder(same, torch.tensor([[0, 15, 5]]))
    differ = not torch.allclose(both[0, 0], both[0, 1], atol=1e-5)
    assert differ == (name != "none"), name


@pytest.mark.parametrize("name", ALL)
def test_every_type_in_predictor_runs_and_learns(name):
    predictor = Predictor(grid=4, embed_dim=32, predictor_embed_dim=16, depth=1, num_heads=2, pos_embed=name)
    context = torch.randn(2, 5, 32)
    ci = torch.tensor([[0, 1, 2, 3, 4], [11, 12, 13, 14, 15]])
    ti = torch.tensor([[[8, 9], [14, 15]], [[0, 1], [2, 3]]])
    out = predictor(context, ci, ti)
    assert out.shape == (2, 2, 2, 32) and torch.isfinite(out).all()
    out.sum().backward()
    learnable = [p for p in predictor.position.parameters()]
    assert all(p.grad is not None for p in learnable)


def test_cosine_similarity_grid_is_vit_figure_7():
    from ijepa.nn import sinusoidal_2d_grid
    from ijepa.pictures import cosine_similarity_grid

    g_h, g_w = 3, 4
    table = sinusoidal_2d_grid(g_h, g_w, 32)
    image = cosine_similarity_grid(table, g_h, g_w, pad=1)
    assert image.shape == (1, g_h * (g_h + 1) - 1, g_w * (g_w + 1) - 1)
    assert 0.0 <= image.min() and image.max() <= 1.0 + 1e-6
    for r in range(g_h):
        for c in range(g_w):
            tile = image[0, r * (g_h + 1) : r * (g_h + 1) + g_h, c * (g_w + 1) : c * (g_w + 1) + g_w]
            # each position is most similar to itself
            assert tile[r, c] == pytest.approx(1.0, abs=1e-5)
            assert tile.argmax() == r * g_w + c
    with pytest.raises(ValueError, match=r"table must be \[12, D\]"):
        cosine_similarity_grid(table[:5], g_h, g_w)


@pytest.mark.parametrize("name", ["sincos", "rope_axial", "rope_mixed"])
def test_fixed_and_rotary_tables_stay_float32_under_bf16_autocast(name):
    encoder = VisionTransformer.for_images(32, 8, embed_dim=32, depth=1, num_heads=2, pos_embed=name).eval()
    idx = torch.tensor([[0, 5, 15]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if hasattr(encoder.position, "angles"):
            assert encoder.position.angles(idx).dtype == torch.float32
        else:
            assert encoder.position(idx).dtype == torch.float32
        out = encoder(torch.randn(1, 3, 32, 32), idx)
    assert torch.isfinite(out).all()
