"""``ijepa convert ... hf|timm --dtype bf16`` and the model card (``README.md``) every folder
export gets: bf16 weights load everywhere the fp32 ones do, within bf16's rounding; the card lists
the ``ijepa eval`` results of its checkpoint and nothing else; its loading lines run.

Tolerances. bfloat16 keeps 8 significant bits: rounding to nearest changes a value by at most
``U = 2**-8`` of it. To first order, each weight matrix on the way from pixels to a feature (the
patch projection, then qkv, proj, fc1, fc2 per block) adds at most ``U`` relative error, the
LayerNorms (scale-free) passing it on: features computed in float32 from bf16 weights are within
``(1 + 4 * depth) * U * scale`` of the float32 encoder's, ``scale`` the largest feature magnitude.
Computing in bfloat16 too (transformers' default for a bf16 folder) rounds every activation as
well: twice that. A wrong or unrounded conversion is off by ``O(scale)``, far outside; and the
differences must not be zero (the weights were rounded)."""

import json
import struct
from pathlib import Path

import pytest
import timm
import torch
from conftest import TINY_CONFIG
from transformers import IJepaModel

from ijepa.cli import main
from ijepa.data.sources import ShapesSource
from ijepa.evaluation import EvalData, Evaluation, KNNProtocol, LowShotProtocol
from ijepa.evaluation.runner import default_output_dir
from ijepa.interop import load_encoder, load_hf
from ijepa.interop.card import NO_RESULTS, WEIGHTS_ONLY_KEY, code_blocks, eval_folder
from ijepa.interop.ijepa_model import WEIGHTS_ONLY_KEY as MARKER

pytestmark = pytest.mark.slow  # each test reads a checkpoint trained by `ijepa fit` (a module fixture)

U = 2.0**-8  # bfloat16's unit roundoff
DEPTH = 2  # tests/tiny.yaml's
WEIGHTS_TOLERANCE = (1 + 4 * DEPTH) * U  # times the features' scale: bf16 weights, float32 compute
COMPUTE_TOLERANCE = 2 * WEIGHTS_TOLERANCE  # bf16 weights and bf16 compute
# tests/tiny.yaml with the callbacks a checkpoint needs only: a 2-step run in seconds
CALLBACKS = """trainer:
  logger: false
  callbacks:
    - class_path: ijepa.callbacks.EMATargetUpdate
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """``last.ckpt`` of a 2-step ``ijepa fit`` of tests/tiny.yaml in ``<run>/checkpoints/``."""
    root = tmp_path_factory.mktemp("card") / "run"
    overrides = root.parent / "callbacks.yaml"
    overrides.write_text(CALLBACKS)
    args = ["--trainer.max_steps", "2", "--trainer.default_root_dir", str(root)]
    main(["fit", "--config", str(TINY_CONFIG), "--config", str(overrides), *args])
    return root / "checkpoints" / "last.ckpt"


def images(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@torch.no_grad()
def reference(checkpoint: Path, encoder: str = "target") -> torch.Tensor:
    """The float32 features of the checkpoint's encoder."""
    return load_encoder(checkpoint, encoder)(images())


def assert_within(features: torch.Tensor, expected: torch.Tensor, tolerance: float, rounded: bool = True) -> None:
    difference = (features.float() - expected).abs().max().item()
    bound = tolerance * expected.abs().max().item()
    assert difference <= bound, f"{difference:.3g} > {bound:.3g}"
    assert difference > 0 or not rounded, "bf16 features equal the float32 ones: were the weights rounded?"


def convert(*args) -> None:
    main(["convert", *map(str, args)])


def data_bytes(path: Path) -> int:
    """The tensors' bytes of a safetensors file (its size less the 8-byte length and JSON header)."""
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - header


def test_a_bf16_export_loads_with_load_hf_transformers_and_timm_within_bf16_rounding_at_half_the_size(tmp_path, run):
    expected = reference(run)
    for to in ("hf", "timm"):
        convert(run, tmp_path / f"{to}32", to)
        convert(run, tmp_path / f"{to}16", to, "--dtype", "bf16")
        full, half = tmp_path / f"{to}32" / "model.safetensors", tmp_path / f"{to}16" / "model.safetensors"
        assert 2 * data_bytes(half) == data_bytes(full)  # every tensor is floating point
        assert half.stat().st_size < 0.55 * full.stat().st_size  # and the header is small
    assert json.loads((tmp_path / "hf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert json.loads((tmp_path / "hf32" / "config.json").read_text())["torch_dtype"] == "float32"

    encoder = load_hf(tmp_path / "hf16")  # float32, the stored values widened; sincos recognised, rebuilt exact
    assert {p.dtype for p in encoder.parameters()} == {torch.float32} and encoder.position.name == "sincos"
    with torch.no_grad():
        assert_within(encoder(images()), expected, WEIGHTS_TOLERANCE)
        assert next(load_hf(tmp_path / "hf16", dtype=None).parameters()).dtype == torch.bfloat16
        assert_within(load_hf(tmp_path / "hf32")(images()), expected, 1e-6, rounded=False)

        model = IJepaModel.from_pretrained(tmp_path / "hf16")  # transformers 5: the stored dtype
        assert model.dtype == torch.bfloat16
        assert_within(model(pixel_values=images().bfloat16()).last_hidden_state, expected, COMPUTE_TOLERANCE)
        model = IJepaModel.from_pretrained(tmp_path / "hf16", dtype=torch.float32)
        assert_within(model(pixel_values=images()).last_hidden_state, expected, WEIGHTS_TOLERANCE)

        vit = timm.create_model(f"local-dir:{tmp_path / 'timm16'}", pretrained=True).eval()
        assert next(vit.parameters()).dtype == torch.float32
        assert_within(vit.forward_features(images()), expected, WEIGHTS_TOLERANCE)


def evaluate(checkpoint: Path, protocols: list, **options) -> list[dict]:
    data = EvalData(source=ShapesSource(train_size=96, val_size=32), batch_size=32, num_workers=0, val_fraction=0.25)
    return Evaluation(str(checkpoint), protocols, data=data, accelerator="cpu", cache=False, **options).run()


def test_the_card_lists_every_eval_result_of_its_checkpoint_and_encoder_and_nothing_else(tmp_path, run):
    checkpoints = run.parent
    convert(run, tmp_path / "before", "hf")
    assert (
        f"{NO_RESULTS} (looked in `{checkpoints.parent / 'eval' / 'last'}`"
        in (tmp_path / "before/README.md").read_text()
    )

    low_shot = LowShotProtocol(fractions=[0.5], shots=[], tries=2, Cs=[1.0], max_iter=50)
    results = evaluate(run, [KNNProtocol(ks=[5, 10]), low_shot])  # the default folder: <run>/eval/last/
    folder = checkpoints.parent / "eval" / "last"
    assert sorted(p.name for p in folder.glob("*.json")) == ["knn.json", "low_shot.json"]
    # not of this export: the online encoder's results in the same folder, another checkpoint's
    # results beside, and a results file of an earlier last.ckpt (another SHA-256)
    evaluate(run, [KNNProtocol(ks=[5], name="knn_online")], encoder="online", output_dir=str(folder))
    other = checkpoints / "epoch=0-step=2.ckpt"
    evaluate(other, [KNNProtocol(ks=[5], name="knn_other")])
    stale = json.loads((folder / "knn.json").read_text())
    stale["name"], stale["checkpoint"]["sha256"] = "knn_stale", "0" * 64
    (folder / "knn_stale.json").write_text(json.dumps(stale))
    (folder / "notes.json").write_text('{"not": "a results file"}')

    convert(run, tmp_path / "hf", "hf", "--dtype", "bf16")
    convert(run, tmp_path / "timm", "timm")
    convert(run, tmp_path / "online", "hf", "--encoder", "online")
    for name in ("hf", "timm"):
        card = (tmp_path / name / "README.md").read_text()
        section = card.split("## Evaluation")[1].split("\n## ")[0]
        rows = [line for line in section.splitlines() if line.startswith("| ") and "protocol" not in line]
        assert len(rows) == 2, section
        knn, shot = results
        assert rows[0].startswith("| knn (knn) | test top-1 ") and f"{100 * knn['test_top1']:.2f} %" in rows[0]
        assert f"({knn['selected']}; val top-1 {100 * knn['val_top1']:.2f} %)" in rows[0]
        assert f"`{folder / 'knn.json'}`" in rows[0] and "`ShapesSource`, 32 px, 32 test images" in rows[0]
        setting = shot["settings_results"][0]
        assert rows[1].startswith("| low_shot (low_shot) | test top-1 ")
        assert f"{setting['name']} {100 * setting['mean']:.2f} ± {100 * setting['std']:.2f} %" in rows[1]
        assert f"`{folder / 'low_shot.json'}`" in rows[1]
        for absent in ("knn_online", "knn_other", "knn_stale", "notes", NO_RESULTS):
            assert absent not in section
        assert "Not listed: 2 results file(s)" in section  # the online one and the stale one
    online = (tmp_path / "online" / "README.md").read_text().split("## Evaluation")[1].split("\n## ")[0]
    assert "knn_online (knn)" in online and "| knn (knn)" not in online and "low_shot" not in online

    card = (tmp_path / "hf" / "README.md").read_text()
    assert "| width | 32 |" in card and "| depth | 2 |" in card and "| heads | 2 |" in card
    assert "| patch | 8 |" in card and "| image size | 32 (4 x 4 patches) |" in card
    assert "`sincos`" in card and "| parameters | 32,160 " in card and "| dtype | bfloat16 " in card
    assert "| optimizer steps (`global_step`) | 2 |" in card and "| batch size (per process) | 32 |" in card
    assert "`ShapesSource` (train_size=640, val_size=160" in card
    assert "library_name: transformers" in card and "library_name: timm" in (tmp_path / "timm/README.md").read_text()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_cards_loading_lines_run_and_give_the_encoders_features(tmp_path, run, dtype):
    expected = reference(run)
    tolerance = {"fp32": 1e-5, "bf16": COMPUTE_TOLERANCE}[dtype]
    kinds = {
        "hf": ("load_hf(", "IJepaModel.from_pretrained("),
        "timm": ("local-dir:", "pretrained_cfg_overlay", "load_file("),
    }
    for to, lines in kinds.items():
        folder = tmp_path / to
        convert(run, folder, to, "--dtype", dtype)
        blocks = code_blocks((folder / "README.md").read_text())
        assert len(blocks) == len(lines) and all(line in block for line, block in zip(lines, blocks)), blocks
        for block in blocks:
            namespace = {"images": images()}
            with torch.no_grad():
                exec(block, namespace)
            assert_within(namespace["features"], expected, tolerance, rounded=dtype == "bf16")


def test_cards_of_official_hf_and_weights_only_sources_say_what_is_unknown(tmp_path, run):
    convert(run, tmp_path / "o.pth.tar", "official")
    convert(tmp_path / "o.pth.tar", tmp_path / "from_official", "hf", "--num_heads", "2", "--predictor_num_heads", "2")
    card = (tmp_path / "from_official" / "README.md").read_text()
    assert "an official I-JEPA checkpoint" in card and "epoch 0 (the official run's count)" in card
    assert "training data, batch size and steps: not recorded in the source: unknown" in card
    convert(tmp_path / "from_official", tmp_path / "from_hf", "timm")
    card = (tmp_path / "from_hf" / "README.md").read_text()
    assert "a Hugging Face `IJepaModel` folder" in card and "(its own `README.md` may say more)" in card
    convert(tmp_path / "from_official", tmp_path / "w.ckpt", "ckpt", "--predictor_num_heads", "2")
    convert(tmp_path / "w.ckpt", tmp_path / "from_weights", "hf")
    assert "A weights-only checkpoint" in (tmp_path / "from_weights" / "README.md").read_text()
    for name in ("from_official", "from_hf", "from_weights"):
        assert NO_RESULTS in (tmp_path / name / "README.md").read_text()


def convert_error(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        convert(*args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["fp16", "float32", "int8"])
def test_a_dtype_other_than_fp32_or_bf16_is_refused_naming_dtype_and_the_valid_values(tmp_path, capsys, run, dtype):
    err = convert_error(capsys, run, tmp_path / "hf", "hf", "--dtype", dtype)
    assert "dtype" in err and "fp32" in err and "bf16" in err and dtype in err, err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("to", ["ckpt", "official"])
def test_bf16_is_refused_for_the_checkpoint_formats(tmp_path, capsys, run, to):
    err = convert_error(capsys, run, tmp_path / "out", to, "--dtype", "bf16")
    assert err.strip() == (
        f"ijepa convert: error: --dtype bf16 applies to the folder formats ['hf', 'timm']; {to} is written in "
        "float32 (a checkpoint to train from): leave --dtype at fp32."
    )
    assert not (tmp_path / "out").exists()


def test_the_card_looks_where_ijepa_eval_writes_and_knows_the_weights_only_marker():
    for checkpoint in ("runs/a/checkpoints/last.ckpt", "/abs/run/checkpoints/epoch=3-step=9.ckpt", "x.ckpt", "hf"):
        assert eval_folder(Path(checkpoint)) == default_output_dir(checkpoint)
    assert WEIGHTS_ONLY_KEY == MARKER
