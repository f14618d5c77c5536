"""The segmentation-grid benchmark runs and reports every setting (no timing is asserted)."""

import json

from conftest import ROOT, TINY_CONFIG

from ijepa.benchmark import eval_dense


def test_eval_dense_benchmark_prints_a_markdown_table_and_one_json_line(capsys):
    args = ["--config", str(TINY_CONFIG), "--eval-config", str(ROOT / "configs/eval/dense_shapes.yaml")]
    result = eval_dense.main([*args, "--steps", "2", "--warmup", "1", "--batch_size", "4", "--device", "cpu"])

    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("EVALDENSE "))
    assert json.loads(line[len("EVALDENSE ") :]) == json.loads(json.dumps(result))
    settings = result["settings"]
    heads = {name: row["heads"] for name, row in settings.items()}
    assert heads == {
        "segmentation_1": 1,
        "segmentation_eval": 4 * 2,  # the dense config's lrs x weight decays
        "cached_segmentation_1": 1,
        "cached_segmentation_eval": 4 * 2,
    }
    for name, row in settings.items():
        assert row["ms"] > 0 and row["over_one_head"] > 0, name
        assert row["features"] == ("cached" if name.startswith("cached") else "encoded")
    assert settings["segmentation_1"]["over_one_head"] == settings["cached_segmentation_1"]["over_one_head"] == 1.0
    table = [text for text in out.splitlines() if text.startswith("| ")]
    assert table[0] == "| setting | heads | ms per step (median) | ratio to 1 head |" and len(table) == 5
