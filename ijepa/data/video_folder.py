"""Clips from a folder of video files, one sub-folder per class, decoded with PyAV.

PyAV (``pip install -e '.[video]'`` in a clone, or ``pip install av``) is the maintained Python binding of FFmpeg; its wheels carry
their own FFmpeg, so nothing else needs installing. (torchvision's own video reader is deprecated,
and torchcodec needs a system FFmpeg.)

A clip is ``num_frames`` frames taken either at a fixed rate (``fps``: the frame shown at each
instant ``start + k / fps``, so videos recorded at 24, 30 or 60 frames per second give clips of the
same duration) or every ``frame_stride``-th decoded frame (the clip's duration then follows each
video's own rate). Either way each item carries the frames' presentation times in seconds from
the clip's first frame, which M-RoPE uses as its temporal positions (Qwen2.5-VL's absolute time
alignment), so positions stay consistent across frame rates.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import v2

from ijepa.data.imagefolder import UNLABELLED, class_files, find_classes

VIDEO_EXTENSIONS: tuple[str, ...] = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")
CLIP_STARTS: tuple[str, ...] = ("random", "center")


def _import_av():
    try:
        import av
    except ImportError as error:  # the optional extra
        raise ImportError(
            "VideoFolderSource decodes with PyAV: pip install av (in a clone: pip install -e '.[video]')."
        ) from error
    return av


def find_videos(
    root: str | Path, class_to_idx: dict[str, int] | None = None
) -> tuple[list[tuple[Path, int]], list[str], dict[str, int]]:
    """``(path, class index)`` of every video under ``root/<class>/`` (sorted), the class names and
    their indices. The classes are :func:`ijepa.data.imagefolder.find_classes`': the sub-folders,
    or the training split's ``class_to_idx`` when given, so that every split numbers a class alike.
    A folder without class sub-folders holds loose, unlabelled videos (label ``-1``). Class
    folders are walked by :func:`ijepa.data.imagefolder.class_files`: directory links are
    followed, but never into a loop or to a folder read already."""
    root = Path(root)
    classes, class_to_idx = find_classes(root, class_to_idx) if root.is_dir() else ([], {})
    if class_to_idx:
        found = class_files(root, classes, lambda path: Path(path).suffix.lower() in VIDEO_EXTENSIONS)
        samples = [(path, class_to_idx[name]) for name in classes for path in sorted(map(Path, found[name]))]
    else:  # no class folders: the videos directly in root
        samples = [
            (path, UNLABELLED)
            for path in (sorted(root.iterdir()) if root.is_dir() else [])
            if path.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS
        ]
    if not samples:
        raise FileNotFoundError(
            f"no videos under data.source.root={str(root)!r}: expected video files ({', '.join(VIDEO_EXTENSIONS)}), "
            f"in one sub-folder per class or directly in the folder (unlabelled)."
        )
    return samples, classes, class_to_idx


def decode_clip(
    path: str | Path, num_frames: int, fps: float | None = None, frame_stride: int = 1, start: str = "random"
) -> tuple[Tensor, Tensor]:
    """Decode one clip of ``path``: ``uint8 [T, 3, H, W]`` frames and their times ``[T]`` (seconds
    from the clip's first frame).

    ``fps`` set: the frame on screen at each ``start_time + k / fps``. Otherwise every
    ``frame_stride``-th frame from a start frame. ``start="random"`` draws the start from the
    global torch generator (seeded per sample by :class:`ijepa.data.sampling.SeededSamples`);
    ``"center"`` centres the clip in the video. A video shorter than the clip repeats its last
    frame, with its time, to fill the clip.
    """
    av = _import_av()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        time_base = float(stream.time_base)
        duration = _duration(container, stream)
        native_fps = float(stream.average_rate or stream.guessed_rate or 0) or None
        # The clip's span in seconds, from its first frame's time to its last one's.
        if fps is not None:
            span = (num_frames - 1) / fps
        else:
            if native_fps is None:
                raise ValueError(f"{path}: no frame rate in the stream; set data.source.fps to sample by time.")
            span = (num_frames - 1) * frame_stride / native_fps
        room = max(0.0, duration - span) if duration is not None else 0.0
        start_time = room * (torch.rand(()).item() if start == "random" else 0.5)
        if start_time > 0:
            container.seek(int(start_time / time_base), stream=stream, backward=True, any_frame=False)
        frames, times = [], []  # decoded frames the clip may still use, and their times
        needed = (num_frames - 1) * frame_stride + 1  # stride mode: decoded frames the clip spans
        seen = 0  # stride mode: frames decoded from the start on
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            t = frame.pts * time_base
            if fps is not None:
                if t <= start_time + 1e-6:  # a later frame still not after the start supersedes the earlier ones
                    frames.clear(), times.clear()
                frames.append(frame), times.append(t)
                if t >= start_time + span - 1e-6:
                    break
            elif t >= start_time - 0.5 / native_fps:  # from the first frame at the start on
                if seen % frame_stride == 0:
                    frames.append(frame), times.append(t)
                seen += 1
                if seen >= needed:
                    break
    if not frames:
        raise ValueError(f"{path}: no decodable video frames.")
    if fps is not None:
        # the frame on screen at each instant: the last one whose time is not after it
        instants = [start_time + k / fps for k in range(num_frames)]
        picks = [max(sum(t <= instant + 1e-6 for t in times) - 1, 0) for instant in instants]
    else:
        picks = [min(k, len(frames) - 1) for k in range(num_frames)]
    clip = torch.stack([torch.from_numpy(frames[i].to_ndarray(format="rgb24")).permute(2, 0, 1) for i in picks])
    clip_times = torch.tensor([times[i] for i in picks], dtype=torch.float64)
    return clip, (clip_times - clip_times[0]).float()


def _duration(container, stream) -> float | None:
    if stream.duration is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # av.time_base: microseconds
    return None


class VideoFolderClips(Dataset):
    """Labelled clips from ``root/<class>/<video file>``: items ``(clip, label, frame_times)``.

    Args:
        root: folder with one sub-folder per class, or with loose (unlabelled) videos.
        num_frames: frames per clip.
        image_size: the frames' side after the spatial transform.
        fps: sample frames at this rate (seconds-consistent clips); ``None`` uses ``frame_stride``.
        frame_stride: take every n-th decoded frame (when ``fps`` is ``None``).
        start: ``random`` (training) or ``center`` (evaluation) clip position in each video.
        crop_scale: area range of a random resized crop shared by all frames of a clip, or
            ``None`` for resize and centre crop.
        transform: applied last to the ``uint8 [T, 3, image_size, image_size]`` clip
            (e.g. :class:`ijepa.data.transforms.ClipToTensor`).
        class_to_idx: number the classes by this index (the training split's) instead of the
            folder's own; a class folder it lacks is a ``ValueError``.

    ``clip`` is what ``transform`` returns, ``label`` the class index (``-1`` for loose videos in
    a folder without class sub-folders), ``frame_times [T]`` seconds from the clip's first frame.
    """

    def __init__(
        self,
        root: str | Path,
        num_frames: int,
        image_size: int,
        fps: float | None = None,
        frame_stride: int = 1,
        start: str = "random",
        crop_scale: tuple[float, float] | None = None,
        transform=None,
        class_to_idx: dict[str, int] | None = None,
    ):
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}.")
        if fps is not None and not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps (data.source.fps) must be a positive number or null, got {fps!r}.")
        if isinstance(frame_stride, bool) or not isinstance(frame_stride, int) or frame_stride < 1:
            raise ValueError(f"frame_stride (data.source.frame_stride) must be an int >= 1, got {frame_stride!r}.")
        if start not in CLIP_STARTS:
            raise ValueError(f"start must be one of {CLIP_STARTS}, got {start!r}.")
        _import_av()
        self.samples, self.classes, self.class_to_idx = find_videos(root, class_to_idx)
        self.targets = [label for _, label in self.samples]
        self.num_frames, self.image_size, self.fps, self.frame_stride, self.start = (
            num_frames,
            image_size,
            fps,
            frame_stride,
            start,
        )
        if crop_scale is None:
            self.spatial = v2.Compose([v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)])
        else:
            self.spatial = v2.RandomResizedCrop(image_size, scale=tuple(crop_scale), antialias=True)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int, Tensor]:
        path, label = self.samples[index]
        try:
            frames, times = decode_clip(path, self.num_frames, self.fps, self.frame_stride, self.start)
        except ImportError:
            raise
        except Exception as error:  # PyAV raises its own error types for unreadable files
            raise ValueError(
                f"unreadable video {path} ({type(error).__name__}: {error}); remove it from data.source.root."
            ) from error
        # One tv_tensors.Video: v2 draws a crop once and applies it to every frame.
        from torchvision import tv_tensors

        clip = self.spatial(tv_tensors.Video(frames)).as_subclass(Tensor)
        if self.transform is not None:
            clip = self.transform(clip)
        return clip, label, times
