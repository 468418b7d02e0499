"""Decoding a row's videos into the frames a processor takes, with the processor's own frame sampling.

A stored video (the dataset's `videos` column, see `vlm_grpo.data.videos`) is a file or a list of frame files. A
file is decoded with PyAV, which reads only the frames that the family's video processor picks (`sample_frames`: its
`fps`, `min_frames` and `max_frames`), and returned with its metadata (source fps, frame indices), which Qwen2.5-VL's
frame timing and Qwen3-VL's timestamps are computed from. This is what transformers' `load_video` does for a video
file (`fetch_videos`), with PyAV as the decoder (the decoders transformers and qwen-vl-utils pick first, torchcodec,
decord and torchvision's removed `read_video`, need system libraries or versions a training environment often lacks,
and PyAV ships its own FFmpeg), except that:

- a file whose container declares no frame count (MKV, WebM, MPEG-TS) has its frames counted by decoding it once
  (`count_frames`, remembered per file), where `load_video` would take it for a video of 0 frames;
- a frame the sampler picks twice (GLM repeats the last to make pairs) is returned twice;
- a file that decodes fewer frames than the sampled ones need, a file that is gone, and a video of fewer than
  `MIN_VIDEO_FRAMES` frames are errors naming the file, not a shorter or failed video.

A list of frame files is taken as already sampled, at `fps` frames per second (as qwen-vl-utils takes one).

`decode_video_qwen_vl_utils` decodes a video as the Qwen model cards' pipeline does instead
(`qwen_vl_utils.process_vision_info`, the optional `video` extra): qwen-vl-utils' own `fetch_video` picks the frames
and sizes them, and PyAV decodes the frames it picks from a file.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.video_utils import VideoMetadata

from ..errors import VLMGRPOError
from .images import load_image
from .videos import cut_short, declared_seconds, end_seconds, frame_rate, too_few_frames


@dataclass
class DecodedVideo:
    """One video's sampled frames.

    Attributes:
        frames (`np.ndarray | torch.Tensor`): `[T, H, W, 3]` uint8 RGB frames, or, decoded by qwen-vl-utils, its
            `[T, 3, H, W]` float32 frames (RGB values 0-255), already resized.
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
        `OSError` or `ValueError`: the file is missing, unreadable or cut short (`av.error.FFmpegError` is an
            `OSError`).
    """
    import av

    video = stored_video(video)
    if not video["path"]:
        files = video["frames"]
        picked = (
            sorted({round(i * (len(files) - 1) / max(count - 1, 1)) for i in range(count)}) if files else []
        )
        return [np.asarray(load_image(files[i])) for i in picked]
    total = count_frames(video["path"])
    wanted = {round(i * (total - 1) / max(count - 1, 1)) for i in range(count)}
    with av.open(video["path"]) as container:
        frames = []
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted:
                frames.append(frame.to_ndarray(format="rgb24"))
            if index >= max(wanted):
                break
    if not frames:
        raise ValueError("no frame could be decoded")
    return frames


def count_frames(path: str) -> int:
    """The frames of a video file: the count its header declares, or, where its container declares none (MKV, WebM,
    MPEG-TS), the frames a full decode gives (remembered per file, size and modification time).

    Args:
        path (`str`): the video file.

    Raises:
        `OSError` or `ValueError`: the file is missing, unreadable, has no video stream, or is cut short before the
            duration its header declares (`vlm_grpo.data.videos.cut_short`).
    """
    import av

    with av.open(path) as container:
        declared = _video_stream(container).frames
    if declared:
        return declared
    stat = os.stat(path)
    return _decoded_count(path, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=4096)
def _decoded_count(path: str, size: int, mtime_ns: int) -> int:
    """Frames a full decode of `path` gives, checked against the duration its header declares (the file's size and
    modification time key the cache)."""
    import av

    with av.open(path) as container:
        stream = _video_stream(container)
        fps = frame_rate(stream)
        frames, last = 0, None
        for frame in container.decode(stream):
            frames += 1
            if frame.pts is not None:
                last = frame.pts if last is None else max(last, frame.pts)
        reason = cut_short(
            0, declared_seconds(container, stream), frames, end_seconds(stream, last, fps), fps
        )
    if reason is not None:
        raise ValueError(reason)
    return frames


def _video_stream(container: Any) -> Any:
    """The first video stream of an open PyAV container.

    Raises:
        `ValueError`: the file has none.
    """
    if not container.streams.video:
        raise ValueError("the file has no video stream")
    return container.streams.video[0]


def read_video_file(path: str, sample_indices_fn: Callable[..., Any]) -> tuple[np.ndarray, VideoMetadata]:
    """Decode the frames of a video file that `sample_indices_fn` picks from its metadata, as transformers'
    `load_video` with PyAV does, from every frame the file holds (`count_frames`).

    Args:
        path (`str`): the video file.
        sample_indices_fn (`Callable`): `fn(metadata=VideoMetadata) -> indices`, e.g. a video processor's
            `sample_frames`.

    Returns:
        `tuple[np.ndarray, VideoMetadata]`: the picked frames `[T, H, W, 3]` uint8 RGB, in the order picked (a frame
        picked twice comes twice), and the metadata with their indices (`frames_indices`).

    Raises:
        `OSError` or `ValueError`: the file is unreadable, holds too few frames, or decodes fewer frames than its header
            declares.
    """
    import av

    with av.open(path) as container:
        stream = _video_stream(container)
        fps, width, height = frame_rate(stream), stream.width, stream.height
    total = count_frames(path)
    reason = too_few_frames(total)
    if reason is not None:
        raise ValueError(reason)
    metadata = VideoMetadata(
        total_num_frames=total,
        fps=fps,
        width=width,
        height=height,
        duration=total / fps,
        video_backend="pyav",
    )
    indices = sample_indices_fn(metadata=metadata)
    picks = [int(i) for i in indices]
    wanted, last = set(picks), max(picks)
    decoded: dict[int, np.ndarray] = {}
    with av.open(path) as container:
        index = -1
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted:
                decoded[index] = frame.to_ndarray(format="rgb24")
            if index >= last:
                break
    if last not in decoded:
        raise ValueError(
            f"only {index + 1} of its {total} frames decode (frame {last} is sampled): the file is cut short or "
            "damaged; replace it with a whole copy"
        )
    metadata.frames_indices = indices
    return np.stack([decoded[i] for i in picks]), metadata


def video_name(video: str | Sequence[str] | Mapping[str, Any]) -> str:
    """The file a video names: its path, or its first frame's path."""
    video = stored_video(video)
    return video["path"] or (video["frames"] or [""])[0]


def decode_video(
    video: str | Sequence[str] | Mapping[str, Any],
    video_processor: Any,
    fps: float,
    sample_indices_fn: Callable[..., Any] | None = None,
) -> DecodedVideo:
    """Decode one video into the frames its family's video processor would sample.

    Args:
        video (`str | Sequence[str] | Mapping`): `{"path": str | None, "frames": list[str]}`, as the dataset's
            `videos` column holds it, or a video file's path, or a list of frame files' paths.
        video_processor (`BaseVideoProcessor`): the family's video processor; its `sample_frames` picks the frames
            of a file (with its `fps`, `min_frames` and `max_frames`).
        fps (`float`): frames per second sampled from a file (passed to `sample_frames`, as not every family's
            defaults to its processor's), and the rate of a list of frame files.
        sample_indices_fn (`Callable | None`, *optional*, defaults to `None`): `fn(metadata=VideoMetadata) -> indices`,
            the frames picked from a file in place of `video_processor.sample_frames` at `fps` (a family's own rule,
            `ModelFamily.video_sampler`).

    Raises:
        `VLMGRPOError`: the video cannot be decoded, is gone, is cut short or has fewer than `MIN_VIDEO_FRAMES`
            frames; the message names the file.
    """
    video = stored_video(video)
    name = video_name(video)
    _check_present(video)
    try:
        if video["path"]:
            frames, metadata = read_video_file(
                video["path"], sample_indices_fn or partial(video_processor.sample_frames, fps=fps)
            )
            return DecodedVideo(frames, metadata, name)
        images = [np.asarray(load_image(frame)) for frame in video["frames"]]
    except (OSError, ValueError) as error:
        raise VLMGRPOError(f"Cannot decode video {name!r} of a training row: {error}") from error
    if not images:
        raise VLMGRPOError("A training row holds a video with neither a file nor frames; give one of them.")
    reason = too_few_frames(len(images), "the list")
    if reason is not None:
        raise VLMGRPOError(f"Cannot use video {name!r} of a training row: {reason}.")
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


def _check_present(video: Mapping[str, Any]) -> None:
    """Refuse a stored video whose file or frame files are gone since the data loader read them (frames given as
    images in memory, as a dataset built in Python may hold them, have no file to check).

    Raises:
        `VLMGRPOError`: a file is gone; the message names it.
    """
    files = [file for file in (video["path"], *video["frames"]) if isinstance(file, str) and file]
    gone = [file for file in files if not os.path.isfile(file)]
    if gone:
        raise VLMGRPOError(
            f"Video file {gone[0]!r} of a training row is gone: the data loader found it readable, and nothing is "
            "there now (moved or deleted since); restore it, or remove its records from the data and restart."
        )


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


# ------------------------------------------------------------------------------------------------- qwen-vl-utils
def qwen_vl_utils() -> types.ModuleType:
    """qwen-vl-utils' `vision_process` module (the optional `video` extra), imported on first use.

    Raises:
        `VLMGRPOError`: qwen-vl-utils is not installed.
    """
    try:
        from qwen_vl_utils import vision_process
    except ImportError as error:
        raise VLMGRPOError(
            "video_sampler: qwen_vl_utils needs the qwen-vl-utils package, which is not installed: install the "
            "video extra (pip install 'vlm-grpo[video]'), or set video_sampler: processor."
        ) from error
    return vision_process


def qwen_vl_utils_element(
    video: str | Sequence[str] | Mapping[str, Any],
    fps: float,
    max_frames: int | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> dict[str, Any]:
    """A video as a message content entry that `qwen_vl_utils.process_vision_info` reads, as the Qwen model cards
    write one: a file with `fps` (and `max_frames`), a list of frame files with `sample_fps` (qwen-vl-utils keeps
    every frame of a list, and takes it at that rate), and the per-frame `min_pixels` / `max_pixels` for both; an
    option left None is left out, so that qwen-vl-utils' own default applies.

    Args:
        video (`str | Sequence[str] | Mapping`): the video, as `stored_video` takes it.
        fps (`float`): frames per second sampled from a file, and the rate of a list of frame files.
        max_frames (`int | None`, *optional*, defaults to `None`): most frames sampled from a file.
        min_pixels (`int | None`, *optional*, defaults to `None`): lower bound on each frame's pixels after resizing.
        max_pixels (`int | None`, *optional*, defaults to `None`): upper bound on each frame's pixels after resizing.
    """
    video = stored_video(video)
    if video["path"]:
        element: dict[str, Any] = {"type": "video", "video": video["path"], "fps": fps}
        if max_frames is not None:
            element["max_frames"] = max_frames
    else:
        element = {"type": "video", "video": list(video["frames"]), "sample_fps": fps}
    for key, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if value is not None:
            element[key] = value
    return element


def decode_video_qwen_vl_utils(
    video: str | Sequence[str] | Mapping[str, Any],
    fps: float,
    max_frames: int | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    image_patch_size: int = 14,
) -> DecodedVideo:
    """Decode one video as `qwen_vl_utils.process_vision_info` does for the entry `qwen_vl_utils_element` writes: the
    same frames (how many, which ones) at the same size, with the same metadata, by qwen-vl-utils' own `fetch_video`.

    qwen-vl-utils reads a file with the reader its `FORCE_QWENVL_VIDEO_READER` environment variable names, else with
    torchcodec or decord if installed, else with torchvision's `read_video`, which the torchvision releases this
    package runs with no longer have. So, unless that variable names a reader, its `fetch_video` runs here with PyAV as
    its reader (`_read_for_qwen_vl_utils`: the frames its `smart_nframes` counts, spread as its decord and torchcodec
    readers spread them); it sizes them itself. A list of frame files needs no reader.

    Args:
        video (`str | Sequence[str] | Mapping`): the video, as `stored_video` takes it.
        fps (`float`): frames per second sampled from a file, and the rate of a list of frame files.
        max_frames (`int | None`, *optional*, defaults to `None`): most frames sampled from a file (qwen-vl-utils
            rounds it down to an even count; None: its 768).
        min_pixels (`int | None`, *optional*, defaults to `None`): lower bound on each frame's pixels (None: its
            128 tokens' worth).
        max_pixels (`int | None`, *optional*, defaults to `None`): upper bound on each frame's pixels, below its own
            (768 tokens' worth, and the video's share of its `total_pixels`).
        image_patch_size (`int`, *optional*, defaults to 14): the vision tower's patch size (14 for Qwen2-VL and
            Qwen2.5-VL, 16 for Qwen3-VL and Qwen3.5), as `process_vision_info` takes it.

    Raises:
        `VLMGRPOError`: qwen-vl-utils is not installed, or the video is gone, cannot be decoded, has fewer than
            `MIN_VIDEO_FRAMES` frames or frames of different sizes; the message names the file.
    """
    video = stored_video(video)
    name = video_name(video)
    _check_present(video)
    if not video["path"]:
        if not video["frames"]:
            raise VLMGRPOError(
                "A training row holds a video with neither a file nor frames; give one of them."
            )
        reason = too_few_frames(len(video["frames"]), "the list")
        if reason is not None:
            raise VLMGRPOError(f"Cannot use video {name!r} of a training row: {reason}.")
        sizes = set()
        for file in video["frames"]:
            with Image.open(file) as image:
                sizes.add(image.size)
        if len(sizes) > 1:
            raise VLMGRPOError(
                f"The frames of video {name!r} differ in size ({sorted(sizes)} as width x height); give frames of one "
                "size."
            )
    vision_process = qwen_vl_utils()
    element = qwen_vl_utils_element(video, fps, max_frames, min_pixels, max_pixels)
    fetch = vision_process.fetch_video
    if video["path"] and vision_process.FORCE_QWENVL_VIDEO_READER is None:
        fetch = _fetch_video_with_pyav(vision_process)
    try:
        (frames, metadata), _ = fetch(
            element,
            image_patch_size=image_patch_size,
            return_video_sample_fps=True,
            return_video_metadata=True,
        )
    except (OSError, ValueError) as error:
        raise VLMGRPOError(
            f"Cannot decode video {name!r} of a training row with qwen-vl-utils: {error}"
        ) from error
    return DecodedVideo(frames, VideoMetadata(**metadata), name)


def _fetch_video_with_pyav(vision_process: types.ModuleType) -> Callable[..., Any]:
    """qwen-vl-utils' `fetch_video` with PyAV as its reader of video files: the same function, run over its module's
    names except its readers, each of which (its fallback included) is `_read_for_qwen_vl_utils` here. Its module is
    left as it is.

    Args:
        vision_process (`ModuleType`): `qwen_vl_utils.vision_process`.
    """
    reader = partial(_read_for_qwen_vl_utils, vision_process)
    names = {
        **vars(vision_process),
        "VIDEO_READER_BACKENDS": {"pyav": reader, "torchvision": reader},
        "get_video_reader_backend": lambda: "pyav",
    }
    fetch = vision_process.fetch_video
    return types.FunctionType(fetch.__code__, names, fetch.__name__, fetch.__defaults__, fetch.__closure__)


def _read_for_qwen_vl_utils(
    vision_process: types.ModuleType, element: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, Any], float]:
    """Read a video file as qwen-vl-utils' readers read one (`_read_video_decord`, `_read_video_torchcodec`), with
    PyAV: from the frames in its `calculate_video_frame_range`, the number its `smart_nframes` gives, at indices spread
    evenly from the first to the last (rounded), decoded by `read_video_file`.

    Args:
        vision_process (`ModuleType`): `qwen_vl_utils.vision_process`.
        element (`dict`): the message content entry (`video`, `fps`, `max_frames`, ...).

    Returns:
        `tuple[torch.Tensor, dict, float]`: the frames `[T, 3, H, W]` uint8, their metadata (`fps`, `frames_indices`,
        `total_num_frames`, `video_backend`) and the sampled frame rate, as its readers return them.

    Raises:
        `OSError` or `ValueError`: the file is unreadable, holds too few frames, or decodes fewer frames than its header
            declares.
    """

    def frame_range(metadata: VideoMetadata) -> tuple[int, int, int]:
        return vision_process.calculate_video_frame_range(element, metadata.total_num_frames, metadata.fps)

    def sample(metadata: VideoMetadata) -> list[int]:
        start, end, count = frame_range(metadata)
        count = vision_process.smart_nframes(element, total_frames=count, video_fps=metadata.fps)
        return torch.linspace(start, end, count).round().long().tolist()

    frames, metadata = read_video_file(element["video"], sample)
    indices = list(metadata.frames_indices)
    total = frame_range(metadata)[2]
    info = {
        "fps": metadata.fps,
        "frames_indices": indices,
        "total_num_frames": total,
        "video_backend": "pyav",
    }
    return torch.from_numpy(frames).permute(0, 3, 1, 2), info, len(indices) / max(total, 1e-6) * metadata.fps


def qwen_vl_utils_processor_kwargs(videos: Sequence[DecodedVideo]) -> dict[str, Any]:
    """The processor arguments of videos decoded by qwen-vl-utils, as the Qwen3-VL model card passes them: the frames,
    their metadata, and no second sampling or resizing (in `videos_kwargs`, so that the prompt's images are still
    resized by the image processor).

    Args:
        videos (`Sequence[DecodedVideo]`): the prompt's videos from `decode_video_qwen_vl_utils`, in placeholder order
            (not empty).
    """
    return {
        "videos": [video.frames for video in videos],
        "video_metadata": [video.metadata for video in videos],
        "videos_kwargs": {"do_sample_frames": False, "do_resize": False},
    }
