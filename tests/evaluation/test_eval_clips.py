"""``ijepa eval`` on clips: a clip checkpoint on a clip source, every protocol kind, frame times
reaching M-RoPE as in training (``IJEPA.token_times``), clips adapted to another frame count as
``validate`` adapts them, the pixel baseline's tubelets, one augmentation for all the frames of a
clip, and the mismatches a user meets."""

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_MODEL
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

from ijepa.data import MovingShapesSource
from ijepa.data.collate import labeled_collate
from ijepa.data.sources import ShapesSource
from ijepa.evaluation import (
    AttentiveProtocol,
    EvalData,
    Evaluation,
    KNNProtocol,
    LinearProtocol,
    LogRegProtocol,
    LowShotProtocol,
    protocol_kinds,
    read_results,
)
from ijepa.evaluation.cache import FeatureCache
from ijepa.evaluation.context import EvalContext, encode
from ijepa.evaluation.data import ClipAugment
from ijepa.evaluation.encoders import PixelEncoder, open_encoder
from ijepa.evaluation.readouts import GridReadout
from ijepa.evaluation.runner import build_parser, main
from ijepa.interop import save_lightning_checkpoint
from ijepa.module import IJEPA

# 4 frames of 16 px, tubelets 2 x 8 x 8: a 2 x 2 x 2 token grid; M-RoPE reads the frame times, which
# become temporal positions in units of time_unit (0.4 s: two frames at 5 fps, one tubelet)
CLIP_MODEL = {
    **TINY_MODEL,
    "image_size": 16,
    "num_frames": 4,
    "tubelet_size": 2,
    "pos_embed": "mrope",
    "predictor_pos_embed": "mrope",
    "time_unit": 0.4,
}
CLIPS = {"train_size": 160, "val_size": 48, "fps": 5.0, "radius": (0.2, 0.3)}
SMALL = {**CLIPS, "train_size": 64, "val_size": 32}  # for the runs that only need to run


@pytest.fixture(scope="module")
def clip_checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**CLIP_MODEL), tmp_path_factory.mktemp("clips") / "clips.ckpt")


@pytest.fixture(scope="module")
def clips() -> EvalData:
    """The clips of a 4-frame encoder, rendered once for the tests that only read them."""
    data = clip_data()
    data.use_frames(4)
    return data


def clip_data(**options) -> EvalData:
    source = options.pop("source", None) or MovingShapesSource(**CLIPS)
    return EvalData(source, **{"batch_size": 16, "num_workers": 0, "val_fraction": 0.2, **options})


def evaluate(checkpoint, protocols, tmp_path, **options) -> list[dict]:
    options = {"data": clip_data(), "output_dir": str(tmp_path / "out"), "accelerator": "cpu", **options}
    return Evaluation(str(checkpoint), protocols, **options).run()


def first_batch(data: EvalData, split: str = "test", size: int = 16, count: int = 8):
    return next(iter(DataLoader(data.dataset(split, size), batch_size=count, collate_fn=labeled_collate)))


def test_every_protocol_kind_evaluates_a_clip_checkpoint(clip_checkpoint, clips, tmp_path):
    protocols = [
        KNNProtocol(ks=[5]),
        LogRegProtocol(Cs=[0.1, 10.0]),
        LinearProtocol(lrs=[0.1], weight_decays=[0.0], epochs=1, augment=False),
        LinearProtocol(lrs=[0.1], weight_decays=[0.0], epochs=1, augment=True, name="linear_augmented"),
        AttentiveProtocol(lrs=[1e-3], weight_decays=[0.0], epochs=1, num_heads=2, augment=True),
        LowShotProtocol(fractions=[0.5], shots=[2], tries=1, Cs=[1.0]),
    ]
    assert sorted({p.kind for p in protocols}) == sorted(protocol_kinds("labels"))  # every labels kind the registry has
    results = evaluate(clip_checkpoint, protocols, tmp_path, data=clips, cache=False)
    for result in results:
        assert read_results(tmp_path / "out" / f"{result['name']}.json") == json.loads(json.dumps(result))
        assert result["data"]["num_frames"] == 4 and result["data"]["image_size"] == 16
        assert result["data"]["test_images"] == 48 and result["data"]["num_classes"] == 4
        assert result["adapted"] is None
        scores = [result["test_top1"]] if result.get("test_top1") is not None else result["settings_results"]
        assert scores
    attentive = results[4]
    assert attentive["heads"] and 0 <= attentive["test_top1"] <= 1


def test_features_are_the_models_with_the_sources_frame_times(clip_checkpoint, clips):
    """The frame times reach M-RoPE as in training: every extracted feature equals the model's own
    on the clip with its times (tubelets' first times / time_unit); other times give others."""
    encoder, _ = open_encoder(str(clip_checkpoint))
    assert (encoder.num_frames, encoder.tubelet_size, encoder.time_unit) == (4, 2, 0.4)
    data = clips
    model = IJEPA.load_from_checkpoint(str(clip_checkpoint), map_location="cpu").eval()
    batch = first_batch(data)
    assert batch.images.shape == (8, 3, 4, 16, 16) and batch.frame_times is not None
    fabric = Fabric(accelerator="cpu", devices=1)
    blocks = encode(fabric, encoder, batch.images, "blocks", 1, batch.frame_times)
    tokens = encode(fabric, encoder, batch.images, "tokens", 1, batch.frame_times)
    assert torch.equal(blocks[:, 0], model.features(batch.images, frame_times=batch.frame_times))
    assert torch.equal(tokens, model.token_features(batch.images, frame_times=batch.frame_times))
    assert tokens.shape == (8, 2 * 2 * 2, 32)  # every tubelet token: T' H' W'
    assert not torch.allclose(encode(fabric, encoder, batch.images, "blocks", 1, 3 * batch.frame_times), blocks)
    # 5 fps and tubelets of 2 frames: 0.4 s between tubelets, one time_unit, so the times are the
    # tubelet indices that M-RoPE reads without times (and with times in seconds, not units, they would not be)
    assert torch.allclose(encode(fabric, encoder, batch.images, "blocks", 1, None), blocks, atol=1e-6)
    seconds = model.target_encoder.pooled_features(batch.images, frame_times=batch.frame_times[:, ::2])
    assert not torch.allclose(seconds, blocks[:, 0])

    # the features a protocol reads are these, for the whole split
    ctx = EvalContext(fabric, encoder, data, FeatureCache(None, {}), 16, 0)
    features, labels = ctx.features("test", "blocks", 1)
    assert torch.equal(features[:8], model.features(batch.images, frame_times=batch.frame_times))
    assert torch.equal(labels[:8], batch.labels)
    assert ctx.features("test", "tokens", 1)[0].shape == (48, 8, 32)


def test_another_frame_count_and_size_adapt_the_clip_encoder_as_validate_does(clip_checkpoint, tmp_path):
    for sizes in ({"num_frames": 8}, {"image_size": 32}):
        encoder, _ = open_encoder(str(clip_checkpoint), **sizes)
        model = IJEPA.load_from_checkpoint(str(clip_checkpoint), map_location="cpu", **sizes).eval()
        frames, side = sizes.get("num_frames", 4), sizes.get("image_size", 16)
        clips, times = torch.randn(2, 3, frames, side, side), torch.arange(frames).repeat(2, 1) / 5.0
        assert torch.equal(encoder.tokens(clips, times), model.token_features(clips, frame_times=times))
        assert encoder.adapted["trained"] == {
            "image_size": 16,
            "patch_size": 8,
            "num_frames": 4,
            "tubelet_size": 2,
            "grid": [2, 2, 2],
        }
    data = clip_data(source=MovingShapesSource(**SMALL), num_frames=8)
    result = evaluate(clip_checkpoint, [KNNProtocol(ks=[5])], tmp_path, data=data, cache=False)[0]
    assert result["adapted"]["evaluated"]["grid"] == [4, 2, 2] and result["data"]["num_frames"] == 8


def test_the_augmentation_crops_and_flips_every_frame_of_a_clip_alike(clips):
    frame = torch.randn(3, 1, 16, 16)
    still = frame.expand(3, 4, 16, 16).contiguous()  # four identical frames
    torch.manual_seed(1)
    augmented = ClipAugment(16, (0.2, 0.4))(still)
    assert augmented.shape == (3, 4, 16, 16) and not torch.allclose(augmented, still)
    for t in range(1, 4):  # one crop and one flip for the whole clip: the frames stay identical
        assert torch.equal(augmented[:, t], augmented[:, 0])

    # the probes' augmented train split: the same clips, labels and frame times, each clip cropped and flipped
    plain, augmented = clips.dataset("train", 16), clips.dataset("train", 16, augment=True)
    assert len(augmented) == len(plain)
    for index in range(3):
        assert len(augmented[index]) == 3 and torch.equal(augmented[index][2], plain[index][2])
        assert augmented[index][1] == plain[index][1] and augmented[index][0].shape == (3, 4, 16, 16)
    assert not torch.allclose(augmented[0][0], plain[0][0])


def test_the_pixel_baseline_on_clips_is_tubelet_tokens_their_mean_and_under_every_token_the_whole_clip(tmp_path):
    encoder = PixelEncoder(16, 8, num_frames=4, tubelet_size=2)
    clips = torch.randn(2, 3, 4, 16, 16)
    tokens = encoder.tokens(clips)
    assert encoder.width == 3 * 2 * 8 * 8 and torch.equal(encoder.block_means(clips, 1)[:, 0], tokens.mean(1))
    whole = GridReadout(None).pool(encoder.block_tokens(clips, 1), encoder.token_shape)[:, 0]
    assert encoder.token_shape == (2, 2, 2)
    assert torch.equal(whole.sort(1).values, clips.flatten(1).sort(1).values)  # the clip's values, reordered
    with pytest.raises(ValueError, match=r"GridReadout\(grid=2\) pools an image's 2-D token grid; clip tokens"):
        GridReadout(2).pool(encoder.block_tokens(clips, 1), encoder.token_shape)
    assert tokens.shape == (2, 2 * 2 * 2, 3 * 2 * 8 * 8)
    # token (t, row, column) is that tubelet, in the (t, r, c) order of the clip encoder's tokens
    t, r, c = 1, 0, 1
    index = (t * 2 + r) * 2 + c
    assert torch.equal(
        tokens[:, index], clips[:, :, 2 * t : 2 * t + 2, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8].flatten(1)
    )

    protocols = [KNNProtocol(ks=[5]), AttentiveProtocol(lrs=[1e-3], weight_decays=[0.0], epochs=1, augment=False)]
    data = clip_data(source=MovingShapesSource(**SMALL), image_size=16, num_frames=4)
    results = evaluate("pixels", protocols, tmp_path, data=data, pixel_patch_size=8, cache=False)
    assert [r["name"] for r in results] == ["knn", "attentive"] and results[0]["data"]["num_frames"] == 4


@pytest.fixture(scope="module")
def image_checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_lightning_checkpoint(IJEPA(**TINY_MODEL), tmp_path_factory.mktemp("images") / "images.ckpt")


SHAPES = json.dumps({"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 64, "val_size": 32}})
MOVING = json.dumps({"class_path": "ijepa.data.MovingShapesSource", "init_args": {"train_size": 64, "val_size": 32}})


@pytest.mark.parametrize(
    "which, extra, expected",
    [
        (
            "clips",
            ["--data.source", SHAPES],
            "data.source: ShapesSource gives images, but the checkpoint holds a clip encoder (num_frames=4): "
            "evaluate it on a clip source",
        ),
        (
            "images",
            ["--data.source", MOVING],
            "data.source: MovingShapesSource gives clips, but the checkpoint holds an image encoder",
        ),
        (
            "clips",
            ["--data.num_frames", "3"],
            "data.num_frames=3 is not a multiple of the checkpoint's tubelet size 2.",
        ),
        ("clips", ["--data.num_frames", "0"], "data.num_frames must be >= 1, got 0."),
        ("clips", ["--data.patch_size", "4"], "data.patch_size=4: a clip checkpoint's tubelets (2 x 8 x 8) cannot"),
        ("images", ["--data.source", MOVING, "--data.num_frames", "4"], "data.num_frames=4 is for clip checkpoints"),
        (
            "pixels",
            ["--data.image_size", "16"],
            "checkpoint=pixels on a clip source needs data.num_frames",
        ),
    ],
    ids=[
        "clip-checkpoint-image-source",
        "image-checkpoint-clip-source",
        "frames-not-a-multiple",
        "no-frames",
        "clip-patch-size",
        "frames-for-an-image-checkpoint",
        "pixels-without-frames",
    ],
)
def test_mismatches_are_one_line_naming_the_option(
    clip_checkpoint, image_checkpoint, tmp_path, capsys, which, extra, expected
):
    checkpoint = {"clips": str(clip_checkpoint), "images": str(image_checkpoint), "pixels": "pixels"}[which]
    args = ["--checkpoint", checkpoint, "--output_dir", str(tmp_path), "--accelerator", "cpu"]
    args += ["--data.source", MOVING, "--data.num_workers", "0"]
    args += ["--protocols", '[{"class_path": "ijepa.evaluation.KNNProtocol"}]']
    with pytest.raises(SystemExit) as exit_info:
        main(args + extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err


def test_an_image_source_refuses_frames_and_clips_need_a_frame_count():
    with pytest.raises(ValueError, match=r"^data.num_frames=4 is for clip sources; data.source ShapesSource gives"):
        EvalData(ShapesSource(), num_frames=4)
    with pytest.raises(ValueError, match=r"gives clips and no frame count is set"):
        clip_data().dataset("test", 16)


def test_the_video_quickstart_eval_config_reads_the_training_configs_clips(clip_checkpoint):
    import yaml

    parser = build_parser()
    config = ROOT / "configs/eval/video_quickstart.yaml"
    init = parser.instantiate_classes(parser.parse_args(["--config", str(config), "--checkpoint", "x.ckpt"]))
    assert sorted(p.kind for p in init["protocols"]) == sorted(protocol_kinds("labels"))
    source = init["data"].source
    trained = yaml.safe_load((ROOT / "configs/video_quickstart.yaml").read_text())["data"]["source"]
    assert isinstance(source, MovingShapesSource) and trained["class_path"] == "ijepa.data.MovingShapesSource"
    assert json.loads(json.dumps(source.config()["init_args"])) == {
        **json.loads(json.dumps(MovingShapesSource().config()["init_args"])),
        **trained["init_args"],
    }
    assert init["data"].image_size is None and init["data"].num_frames is None  # the checkpoint's
