"""Decoding a row's videos into the frames a processor takes, with the processor's own frame sampling.

A stored video (the dataset's `videos` column, see `vlm_grpo.data.videos`) is a file or a list of frame files. A
file is decoded with PyAV by transformers' `load_video`, which reads only the frames that the family's video
processor picks (`sample_frames`: its `fps`, `min_frames` and `max_frames`), and returns them with their metadata
(source fps, frame indices), which Qwen2.5-VL's frame timing and Qwen3-VL's timestamps are computed from. This is
the path a processor takes for a video file (`fetch_videos`), with PyAV as the decoder: the decoders transformers
and qwen-vl-utils pick first (torchcodec, decord, torchvision's removed `read_video`) need system libraries or
versions a training environment often lacks, and PyAV ships its own FFmpeg. A list of frame files is taken as
already sampled, at `fps` frames per second (as qwen-vl-utils takes one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from transformers.video_utils import VideoMetadata, load_video

from ..errors import VLMGRPOError
from .images import load_image


@dataclass
class DecodedVideo:
    """One video's sampled frames.

    Attributes:
        frames (`np.ndarray`): `[T, H, W, 3]` uint8 RGB frames.
        metadata (`VideoMetadata`): source fps, total frames and the sampled frames' indices.
        name (`str`): the file (or first frame file) it came from, for messages.
    """

    frames: np.ndarray
    metadata: VideoMetadata
    name: str


def stored_video(video: str | Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A video as the dataset's `videos` column stores it, `{"path": str | None, "frames": list[str]}`, from that
    mapping, a video file's path, or a list of frame files' paths (as a dataset built in Python may hold it)."""
    if isinstance(video, str):
        return {"path": video, "frames": []}
    if isinstance(video, Mapping):
        return {"path": video.get("path"), "frames": list(video.get("frames") or [])}
    return {"path": None, "frames": list(video)}


def preview_frames(video: str | Sequence[str] | Mapping[str, Any], count: int = 4) -> list[np.ndarray]:
    """Up to `count` frames `[H, W, 3]` spread evenly over a video (its first and last included), for a person to
    look at: a file's frames decoded with PyAV up to the last one shown, or a list's frame files.

    Args:
        video (`str | Sequence[str] | Mapping`): the video, as `stored_video` takes it.
        count (`int`, *optional*, defaults to 4): most frames returned.

    Raises:
        `OSError` or `ValueError`: the file is missing or unreadable (`av.error.FFmpegError` is an `OSError`).
    """
    import av

    video = stored_video(video)
    if not video["path"]:
        files = video["frames"]
        picked = (
            sorted({round(i * (len(files) - 1) / max(count - 1, 1)) for i in range(count)}) if files else []
        )
        return [np.asarray(load_image(files[i])) for i in picked]
    with av.open(video["path"]) as container:
        total = container.streams.video[0].frames  # 0 where the file does not say
        wanted = (
            {round(i * (total - 1) / max(count - 1, 1)) for i in range(count)} if total else set(range(count))
        )
        frames = []
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted:
                frames.append(frame.to_ndarray(format="rgb24"))
            if index >= max(wanted):
                break
    if not frames:
        raise ValueError("no frame could be decoded")
    return frames


def video_name(video: str | Sequence[str] | Mapping[str, Any]) -> str:
    """The file a video names: its path, or its first frame's path."""
    video = stored_video(video)
    return video["path"] or (video["frames"] or [""])[0]


def decode_video(
    video: str | Sequence[str] | Mapping[str, Any], video_processor: Any, fps: float
) -> DecodedVideo:
    """Decode one video into the frames its family's video processor would sample.

    Args:
        video (`str | Sequence[str] | Mapping`): `{"path": str | None, "frames": list[str]}`, as the dataset's
            `videos` column holds it, or a video file's path, or a list of frame files' paths.
        video_processor (`BaseVideoProcessor`): the family's video processor; its `sample_frames` picks the frames
            of a file (with its `fps`, `min_frames` and `max_frames`).
        fps (`float`): frames per second sampled from a file (passed to `sample_frames`, as not every family's
            defaults to its processor's), and the rate of a list of frame files.

    Raises:
        `VLMGRPOError`: the video cannot be decoded; the message names the file.
    """
    video = stored_video(video)
    name = video_name(video)
    try:
        if video["path"]:
            frames, metadata = load_video(
                video["path"],
                backend="pyav",
                sample_indices_fn=partial(video_processor.sample_frames, fps=fps),
            )
            return DecodedVideo(np.asarray(frames), metadata, name)
        images = [np.asarray(load_image(frame)) for frame in video["frames"]]
    except (OSError, ValueError) as error:
        raise VLMGRPOError(f"Cannot decode video {name!r} of a training row: {error}") from error
    if not images:
        raise VLMGRPOError("A training row holds a video with neither a file nor frames; give one of them.")
    if len({image.shape for image in images}) > 1:
        raise VLMGRPOError(
            f"The frames of video {name!r} differ in size ({sorted({image.shape[:2] for image in images})}); give "
            "frames of one size."
        )
    frames = np.stack(images)  # [T, H, W, 3]
    metadata = VideoMetadata(
        total_num_frames=len(frames),
        fps=fps,
        width=frames.shape[2],
        height=frames.shape[1],
        duration=len(frames) / fps,
        video_backend="frames",
        frames_indices=list(range(len(frames))),
    )
    return DecodedVideo(frames, metadata, name)


def processor_video_kwargs(videos: Sequence[DecodedVideo]) -> dict[str, Any]:
    """The processor arguments of decoded videos: the frames, their metadata, no second sampling, and the sampled
    frame rate (which Qwen2.5-VL's processor turns into each temporal patch's duration).

    Args:
        videos (`Sequence[DecodedVideo]`): the prompt's videos, in placeholder order (not empty).
    """
    rates = {round(video.metadata.sampled_fps, 6) for video in videos}
    return {
        "videos": [video.frames for video in videos],
        "video_metadata": [video.metadata for video in videos],
        "do_sample_frames": False,
        "fps": next(iter(rates)) if len(rates) == 1 else [video.metadata.sampled_fps for video in videos],
    }
