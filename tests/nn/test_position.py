import pytest
import torch

from ijepa.nn import index_checks
from ijepa.nn.position import (
    POSITION_ENCODINGS,
    LearnedPosition,
    SincosPosition,
    build_position_encoding,
    sinusoidal_1d_positions,
    sinusoidal_2d_grid,
)


def test_learned_lookup_and_full_grid():
    pos = LearnedPosition((4, 5), embed_dim=8)
    indices = torch.tensor([[0, 7, 19], [3, 3, 12]])
    out = pos(indices)
    assert out.shape == (2, 3, 8)
    assert torch.equal(out[0, 1], pos.embedding.weight[7])
    grid = pos.full_grid(batch_size=3)
    assert grid.shape == (3, 20, 8)
    assert torch.equal(grid[2], pos.embedding.weight)
    # trunc_normal_(std=0.02) as in ViT / I-JEPA (whose cut-off is +-2 absolute, i.e. none).
    assert 0.01 < pos.embedding.weight.std() < 0.03


def test_learned_gets_gradient_only_at_used_rows():
    pos = LearnedPosition((3, 3), 4)
    pos(torch.tensor([[1, 4]])).sum().backward()
    used = pos.embedding.weight.grad.abs().sum(1) > 0
    assert used.nonzero().flatten().tolist() == [1, 4]


def test_index_range_errors():
    for pos in (LearnedPosition((3, 3), 8), SincosPosition((3, 3), 8)):
        with pytest.raises(ValueError, match=r"0\.\.8"):
            pos(torch.tensor([[0, 9]]))
        with pytest.raises(ValueError, match=r"\[B, K\]"):
            pos(torch.tensor([0, 1]))


def test_index_checks_can_be_disabled_for_hot_paths():
    pos = LearnedPosition((3, 3), 8)
    with index_checks(False):
        pos(torch.tensor([[0, 8]]))  # in range: fine, no host sync needed
    with pytest.raises(ValueError):
        pos(torch.tensor([[0, 9]]))


def test_sincos_1d_matches_formula():
    positions = torch.tensor([0.0, 3.0])
    emb = sinusoidal_1d_positions(positions, dim=8)
    omega = 1.0 / 10_000 ** (torch.arange(4) / 4)
    assert torch.allclose(emb[1, :4], torch.sin(3 * omega))
    assert torch.allclose(emb[1, 4:], torch.cos(3 * omega))
    assert torch.allclose(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4))


def test_sincos_axis_layout():
    g_h, g_w, d = 3, 5, 16
    col_row = sinusoidal_2d_grid(g_h, g_w, d, axis_order="col_row")
    row_col = sinusoidal_2d_grid(g_h, g_w, d, axis_order="row_col")
    assert col_row.shape == (15, 16)
    r, c = 2, 4
    i = r * g_w + c
    code_r = sinusoidal_1d_positions(torch.tensor([r]), d // 2)[0]
    code_c = sinusoidal_1d_positions(torch.tensor([c]), d // 2)[0]
    # Official I-JEPA / MAE layout: column half first.
    assert torch.allclose(col_row[i], torch.cat([code_c, code_r]))
    assert torch.allclose(row_col[i], torch.cat([code_r, code_c]))
    with pytest.raises(ValueError, match="axis_order"):
        sinusoidal_2d_grid(2, 2, 8, axis_order="xy")
    with pytest.raises(ValueError, match="divisible by 4"):
        sinusoidal_2d_grid(2, 2, 6)


def test_sincos_inner_product_is_separable():
    """<PE(r1,c1), PE(r2,c2)> = f(r1 - r2) + g(c1 - c2): equal offsets give equal scores."""
    g, d = 8, 32
    table = sinusoidal_2d_grid(g, g, d)

    def score(a, b):
        return float(table[a[0] * g + a[1]] @ table[b[0] * g + b[1]])

    # same offset (dr, dc) = (2, -3) from different anchors
    assert score((1, 5), (3, 2)) == pytest.approx(score((4, 6), (6, 3)), abs=1e-5)
    # separability: moving only rows changes only f, moving only columns only g
    f = score((0, 0), (2, 0)) - score((0, 0), (0, 0)) / 2
    g_ = score((0, 0), (0, 3)) - score((0, 0), (0, 0)) / 2
    assert score((0, 0), (2, 3)) == pytest.approx(f + g_, abs=1e-5)
    # one step right and one step down score the same
    assert score((3, 3), (3, 4)) == pytest.approx(score((3, 3), (4, 3)), abs=1e-5)
    # and the code is informative: different positions are different
    assert score((0, 0), (0, 0)) > score((0, 0), (0, 1)) + 1e-3


def test_sincos_module_is_float32_buffer_not_in_state_dict():
    pos = SincosPosition((4, 4), 16)
    assert pos.embedding.dtype == torch.float32
    assert "embedding" not in pos.state_dict()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert pos(torch.tensor([[1, 2]])).dtype == torch.float32
    assert torch.equal(pos.full_grid(2)[1], sinusoidal_2d_grid(4, 4, 16))


def test_registry_and_unknown_name():
    assert {"none", "learned", "sincos"} <= set(POSITION_ENCODINGS)
    with pytest.raises(ValueError, match="valid names: .*learned.*sincos"):
        build_position_encoding("bogus", (4, 4), 8)
    none = build_position_encoding("none", (4, 4), 8)
    x = torch.randn(1, 3, 8)
    assert torch.equal(none.add_to_tokens(x, torch.tensor([[0, 1, 2]])), x)
