"""``ijepa eval``: results files, selection on validation only, the feature cache, one-pass
grids, low-shot determinism, and the errors a user meets. A random-init tiny encoder (written
as a weights-only checkpoint) is enough: these are properties of the protocol, not of training."""

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_MODEL
from helpers import heads_by_name
from lightning.fabric import Fabric
from torchvision.transforms import v2

from ijepa.data.sources import ImageFolderSource, ShapesSource
from ijepa.evaluation import (
    EvalData,
    Evaluation,
    KNNProtocol,
    LinearProtocol,
    LogRegProtocol,
    LowShotProtocol,
    protocol_kinds,
    read_results,
)
from ijepa.evaluation.context import encode
from ijepa.evaluation.encoders import open_encoder
from ijepa.evaluation.protocols import grid_edges
from ijepa.evaluation.runner import build_parser, main
from ijepa.interop import load_encoder, save_hf, save_lightning_checkpoint
from ijepa.module import IJEPA

SOURCE = {"train_size": 320, "val_size": 96}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("eval") / "tiny.ckpt")


def data(**options) -> EvalData:
    options = {"source": ShapesSource(**SOURCE), "batch_size": 32, "num_workers": 0, "val_fraction": 0.2, **options}
    return EvalData(**options)


def evaluate(checkpoint, protocols, tmp_path, **options) -> list[dict]:
    options = {"data": data(), "output_dir": str(tmp_path / "out"), "accelerator": "cpu", **options}
    return Evaluation(str(checkpoint), protocols, **options).run()


def test_ijepa_eval_writes_one_results_file_per_protocol_that_round_trips(checkpoint, tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text(
        "data:\n  source:\n    class_path: ijepa.data.ShapesSource\n    init_args: {train_size: 320, val_size: 96}\n"
        "  batch_size: 32\n  num_workers: 0\n  val_fraction: 0.2\nprotocols:\n"
        "  - class_path: ijepa.evaluation.KNNProtocol\n    init_args: {ks: [5, 20]}\n"
        "  - class_path: ijepa.evaluation.LinearProtocol\n"
        "    init_args: {epochs: 1, lrs: [0.01, 0.1], weight_decays: [0.0, 0.001], augment: false}\n"
    )
    out = tmp_path / "out"
    results = main(
        ["--config", str(config), "--checkpoint", str(checkpoint), "--output_dir", str(out), "--accelerator", "cpu"]
    )
    printed = capsys.readouterr().out
    assert [r["name"] for r in results] == ["knn", "linear"]
    for result in results:
        path = out / f"{result['name']}.json"
        assert read_results(path) == json.loads(json.dumps(result))  # the file is what the run returned
        assert f"-> {path}" in printed
        assert result["checkpoint"]["path"] == str(checkpoint.resolve())
        assert len(result["checkpoint"]["sha256"]) == 64 and result["checkpoint"]["encoder"] == "target"
        assert (
            result["data"]["test_images"] == 96 and result["data"]["train_images"] + result["data"]["val_images"] == 320
        )
        assert result["selected"] in heads_by_name(result)
        assert result["val_top1"] == max(heads_by_name(result).values())
        assert 0 <= result["test_top1"] <= 1 and result["seconds"] > 0
    assert len(results[0]["heads"]) == 2 and len(results[1]["heads"]) == 4  # 2 lrs x 2 weight decays
    assert (out / "tensorboard").is_dir()


class ShiftedTestLabels(EvalData):
    """The same images, but every test label moved to the next class: a poisoned test split."""

    def _splits(self, size, augment):
        train, test = super()._splits(size, augment)
        poisoned = copy.copy(test)
        poisoned.targets = [(label + 1) % self.num_classes for label in poisoned.targets]
        return train, poisoned


def test_poisoned_test_labels_change_the_test_score_but_never_the_selected_head(checkpoint, tmp_path):
    protocols = lambda: [  # noqa: E731
        KNNProtocol(ks=[1, 5, 50]),
        LogRegProtocol(Cs=[1e-3, 1.0, 1e3]),
        LinearProtocol(lrs=[0.01, 0.3], weight_decays=[0.0, 0.01], epochs=1, augment=False),
    ]
    clean = evaluate(checkpoint, protocols(), tmp_path / "clean", cache=False)
    poisoned_data = ShiftedTestLabels(source=ShapesSource(**SOURCE), batch_size=32, num_workers=0, val_fraction=0.2)
    poisoned = evaluate(checkpoint, protocols(), tmp_path / "poisoned", cache=False, data=poisoned_data)
    for before, after in zip(clean, poisoned):
        assert heads_by_name(after) == heads_by_name(before)  # every validation score, bit for bit
        assert after["selected"] == before["selected"]
    assert [r["test_top1"] for r in poisoned] != [r["test_top1"] for r in clean]  # the poison reached the test


def test_features_are_cached_reused_by_the_next_protocol_and_invalidated_by_a_new_checkpoint_or_transform(
    checkpoint, tmp_path
):
    options = {"output_dir": str(tmp_path / "out")}
    first = evaluate(checkpoint, [KNNProtocol()], tmp_path, **options)[0]
    assert sorted(map(tuple, first["features"]["extracted"])) == [("test", "blocks"), ("train", "blocks")]
    second = evaluate(checkpoint, [LogRegProtocol(Cs=[1.0])], tmp_path, **options)[0]
    assert second["features"]["extracted"] == [] and len(second["features"]["reused"]) == 2
    # the reused features are the features: a run without the cache scores the same
    fresh = evaluate(checkpoint, [LogRegProtocol(Cs=[1.0])], tmp_path / "fresh", cache=False)[0]
    assert fresh["test_top1"] == second["test_top1"] and fresh["heads"] == second["heads"]

    other = tmp_path / "other.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    saved["state_dict"] = {
        k: v + 0.01 if k.startswith("target_encoder.") else v for k, v in saved["state_dict"].items()
    }
    torch.save(saved, other)
    third = evaluate(other, [KNNProtocol()], tmp_path, **options)[0]
    assert len(third["features"]["extracted"]) == 2

    class BilinearCrop(EvalData):
        def eval_transform(self, size):  # resize to a little more than the crop: another transform
            plain = super().eval_transform(size).transforms  # ToImage, ResizeCentreCrop, ToNormalizedFloat
            return v2.Compose([plain[0], v2.Resize(size + 4, antialias=True), v2.CenterCrop(size), plain[2]])

    cropped = BilinearCrop(source=ShapesSource(**SOURCE), batch_size=32, num_workers=0, val_fraction=0.2)
    fourth = evaluate(checkpoint, [KNNProtocol()], tmp_path, data=cropped, **options)[0]
    assert len(fourth["features"]["extracted"]) == 2


def test_low_shot_results_are_identical_for_one_seed_and_change_with_another(checkpoint, tmp_path):
    protocol = lambda: LowShotProtocol(fractions=[0.1], shots=[2], tries=2, Cs=[0.1, 10.0])  # noqa: E731
    first = evaluate(checkpoint, [protocol()], tmp_path / "a")[0]
    again = evaluate(checkpoint, [protocol()], tmp_path / "b")[0]
    other = evaluate(checkpoint, [protocol()], tmp_path / "c", data=data(seed=1))[0]
    assert first["settings_results"] == again["settings_results"]
    classes = first["data"]["num_classes"]
    assert first["settings_results"][1]["images"] == 2 * classes  # 2 shots of every class
    assert first["settings_results"] != other["settings_results"]


def run_cli(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--checkpoint", "missing.ckpt"], "checkpoint='missing.ckpt' does not exist"),
        (
            ["--protocols", '[{"class_path": "ijepa.evaluation.LinearProtocol", "init_args": {"lrs": []}}]'],
            "lrs must hold at least one value",
        ),
        (
            [
                "--protocols",
                '[{"class_path": "ijepa.evaluation.LowShotProtocol", "init_args": {"shots": [100], "fractions": []}}]',
            ],
            "shots=100 is larger than class",
        ),
        (["--protocols", "[]"], "protocols must hold at least one protocol"),
    ],
    ids=["missing-checkpoint", "zero-heads", "k-shot-above-smallest-class", "no-protocol"],
)
def test_bad_input_is_one_line_naming_the_option(checkpoint, tmp_path, capsys, extra, expected):
    args = [
        "--checkpoint",
        str(checkpoint),
        "--output_dir",
        str(tmp_path),
        "--accelerator",
        "cpu",
        "--data.source",
        json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": SOURCE}),
        "--data.num_workers",
        "0",
        "--data.batch_size",
        "32",
        "--protocols",
        '[{"class_path": "ijepa.evaluation.KNNProtocol"}]',
    ]
    err = run_cli(args + extra, capsys)
    assert expected in err.splitlines()[0], err


def test_a_file_that_is_not_a_checkpoint_and_unlabelled_data_are_errors_naming_them(tmp_path, capsys, checkpoint):
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    err = run_cli(
        [
            "--checkpoint",
            str(text),
            "--protocols",
            '[{"class_path": "ijepa.evaluation.KNNProtocol"}]',
            "--accelerator",
            "cpu",
            "--output_dir",
            str(tmp_path),
        ],
        capsys,
    )
    assert err.startswith(f"error: checkpoint={str(text)!r} is not an ijepa checkpoint or an exported encoder")

    loose = tmp_path / "loose"
    loose.mkdir()
    for i in range(4):
        v2.functional.to_pil_image(torch.rand(3, 32, 32)).save(loose / f"{i}.png")
    with pytest.raises(ValueError, match=r"data.source: .* has no labels \(num_classes=\d\)"):
        evaluate(checkpoint, [KNNProtocol()], tmp_path, data=data(source=ImageFolderSource(str(loose))))


def test_an_exported_hugging_face_folder_scores_as_its_checkpoint(checkpoint, tmp_path):
    folder = save_hf(load_encoder(checkpoint), tmp_path / "hf")
    from_checkpoint = evaluate(checkpoint, [KNNProtocol()], tmp_path / "a", cache=False)[0]
    from_folder = evaluate(folder, [KNNProtocol()], tmp_path / "b", cache=False)[0]
    assert from_folder["checkpoint"]["format"] == "hf" and from_checkpoint["checkpoint"]["format"] == "ijepa"
    assert heads_by_name(from_folder) == heads_by_name(from_checkpoint)
    assert from_folder["test_top1"] == from_checkpoint["test_top1"]


def test_bf16_mixed_runs_the_encoder_in_bf16_and_the_heads_in_float32(checkpoint, tmp_path):
    encoder, _ = open_encoder(str(checkpoint))
    images = torch.randn(4, 3, 32, 32)
    full = encode(Fabric(accelerator="cpu", precision="32-true"), encoder, images, "blocks", 2)
    half = encode(Fabric(accelerator="cpu", precision="bf16-mixed"), encoder, images, "blocks", 2)
    assert half.dtype == torch.float32 and not torch.equal(half, full)  # computed in bf16, handed on in float32
    torch.testing.assert_close(half, full, rtol=0.05, atol=0.05)
    protocols = [LinearProtocol(lrs=[0.1], weight_decays=[0.0], epochs=1)]
    result = evaluate(checkpoint, protocols, tmp_path, precision="bf16-mixed", cache=False)[0]
    assert result["precision"] == "bf16-mixed" and 0 <= result["test_top1"] <= 1


def test_a_selected_head_at_an_end_of_a_sweep_is_reported_and_a_zero_weight_decay_is_no_end():
    heads = [
        {"name": f"lr={lr},wd={wd}", "settings": {"lr": lr, "weight_decay": wd, "batch_norm": True}, "val_top1": 0.0}
        for lr in (0.1, 0.3, 1.0)
        for wd in (0.0, 0.1, 0.2)
    ]
    assert grid_edges(heads, "lr=1.0,wd=0.0") == [("lr", 1.0, "largest")]
    assert grid_edges(heads, "lr=0.3,wd=0.1") == []
    assert grid_edges(heads, "lr=0.1,wd=0.2") == [("lr", 0.1, "smallest"), ("weight_decay", 0.2, "largest")]
    assert grid_edges(heads[:2], "lr=0.1,wd=0.0") == []  # two values are a choice, not a sweep


@pytest.mark.parametrize(
    "configs",
    [["quickstart.yaml"], ["stl10.yaml"]]
    + [["quickstart.yaml", f"protocols/{p.name}"] for p in sorted((ROOT / "configs/eval/protocols").glob("*.yaml"))],
    ids=lambda configs: "+".join(Path(c).stem for c in configs),
)
def test_every_shipped_eval_config_builds_its_protocols(configs, checkpoint):
    parser = build_parser()
    args = [arg for config in configs for arg in ("--config", str(ROOT / "configs/eval" / config))]
    init = parser.instantiate_classes(parser.parse_args([*args, "--checkpoint", str(checkpoint)]))
    protocols = init["protocols"]
    assert protocols and all(type(p) in protocol_kinds().values() for p in protocols)
    if len(configs) == 2:  # a protocol overlay replaces the list with its one protocol
        assert [p.kind for p in protocols] == [Path(configs[1]).stem]
    else:
        assert sorted({p.kind for p in protocols}) == sorted(protocol_kinds("labels"))  # every labels protocol
        linear = [p for p in protocols if p.kind == "linear"]
        if configs == ["quickstart.yaml"]:  # the linear grid under both readouts: the mean, every token
            assert [(p.name, type(p.readout).__name__) for p in linear] == [
                ("linear", "MeanReadout"),
                ("linear_tokens", "GridReadout"),
            ]
            assert linear[1].readout.grid is None
