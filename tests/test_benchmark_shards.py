"""The shards benchmark: one worker reading shards against the same JPEG folder (tiny sizes)."""

import pytest

from ijepa.benchmark import shards

pytest.importorskip("litdata", reason="shards need the 'shards' extra")


def test_shards_benchmark_reads_every_image_through_both_readers(capsys):
    result = shards.main(["--images", "12", "--size", "16", "--batch-size", "4", "--rounds", "1"])
    assert result["images"] == 12 and result["images_per_s_folder"] > 0 and result["images_per_s_shards"] > 0
    out = capsys.readouterr().out
    assert "folder" in out and "shards" in out and out.splitlines()[-1].startswith("BENCHMARK {")
