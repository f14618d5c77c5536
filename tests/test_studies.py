"""The scripts that regenerate the documented tables read what the runs log."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from ijepa.studies.position_table import main as position_table


def write_run(root, name, losses, knn):
    writer = SummaryWriter(str(root / name / "lightning_logs" / "version_0"))
    for step, loss in enumerate(losses):
        writer.add_scalar("train/loss", loss, step)
    for step, value in knn:
        writer.add_scalar("val/knn_top1", value, step)
    writer.close()


def test_position_table_summarises_seeds(tmp_path, capsys):
    write_run(tmp_path, "pos_sincos_s0", [1.0] * 5 + [0.2] * 5, [(0, 0.10), (599, 0.20)])
    write_run(tmp_path, "pos_sincos_s1", [1.0] * 5 + [0.4] * 5, [(0, 0.12), (599, 0.18)])
    write_run(tmp_path, "pos_none_s0", [0.5] * 10, [(0, 0.10), (599, 0.11)])
    rows = position_table([str(tmp_path)])
    assert len(rows["sincos"]) == 2 and rows["sincos"][0]["gain"] == pytest.approx(0.10)
    out = capsys.readouterr().out
    # mean and half-range: loss (0.2, 0.4) -> 0.3 ± 0.1; final 19.0 ± 1.0; gain (10, 6) -> 8.0 ± 2.0
    assert "| `sincos` | 2 | 0.3000 ± 0.1000 | 11.0 ± 1.0 | 19.0 ± 1.0 | 8.0 ± 2.0 |" in out
    assert out.index("`none`") < out.index("`sincos`")  # the documented order


def test_export_images_writes_the_logged_image(tmp_path):
    import torch
    from PIL import Image

    from ijepa.studies.export_images import main as export

    writer = SummaryWriter(str(tmp_path / "run"))
    first = torch.zeros(1, 3, 5)
    last = torch.zeros(1, 3, 5)
    last[0, 1, 2] = 1.0
    writer.add_image("positions/encoder", first, 0)
    writer.add_image("positions/encoder", last, 7)
    writer.close()
    out = export([str(tmp_path / "run"), "--tag", "positions/encoder", "--output", str(tmp_path / "x.png"), "--scale", "4"])
    image = Image.open(out)
    assert image.size == (20, 12)
    assert image.convert("L").getpixel((2 * 4 + 1, 1 * 4 + 1)) == 255  # the bright cell, enlarged
    assert image.convert("L").getpixel((0, 0)) == 0
    with pytest.raises(ValueError, match="no image tag 'nope'"):
        export([str(tmp_path / "run"), "--tag", "nope", "--output", str(tmp_path / "y.png")])


def test_configuration_reference_matches_the_cli():
    from pathlib import Path

    from ijepa.studies.config_reference import reference

    documented = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    assert documented == reference(), "regenerate: python -m ijepa.studies.config_reference > docs/configuration.md"
    assert "| `model.pos_embed` |" in documented and "| `data.bad_images` |" in documented


def test_position_table_leaves_out_unfinished_runs(tmp_path, capsys):
    write_run(tmp_path, "pos_peg_s0", [0.3] * 5, [(0, 0.10), (599, 0.20)])
    write_run(tmp_path, "pos_peg_s1", [0.3] * 5, [(0, 0.10), (299, 0.15)])  # still running
    rows = position_table([str(tmp_path)])
    assert len(rows["peg"]) == 1
