"""Video references in records: resolving them and checking them before training.

A record's video is a path string (a video file, absolute or relative to the entry's image root) or a list of path
strings (the video's frames, in order, already sampled). The `video` field holds one video; `videos` holds a list of
them. Checking opens each video file with PyAV, decodes its first frame and reads its packets to the end (and checks
each frame file as an image), so that a missing, unreadable, empty or cut-short video, or one of a single frame, stops
the loader with one line naming it; the frames a prompt uses are decoded later, when its row is encoded
(`vlm_grpo.data.video_frames`).

A file's frame count is what its header declares where the container keeps one (MP4, MOV, AVI); MKV, WebM and MPEG-TS
keep none, and their frames are counted (`vlm_grpo.data.video_frames.count_frames`). A file is cut short when fewer
frames can be read than its header declares, or, without a declared count, when its frames end well before the
duration its header declares (MKV and WebM write one; an MPEG-TS stream has no header that says, so a cut one reads as a
shorter video).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from .images import ImageRef, check_image

MIN_VIDEO_FRAMES = 2
"""Fewest frames a video may have. The Qwen-VL and GLM video encoders read frames in pairs and their processors fail
on one frame; a single frame is an image, and belongs in `image`."""

CUT_SHORT_SECONDS = 0.5
"""How far (at least; two frame intervals where that is longer) the frames of a file without a declared frame count
may end before the duration its header declares, for muxers that round or leave out the last frame's duration."""


@dataclass(frozen=True)
class VideoRef:
    """A resolved reference to one video.

    Attributes:
        path (`str | None`): Absolute path of the video file, or `None` for a list of frames.
        frames (`tuple[str, ...]`): Absolute paths of the frame files, in order; empty for a video file.
    """

    path: str | None = None
    frames: tuple[str, ...] = ()

    @property
    def display_path(self) -> str:
        """The path for messages: the file, or the first frame's path with the number of frames."""
        return self.path if self.path is not None else f"{self.frames[0]} (+{len(self.frames) - 1} frames)"

    def storage(self) -> dict:
        """The `{"path", "frames"}` mapping stored in the dataset's `videos` column."""
        return {"path": self.path, "frames": list(self.frames)}


def _path(item: object, root: str, position: str) -> str:
    if not isinstance(item, str):
        raise ValueError(
            f"{position} has type {type(item).__name__} ({item!r:.60}); expected a video file path or a list of "
            "frame file paths"
        )
    if not item.strip():
        raise ValueError(f"{position} is an empty path; give a file path, or null for a record without video")
    return os.path.abspath(os.path.join(root, os.path.expanduser(item)))


def _video(item: object, root: str, position: str) -> VideoRef:
    if isinstance(item, (list, tuple)):
        if not item:
            raise ValueError(f"{position} is an empty list of frames; give at least one frame file")
        return VideoRef(frames=tuple(_path(f, root, f"{position} frame {k}") for k, f in enumerate(item)))
    return VideoRef(path=_path(item, root, position))


def video_refs_from_value(value: object, root: str, many: bool) -> list[VideoRef]:
    """Turn a record's video value into resolved references.

    Args:
        value (`object`): `None`, or one video (`many=False`: a path, or a list of frame paths), or a list of
            videos (`many=True`).
        root (`str`): Absolute folder that relative paths resolve against.
        many (`bool`): whether the value is a list of videos (the `videos` field) or one video (`video`).

    Returns:
        `list[VideoRef]`: One reference per video; empty for `None` or an empty `videos` list.

    Raises:
        ValueError: A video has the wrong type or is empty; the message names it.
    """
    if value is None:
        return []
    if not many:
        return [_video(value, root, "the value")]
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"'videos' holds {type(value).__name__} ({value!r:.60}); expected a list of videos (use 'video' for one)"
        )
    return [_video(item, root, f"video {k}") for k, item in enumerate(value)]


def too_few_frames(frames: int, what: str = "the video") -> str | None:
    """Why a video of `frames` frames cannot train (fewer than `MIN_VIDEO_FRAMES`), or `None`.

    Args:
        frames (`int`): the video's frame count.
        what (`str`, *optional*, defaults to `"the video"`): how the message names the video.
    """
    if frames >= MIN_VIDEO_FRAMES:
        return None
    return (
        f"{what} has {frames} frame{'s' if frames != 1 else ''}, and a video needs at least {MIN_VIDEO_FRAMES} (the "
        "Qwen-VL and GLM video encoders read frames in pairs); give a single frame as an image ('image')"
    )


def frame_rate(stream: Any) -> float:
    """A PyAV video stream's frames per second: its average rate, else the rate FFmpeg guesses, else its base rate.

    Raises:
        ValueError: The stream states no rate.
    """
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate:
        raise ValueError("the video stream states no frame rate; re-encode it with one (e.g. ffmpeg -r 30)")
    return float(rate)


def declared_seconds(container: Any, stream: Any) -> float | None:
    """The duration a file's header declares for its video stream: the stream's own (MP4, MPEG-TS), else Matroska's
    per-track `DURATION` tag (MKV, WebM), else the file's when the video is its only stream; `None` where nothing
    says.

    Args:
        container (`av.container.InputContainer`): the open file.
        stream (`av.VideoStream`): its video stream.
    """
    if stream.duration:
        return float(stream.duration * stream.time_base)
    tag = re.fullmatch(r"(\d+):(\d+):(\d+(?:\.\d+)?)", str(stream.metadata.get("DURATION", "")).strip())
    if tag:
        hours, minutes, seconds = tag.groups()
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    if len(container.streams) == 1 and container.duration:
        import av

        return container.duration / av.time_base
    return None


def end_seconds(stream: Any, last_pts: int | None, fps: float) -> float | None:
    """Where a video stream's frames end, in seconds from its start: its largest timestamp `last_pts` (in the stream's
    time base) plus one frame interval; `None` when no frame has a timestamp.

    Args:
        stream (`av.VideoStream`): the stream.
        last_pts (`int | None`): the largest timestamp of its packets or frames.
        fps (`float`): its frame rate.
    """
    if last_pts is None:
        return None
    return float((last_pts - (stream.start_time or 0)) * stream.time_base) + 1 / fps


def cut_short(
    declared_frames: int, declared: float | None, frames: int, end: float | None, fps: float
) -> str | None:
    """Why a video file is cut short, with the counts, or `None`: fewer frames can be read than its header declares,
    or (without a declared count) its frames end well before the duration its header declares.

    Args:
        declared_frames (`int`): the frame count the header declares; 0 where the container keeps none.
        declared (`float | None`): the duration the header declares, in seconds (`declared_seconds`).
        frames (`int`): the frames that can be read.
        end (`float | None`): where the last of them ends, in seconds from the stream's start; `None` if unknown.
        fps (`float`): the stream's frame rate.
    """
    advice = "replace it with a whole copy"
    if declared_frames:
        if frames >= declared_frames:
            return None
        return (
            f"the file is cut short: its header declares {declared_frames} frames ({declared_frames / fps:.1f} s) "
            f"but only {frames} can be read ({frames / fps:.1f} s); {advice}"
        )
    if declared is None or end is None or declared - end <= max(CUT_SHORT_SECONDS, 2 / fps):
        return None
    return (
        f"the file is cut short: its header declares {declared:.1f} s but its {frames} frames end at {end:.1f} s; "
        f"{advice}"
    )


def check_video(ref: VideoRef) -> str | None:
    """Check that a video can be read: its file opens with PyAV, its first frame decodes, and its packets hold as many
    frames as its header declares and at least `MIN_VIDEO_FRAMES`; or each of its (at least `MIN_VIDEO_FRAMES`)
    frame files is an image.

    The file's packets are read to its end but not decoded (decoding happens when a row is encoded), so that checking
    costs about one read of the file.

    Args:
        ref (`VideoRef`): The video.

    Returns:
        `str | None`: `None` when the video is fine, else a short reason such as `"file not found"`.
    """
    if ref.path is None:
        for k, frame in enumerate(ref.frames):
            reason = check_image(ImageRef(path=frame))
            if reason is not None:
                return f"frame {k} ({frame}): {reason}"
        return too_few_frames(len(ref.frames), "the list")
    if not os.path.isfile(ref.path):
        return "file not found"
    import av

    try:
        with av.open(ref.path) as container:
            if not container.streams.video:
                return "the file has no video stream"
            stream = container.streams.video[0]
            first, frames, last = None, 0, None
            for packet in container.demux(stream):
                if first is None:  # decode until the first frame comes out
                    first = next(iter(packet.decode()), None)
                if packet.size:
                    frames += 1
                    stamp = packet.pts if packet.pts is not None else packet.dts
                    if stamp is not None:
                        last = stamp if last is None else max(last, stamp)
            if first is None:
                return "the video has no frames"
            fps = frame_rate(stream)
            end = end_seconds(stream, last, fps)
            reason = cut_short(stream.frames, declared_seconds(container, stream), frames, end, fps)
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        return f"unreadable video file ({type(exc).__name__}: {' '.join(str(exc).split())})"
    return reason or too_few_frames(frames)
