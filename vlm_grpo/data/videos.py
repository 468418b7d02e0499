"""Video references in records: resolving them and checking them before training.

A record's video is a path string (a video file, absolute or relative to the entry's image root) or a list of path
strings (the video's frames, in order, already sampled). The `video` field holds one video; `videos` holds a list of
them. Checking opens each video file with PyAV and decodes its first frame (and checks each frame file as an image),
so that a missing, unreadable or empty video stops the loader with one line naming it; the frames a prompt uses are
decoded later, when its row is encoded (`vlm_grpo.data.video_frames`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .images import ImageRef, check_image


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


def check_video(ref: VideoRef) -> str | None:
    """Check that a video can be read: its file opens with PyAV and has a frame, or each frame file is an image.

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
        return None
    if not os.path.isfile(ref.path):
        return "file not found"
    import av

    try:
        with av.open(ref.path) as container:
            if not container.streams.video:
                return "the file has no video stream"
            if next(container.decode(video=0), None) is None:
                return "the video has no frames"
    except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
        return f"unreadable video file ({type(exc).__name__}: {' '.join(str(exc).split())})"
    return None
