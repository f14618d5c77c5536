"""Clip data: the folder-of-videos loader (PyAV), timestamps in batches, generated clips."""

import pytest
import torch
from conftest import tiny_datamodule
from helpers import make_video_folder, write_video

pytest.importorskip("av", reason="the videofolder dataset needs the 'video' extra (installed by '.[dev]')")

from ijepa.data.sources import MovingShapesSource, VideoFolderSource  # noqa: E402
from ijepa.data.video_folder import VideoFolderClips, decode_clip  # noqa: E402
from ijepa.masks import SpatioTemporalMasks  # noqa: E402


def frame_indices(clip: torch.Tensor) -> list[int]:
    return (clip.float().mean((1, 2, 3)) / 8).round().int().tolist()


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    return {"10fps": write_video(root / "a.mp4", 30, 10), "20fps": write_video(root / "b.mp4", 30, 20)}


def test_fps_sampling_gives_the_same_times_at_any_frame_rate(videos):
    # centre of a 3 s video, 4 frames at 5 fps: instants 1.2, 1.4, 1.6, 1.8 s
    clip, times = decode_clip(videos["10fps"], 4, fps=5.0, start="center")
    assert clip.shape == (4, 3, 32, 32) and clip.dtype == torch.uint8
    assert frame_indices(clip) == [12, 14, 16, 18]
    torch.testing.assert_close(times, torch.tensor([0.0, 0.2, 0.4, 0.6]))
    # the 20 fps video (1.5 s) at 5 fps: every 4th frame, the same times
    clip, times20 = decode_clip(videos["20fps"], 4, fps=5.0, start="center")
    assert frame_indices(clip) == [9, 13, 17, 21]
    torch.testing.assert_close(times20, times)


def test_frame_stride_follows_each_videos_own_rate(videos):
    clip, times = decode_clip(videos["10fps"], 4, frame_stride=2, start="center")
    first = frame_indices(clip)[0]
    assert frame_indices(clip) == [first, first + 2, first + 4, first + 6]
    torch.testing.assert_close(times, torch.tensor([0.0, 0.2, 0.4, 0.6]))
    _, times = decode_clip(videos["20fps"], 4, frame_stride=2, start="center")
    torch.testing.assert_close(times, torch.tensor([0.0, 0.1, 0.2, 0.3]))  # half the time: twice the rate


def test_random_start_is_seeded_and_short_videos_repeat_their_last_frame(videos, tmp_path):
    torch.manual_seed(3)
    a = decode_clip(videos["10fps"], 4, fps=5.0)
    torch.manual_seed(3)
    b = decode_clip(videos["10fps"], 4, fps=5.0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    starts = set()
    for seed in range(6):
        torch.manual_seed(seed)
        starts.add(frame_indices(decode_clip(videos["10fps"], 4, fps=5.0)[0])[0])
    assert len(starts) > 1 and all(0 <= s <= 30 - 7 for s in starts)
    short = write_video(tmp_path / "short.mp4", 3, 10)
    clip, times = decode_clip(short, 5, frame_stride=1)
    assert frame_indices(clip) == [0, 1, 2, 2, 2]
    torch.testing.assert_close(times, torch.tensor([0.0, 0.1, 0.2, 0.2, 0.2]))


def test_video_folder_clips_and_their_errors(tmp_path, videos):
    for name in ("left", "right"):
        (tmp_path / name).mkdir()
        write_video(tmp_path / name / "x.mp4", 12, 10)
    (tmp_path / "right" / "notes.txt").write_text("not a video")
    data = VideoFolderClips(tmp_path, num_frames=4, image_size=16, fps=5.0, start="center", crop_scale=None)
    assert data.classes == ["left", "right"] and data.targets == [0, 1] and len(data) == 2
    clip, label, times = data[1]
    assert clip.shape == (4, 3, 16, 16) and label == 1 and times.shape == (4,)
    # one random resized crop for all frames of a clip: flat frames stay flat
    cropped = VideoFolderClips(tmp_path, num_frames=4, image_size=16, fps=5.0, crop_scale=(0.3, 1.0))
    clip = cropped[0][0]
    assert clip.shape == (4, 3, 16, 16) and (clip.float().std((1, 2, 3)) < 2).all()

    (tmp_path / "left" / "broken.mp4").write_bytes(b"\x00" * 100)
    broken = VideoFolderClips(tmp_path, num_frames=4, image_size=16)
    with pytest.raises(ValueError, match=r"unreadable video .*broken\.mp4"):
        broken[0]
    with pytest.raises(FileNotFoundError, match="no videos under data.source.root"):
        VideoFolderClips(tmp_path / "left" / "missing", num_frames=4, image_size=16)
    with pytest.raises(ValueError, match=r"fps \(data.source.fps\) must be a positive number"):
        VideoFolderClips(tmp_path, num_frames=4, image_size=16, fps=0.0)
    with pytest.raises(ValueError, match=r"frame_stride \(data.source.frame_stride\) must be an int >= 1"):
        VideoFolderClips(tmp_path, num_frames=4, image_size=16, frame_stride=0)


def test_datamodule_videofolder_batches_carry_frame_times(tmp_path):
    from ijepa.data import IJEPADataModule

    root = make_video_folder(tmp_path)
    data = IJEPADataModule(
        source=VideoFolderSource(root=str(root), fps=5.0),
        num_frames=4,
        tubelet_size=2,
        image_size=16,
        patch_size=4,
        batch_size=4,
        num_workers=0,
        masks=SpatioTemporalMasks(target_scale=(0.1, 0.15)),
    )
    data.setup("fit")
    assert data.num_classes == 2
    batch = next(iter(data.train_dataloader()))
    assert batch.images.shape == (4, 3, 4, 16, 16) and batch.frame_times.shape == (4, 4)
    # the shown frames' own times: 0.2 s apart at 5 fps from 10 and 20 fps sources, any start
    torch.testing.assert_close(batch.frame_times, torch.tensor([[0.0, 0.2, 0.4, 0.6]]).expand(4, -1))
    assert batch.context_indices.max() < 2 * 4 * 4
    probe = next(iter(data.probe_test_dataloader()))
    assert probe.images.shape == (4, 3, 4, 16, 16) and probe.frame_times.shape == (4, 4)
    # by stride, each video's own rate sets the times
    data = IJEPADataModule(
        source=VideoFolderSource(root=str(root), frame_stride=2),
        num_frames=4,
        image_size=16,
        patch_size=4,
        batch_size=4,
        num_workers=0,
    )
    data.setup("fit")
    gaps = next(iter(data.probe_test_dataloader())).frame_times.diff(dim=1)
    assert sorted({round(g, 3) for g in gaps.flatten().tolist()}) == [0.1, 0.2]
    with pytest.raises(ValueError, match="fps must be > 0"):
        IJEPADataModule(source=VideoFolderSource(fps=-1.0), num_frames=4)
    with pytest.raises(FileNotFoundError, match="video folder not found"):
        IJEPADataModule(source=VideoFolderSource(root=str(tmp_path / "nope")), num_frames=4).setup()
    (tmp_path / "only_val" / "val" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="has val/ but no train/ folder"):
        IJEPADataModule(source=VideoFolderSource(root=str(tmp_path / "only_val")), num_frames=4).setup()


def test_moving_shapes_with_a_frame_rate_carry_frame_times():
    clips = dict(
        num_frames=4, image_size=16, patch_size=4, batch_size=4, masks=SpatioTemporalMasks(target_scale=(0.1, 0.15))
    )
    data = tiny_datamodule(source=MovingShapesSource(train_size=8, val_size=8, fps=12.5), **clips)
    data.setup("fit")
    for batch in (next(iter(data.train_dataloader())), next(iter(data.probe_train_dataloader()))):
        torch.testing.assert_close(batch.frame_times[0], torch.tensor([0.0, 0.08, 0.16, 0.24]))
    plain = tiny_datamodule(source=MovingShapesSource(train_size=8, val_size=8), **clips)
    plain.setup("fit")
    assert next(iter(plain.train_dataloader())).frame_times is None
