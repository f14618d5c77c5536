"""The evaluation-grid benchmark runs and reports every setting (no timing is asserted)."""

import json

import yaml
from conftest import ROOT, TINY_CONFIG

from ijepa.benchmark import eval_grid


def test_eval_grid_benchmark_prints_a_markdown_table_and_one_json_line(tmp_path, capsys):
    # the quickstart eval config's grids, with last_blocks cut to the tiny encoder's 2 blocks
    config = yaml.safe_load((ROOT / "configs/eval/quickstart.yaml").read_text())
    linear = next(p for p in config["protocols"] if p["class_path"].endswith(".LinearProtocol"))
    linear["init_args"]["last_blocks"] = [1, 2]
    eval_config = tmp_path / "eval.yaml"
    eval_config.write_text(yaml.safe_dump(config))

    args = ["--config", str(TINY_CONFIG), "--eval-config", str(eval_config), "--steps", "2", "--warmup", "1"]
    result = eval_grid.main([*args, "--batch_size", "8", "--device", "cpu"])

    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("EVALGRID "))
    assert json.loads(line[len("EVALGRID ") :]) == json.loads(json.dumps(result))
    settings = result["settings"]
    heads = {name: row["heads"] for name, row in settings.items()}
    assert heads == {
        "linear_1": 1,
        "linear_8": 8,
        "linear_eval": 5 * 2 * 2 * 2,  # lrs x weight decays x last_blocks x batch_norm
        "attentive_1": 1,
        "attentive_eval": 4 * 2,
        "cached_linear_1": 1,
        "cached_linear_8": 8,
    }
    for name, row in settings.items():
        assert row["ms"] > 0 and row["over_one_head"] > 0, name
        assert row["features"] == ("cached" if name.startswith("cached") else "encoded")
    for reference in ("linear_1", "attentive_1", "cached_linear_1"):
        assert settings[reference]["over_one_head"] == 1.0  # each 1-head step against itself
    assert result["batch_size"] == 8 and result["steps_timed"] == 2
    table = [text for text in out.splitlines() if text.startswith("| ")]
    assert table[0] == "| setting | heads | ms per step (median) | ratio to 1 head |"
    assert len(table) == 1 + len(settings)
    assert "| linear, eval config's grid | 40 |" in out
