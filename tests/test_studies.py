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
