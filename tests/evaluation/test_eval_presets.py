"""The papers' presets (configs/eval/presets/) and the low-shot protocol's subset files: a file
fits exactly the images it names (by path, file name, or index), overlapping validation is handled
as documented, and bad input is one line naming it. A random-init tiny encoder is enough: these are
properties of the protocol, not of training."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY_MODEL
from PIL import Image

from ijepa.data.sources import ImageFolderSource, ShapesSource
from ijepa.evaluation import AttentiveProtocol, EvalData, Evaluation, LogRegProtocol, LowShotProtocol
from ijepa.evaluation.runner import build_parser, main
from ijepa.evaluation.splits import item_names, named_indices, validation_split
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA

PRESETS = ROOT / "configs/eval/presets"
CLASSES, TRAIN_PER_CLASS = ("a", "b", "c"), 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("presets") / "tiny.ckpt")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """ImageNet's layout in miniature: train/<class>/<class>_<n>.png and val/<class>/..., random pixels."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for split, count in (("train", TRAIN_PER_CLASS), ("val", 3)):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{name}_{i}.png")
    return root


def folder_data(root: Path) -> EvalData:
    return EvalData(source=ImageFolderSource(str(root)), batch_size=8, num_workers=0, val_fraction=0.25)


def shapes_data() -> EvalData:
    return EvalData(source=ShapesSource(train_size=160, val_size=48), batch_size=32, num_workers=0, val_fraction=0.2)


def evaluate(checkpoint, protocol, data, tmp_path) -> dict:
    options = {"data": data, "output_dir": str(tmp_path / "out"), "cache": False, "accelerator": "cpu"}
    return Evaluation(str(checkpoint), [protocol], **options).run()[0]


@pytest.fixture
def fits(monkeypatch) -> list[dict]:
    """Every logistic-regression fit of the run: its context and the features it fits and selects on."""
    calls, original = [], LogRegProtocol.fit_select_test

    def record(self, ctx, x_train, y_train, x_val, y_val):
        calls.append({"ctx": ctx, "x_train": x_train, "x_val": x_val})
        return original(self, ctx, x_train, y_train, x_val, y_val)

    monkeypatch.setattr(LogRegProtocol, "fit_select_test", record)
    return calls


def dataset_indices(ctx, x: torch.Tensor) -> list[int]:
    """The train split's dataset indices of the images whose features are the rows of ``x``."""
    entry = ctx._entry("train", "blocks", 1)
    match = (x[:, None, :] == entry["features"][None]).all(-1)  # [M, N]
    assert (match.sum(1) == 1).all(), "a fitted row is not exactly one image of the train split"
    return sorted(entry["positions"][match.float().argmax(1)].tolist())


def train_paths(root: Path) -> list[str]:
    """The train split's files relative to train/, in the dataset's order (class, then file name)."""
    return [p.relative_to(root / "train").as_posix() for c in CLASSES for p in sorted((root / "train" / c).iterdir())]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_subset_file_fits_exactly_the_images_it_names_by_path_or_file_name(checkpoint, folder, tmp_path, fits):
    paths = train_paths(folder)
    subset = write(
        tmp_path / "1percent.txt",
        "# the I-JEPA / MSN format: one image a line\n\na/a_1.png\nb_3.png\n./c/c_0.png  # a comment\nb_3.png\n",
    )
    protocol = LowShotProtocol(fractions=[], shots=[], subset_files=[str(subset)], Cs=[0.1, 10.0])
    result = evaluate(checkpoint, protocol, folder_data(folder), tmp_path)
    named = sorted(paths.index(p) for p in ("a/a_1.png", "b/b_3.png", "c/c_0.png"))
    assert len(fits) == 1 and dataset_indices(fits[0]["ctx"], fits[0]["x_train"]) == named
    (setting,) = result["settings_results"]
    assert setting["name"] == "1percent" and setting["images"] == 3 and setting["subset_file"] == str(subset)
    assert setting["sha256"] == hashlib.sha256(subset.read_bytes()).hexdigest()
    assert len(setting["test_top1"]) == 1 and setting["mean"] == setting["test_top1"][0] and setting["std"] == 0.0
    assert item_names(fits[0]["ctx"].data.dataset("train", 32)) == paths  # names relative to the split's root


def test_a_subset_file_names_generated_images_by_index_beside_drawn_settings(checkpoint, tmp_path, fits):
    subset = write(tmp_path / "mine.txt", "0\n7\n31\n100\n")
    protocol = LowShotProtocol(fractions=[0.1], shots=[], tries=1, subset_files=[str(subset)], Cs=[1.0])
    result = evaluate(checkpoint, protocol, shapes_data(), tmp_path)
    assert [s["name"] for s in result["settings_results"]] == ["10%", "mine"]
    assert dataset_indices(fits[1]["ctx"], fits[1]["x_train"]) == [0, 7, 31, 100]
    assert result["settings"]["subset_files"] == [str(subset)]


def test_listed_validation_images_are_fitted_and_leave_the_validation_part(checkpoint, folder, tmp_path, fits):
    data = folder_data(folder)
    labels = torch.tensor(data.dataset("train", 32).targets)
    train_idx, val_idx = validation_split(labels, data.val_fraction, data.seed)
    paths = train_paths(folder)
    chosen = sorted([*val_idx[:2].tolist(), *train_idx[:3].tolist()])  # 2 of validation, 3 of the rest
    subset = write(tmp_path / "overlap.txt", "\n".join(paths[i] for i in chosen))
    protocol = LowShotProtocol(fractions=[], shots=[], subset_files=[str(subset)], Cs=[1.0])
    (setting,) = evaluate(checkpoint, protocol, data, tmp_path)["settings_results"]
    ctx = fits[0]["ctx"]
    assert dataset_indices(ctx, fits[0]["x_train"]) == chosen  # the whole list is fitted on
    selecting = dataset_indices(ctx, fits[0]["x_val"])
    assert selecting == sorted(set(val_idx.tolist()) - set(chosen))  # C is selected on the rest of validation
    assert setting["left_validation"] == 2 and setting["val_images"] == len(val_idx) - 2

    every = write(tmp_path / "all_val.txt", "\n".join(paths[i] for i in val_idx.tolist()))
    protocol = LowShotProtocol(fractions=[], shots=[], subset_files=[str(every)], Cs=[1.0])
    with pytest.raises(ValueError, match=r"^subset file all_val.txt names every image of the validation part"):
        evaluate(checkpoint, protocol, data, tmp_path / "every")


def test_bad_subset_files_are_one_line_naming_the_file(checkpoint, folder, tmp_path, capsys):
    unknown = [f"n01_{i}.JPEG" for i in range(7)]
    bad = write(tmp_path / "1percent.txt", "\n".join(["a/a_0.png", *unknown]))
    protocol = LowShotProtocol(fractions=[], shots=[], subset_files=[str(bad)])
    expected = (
        "subset file 1percent.txt names 7 images not in the train split of data.source: "
        "n01_0.JPEG, n01_1.JPEG, n01_2.JPEG, n01_3.JPEG, n01_4.JPEG and 2 more."
    )
    with pytest.raises(ValueError) as error:
        evaluate(checkpoint, protocol, folder_data(folder), tmp_path)
    assert str(error.value) == expected

    args = [
        "--checkpoint",
        str(checkpoint),
        "--output_dir",
        str(tmp_path / "cli"),
        "--accelerator",
        "cpu",
        "--data",
        json.dumps({"source": {"class_path": "ijepa.data.ImageFolderSource", "init_args": {"root": str(folder)}}}),
        "--data.num_workers",
        "0",
        "--data.val_fraction",
        "0.25",
    ]
    low_shot = {"class_path": "ijepa.evaluation.LowShotProtocol", "init_args": {"fractions": [], "shots": []}}
    for subset_file, message in (
        (bad, expected),
        (tmp_path / "missing.txt", f"subset_files: subset file {str(tmp_path / 'missing.txt')!r} does not exist"),
        (write(tmp_path / "empty.txt", "# nothing\n\n"), "subset_files: subset file"),
    ):
        low_shot["init_args"]["subset_files"] = [str(subset_file)]
        with pytest.raises(SystemExit):
            main([*args, "--protocols", json.dumps([low_shot])])
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {message}"), err
    assert "names no image (only blank lines or # comments)" in err


def test_a_file_name_in_two_folders_is_ambiguous_and_asks_for_the_path():
    names = ["a/x.png", "b/x.png", "b/y.png"]
    assert named_indices(names, ["b/x.png", "y.png"], "subset file s.txt").tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"names 1 image that match several files .*: x.png \(give their paths"):
        named_indices(names, ["x.png"], "subset file s.txt")


EXPECTED = {
    "vjepa2_attentive.yaml": {
        "type": AttentiveProtocol,
        "depth": 4,
        "num_heads": 16,
        "num_queries": 1,
        "epochs": 20,
        "warmup_epochs": 5,
        "batch_size": 1024,
        "optimizer": "adamw",
        "augment": True,
        "lrs": [5e-4, 1e-3, 1.5e-3, 2e-3],
        "weight_decays": [5e-4, 1e-3, 2e-3, 4e-3, 8e-3],
    },
    "dinov2_logreg.yaml": {"type": LogRegProtocol, "max_iter": 1000, "last_blocks": 1},
    "ijepa_1percent.yaml": {
        "type": LowShotProtocol,
        "fractions": [],
        "shots": [],
        "subset_files": ["data/imagenet_subsets/1percent.txt"],
        "last_blocks": 1,
    },
}


def test_every_preset_has_its_expectations_and_names_its_source():
    assert sorted(p.name for p in PRESETS.glob("*.yaml")) == sorted(EXPECTED)
    for path in PRESETS.glob("*.yaml"):
        lines = path.read_text().splitlines()
        header = " ".join(line for line in lines[: lines.index(next(x for x in lines if not x.startswith("#")))])
        assert lines[0].startswith("# ") and " et al. 20" in header and "facebookresearch/" in header, path.name


@pytest.mark.parametrize("base", [None, "stl10.yaml"])
@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_every_preset_parses_and_builds_its_protocol_with_the_papers_values(
    preset, base, checkpoint, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the 1% preset's list, where it says to put it
    Path("data/imagenet_subsets").mkdir(parents=True)
    write(Path("data/imagenet_subsets/1percent.txt"), "n01440764_10026.JPEG\n")
    configs = ([ROOT / "configs/eval" / base] if base else []) + [PRESETS / preset]
    args = [arg for config in configs for arg in ("--config", str(config))]
    parser = build_parser()
    config = parser.parse_args([*args, "--checkpoint", str(checkpoint)])
    init = getattr(parser, "instantiate", parser.instantiate_classes)(config)
    (protocol,) = init["protocols"]
    expected = dict(EXPECTED[preset])
    assert type(protocol) is expected.pop("type") and protocol.name == Path(preset).stem
    assert {key: getattr(protocol, key) for key in expected} == expected  # YAML's 5.0e-4 is the float 5e-4
    if preset == "vjepa2_attentive.yaml":
        assert len(protocol.points) == 20  # V-JEPA 2's 4 x 5 product grid
    if preset == "dinov2_logreg.yaml":  # dinov2/eval/log_regression.py: 10 ** torch.linspace(-6, 5, 45)
        assert len(protocol.Cs) == 45 and protocol.Cs[0] == pytest.approx(1e-6) and protocol.Cs[-1] == 1e5
        torch.testing.assert_close(torch.tensor(protocol.Cs), 10 ** torch.linspace(-6, 5, 45), rtol=1e-6, atol=0)
    if preset == "ijepa_1percent.yaml":
        assert isinstance(init["data"].source, ImageFolderSource)


def test_attentive_heads_that_do_not_divide_the_width_name_the_divisors(checkpoint, tmp_path, capsys):
    with pytest.raises(ValueError) as error:
        AttentiveProtocol(num_heads=16).grids(None, 200)
    assert str(error.value) == (
        "num_heads=16 must divide the encoder width 200: try one of 1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 200."
    )
    with pytest.raises(ValueError) as error:  # 18 divisors: the 12 nearest 12
        AttentiveProtocol(num_heads=12).grids(None, 1280)
    assert str(error.value).endswith("try one of 1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 64, 80.")

    attentive = {"class_path": "ijepa.evaluation.AttentiveProtocol", "init_args": {"num_heads": 12, "epochs": 1}}
    args = ["--checkpoint", str(checkpoint), "--output_dir", str(tmp_path), "--accelerator", "cpu"]
    args += ["--data.source", json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 64}})]
    with pytest.raises(SystemExit):
        main([*args, "--data.num_workers", "0", "--data.batch_size", "16", "--protocols", json.dumps([attentive])])
    err = capsys.readouterr().err
    assert err == "error: num_heads=12 must divide the encoder width 32: try one of 1, 2, 4, 8, 16, 32.\n"
