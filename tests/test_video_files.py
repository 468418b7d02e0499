"""Video files as users have them: containers without a frame count (MKV, WebM, MPEG-TS), files cut short after their
header, one-frame videos, files removed after loading, and each family's video pixel bounds.

Every clip is a real file written here with PyAV; each family's processor is the tiny model's real one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from test_video import (
    FPS,
    VIDEO_FAMILIES,
    clip,
    decode_all,
    video_message,
    video_pixels,
    write_frames,
    write_video,
)

from vlm_grpo.data import load_data_config
from vlm_grpo.data.errors import DataConfigError
from vlm_grpo.data.video_frames import count_frames, decode_video, preview_frames
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family

CONTAINERS = {
    "mkv-mpeg4": ("clip.mkv", "mpeg4"),
    "mkv-mjpeg": ("clip.mkv", "mjpeg"),
    "webm-vp8": ("clip.webm", "libvpx"),
    "webm-vp9": ("clip.webm", "libvpx-vp9"),
    "mpegts-mpeg2video": ("clip.ts", "mpeg2video"),
}
"""Containers that declare no frame count, each with a codec it takes that PyAV's FFmpeg encodes."""
ENCODING_FAMILIES = VIDEO_FAMILIES
"""Every family that reads video here (their samplers: Qwen's with frame timing, GLM's by duration, InternVL's and
Gemma 4's frames as images)."""


def write_clip(path: Path, frames: np.ndarray, codec: str = "mpeg4", fps: int = FPS, **options: str) -> Path:
    """Encode `frames` `[T, H, W, 3]` into the container `path`'s suffix names, with `codec`."""
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def noise(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """`[n, size, size, 3]` random frames: each frame is a sizeable part of its file, so cutting the file cuts frames."""
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def cut(path: Path, fraction: float) -> Path:
    """Keep the first `fraction` of the file's bytes, as an interrupted copy or download leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


def load_records(tmp_path: Path, records: list[dict]) -> object:
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "data.yaml").write_text("datasets:\n  - json_path: train.jsonl\n")
    return load_data_config(tmp_path / "data.yaml")


def refused(tmp_path: Path, video: object) -> str:
    """The loader's one-line refusal of a second record holding `video` (the first is a good clip)."""
    write_video(tmp_path / "ok.mp4", clip("up"))
    records = [
        {"video": "ok.mp4", "problem": "Where?", "solution": "up"},
        {"video": video, "problem": "Where?", "solution": "up"},
    ]
    with pytest.raises(DataConfigError) as error:
        load_records(tmp_path, records)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{tmp_path / 'train.jsonl'}: record 2 (line 2)"), text
    return text


def configured(tiny_model, family: str, **video: object):
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, fps=2.0, **video)
    return model_family, processor


# -------------------------------------------------------------------------------------------- files cut short
def test_an_mp4_cut_short_after_its_header_is_refused_with_the_counts(tiny_model, tmp_path):
    """The header (written first, `faststart`) declares 200 frames; the bytes hold fewer. The loader refuses the record
    naming the file and both counts, and a dataset built in Python fails when the row is encoded, naming the file."""
    file = cut(write_clip(tmp_path / "cut.mp4", noise(200), fps=10, movflags="faststart"), 0.3)
    with av.open(str(file)) as container:
        assert container.streams.video[0].frames == 200
        readable = sum(1 for _ in container.decode(video=0))
    assert 10 < readable < 200

    text = refused(tmp_path, "cut.mp4")
    assert f"field 'video': video 0 ({file}): the file is cut short" in text
    assert f"its header declares 200 frames (20.0 s) but only {readable} can be read" in text

    model_family, processor = configured(tiny_model, VIDEO_FAMILIES[0])
    with pytest.raises(
        VLMGRPOError
    ) as error:  # the processor samples 2 frames a second, up to the 20th second
        model_family.encode_prompt(processor, video_message(), [], None, [str(file)])
    assert "\n" not in str(error.value) and str(file) in str(error.value)
    assert f"only {readable} of its 200 frames decode" in str(error.value)


def test_an_mkv_cut_short_is_refused_by_the_duration_its_header_declares(tmp_path):
    """MKV declares no frame count but its duration (20 s): frames that end at 6 s are refused, at load and when a row
    is encoded."""
    file = cut(write_clip(tmp_path / "cut.mkv", noise(200), fps=10), 0.3)
    readable = decode_all(file)[0].shape[0]
    assert 10 < readable < 150
    text = refused(tmp_path, "cut.mkv")
    assert (
        f"video 0 ({file}): the file is cut short: its header declares 20.0 s but its {readable} frames end at"
        in text
    )
    with pytest.raises(ValueError, match=f"declares 20.0 s but its {readable} frames end at"):
        count_frames(str(file))


def test_a_whole_file_is_not_taken_for_a_cut_one(tmp_path):
    for name in ("whole.mp4", "whole.mkv", "whole.webm", "whole.ts"):
        codec = {"webm": "libvpx", "ts": "mpeg2video"}.get(name.rsplit(".", 1)[1], "mpeg4")
        write_clip(
            tmp_path / name, noise(40), codec, fps=10, **({"movflags": "faststart"} if "mp4" in name else {})
        )
    data = load_records(
        tmp_path, [{"video": n, "problem": "?", "solution": "x"} for n in ("whole.mp4", "whole.mkv")]
    )
    assert len(data) == 2
    assert [
        count_frames(str(tmp_path / n)) for n in ("whole.mp4", "whole.mkv", "whole.webm", "whole.ts")
    ] == [40] * 4


# ------------------------------------------------------------------------------ containers without a frame count
@pytest.mark.parametrize("container", list(CONTAINERS))
def test_a_container_without_a_frame_count_is_read_whole(container, tmp_path):
    """The stream declares 0 frames; the loader takes the file, its frames are counted by decoding, and a preview spans
    the whole clip (its first and last frame)."""
    name, codec = CONTAINERS[container]
    file = write_clip(tmp_path / name, clip("right", n=18), codec)
    with av.open(str(file)) as opened:
        assert opened.streams.video[0].frames == 0
    frames, _ = decode_all(file)
    assert count_frames(str(file)) == len(frames) == 18
    data = load_records(tmp_path, [{"video": name, "problem": "<video> Where?", "solution": "right"}])
    assert data[0]["videos"] == [{"path": str(file), "frames": []}]
    shown = preview_frames(str(file))
    assert all(np.array_equal(s, frames[i]) for s, i in zip(shown, (0, 6, 11, 17), strict=True))


@pytest.mark.parametrize("family", ENCODING_FAMILIES)
@pytest.mark.parametrize("container", list(CONTAINERS))
def test_a_container_without_a_frame_count_encodes_as_the_processor_samples_a_full_decode(
    container, family, tiny_model, tmp_path
):
    """The prompt's ids and video tensors equal the processor's own sampling (`do_sample_frames`) of every frame of the
    file, decoded by PyAV directly, at the file's rate."""
    assert family in VIDEO_FAMILIES
    name, codec = CONTAINERS[container]
    file = write_clip(tmp_path / name, clip("down", n=20), codec)
    model_family, processor = configured(tiny_model, family)
    frames, metadata = decode_all(file)
    text = processor.apply_chat_template(video_message(), add_generation_prompt=True, tokenize=False)
    expected = processor(
        text=[text],
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=True,
        fps=2.0,
        return_tensors="pt",
    )
    encoded = model_family.encode_prompt(processor, video_message(), [], None, [str(file)])
    assert encoded.input_ids == expected["input_ids"][0].tolist()
    assert torch.equal(video_pixels(encoded.image_inputs), video_pixels(expected))


@pytest.mark.parametrize("family", ENCODING_FAMILIES)
def test_an_mkv_encodes_as_the_same_frames_in_an_mp4(family, tiny_model, tmp_path):
    """The same MPEG-4 frames in MKV (no frame count) and in MP4 (a counted one): the same prompt, the same tensors."""
    frames = clip("left", n=20)
    mkv, mp4 = write_clip(tmp_path / "clip.mkv", frames), write_clip(tmp_path / "clip.mp4", frames)
    assert np.array_equal(decode_all(mkv)[0], decode_all(mp4)[0])
    model_family, processor = configured(tiny_model, family)
    from_mkv, from_mp4 = (
        model_family.encode_prompt(processor, video_message(), [], None, [str(file)]) for file in (mkv, mp4)
    )
    assert from_mkv.input_ids == from_mp4.input_ids
    assert from_mkv.image_inputs.keys() == from_mp4.image_inputs.keys()
    for key, value in from_mp4.image_inputs.items():
        assert torch.equal(from_mkv.image_inputs[key], value), key


# ------------------------------------------------------------------------------------ one frame, short clips, gone
@pytest.mark.parametrize("kind", ["mp4", "mkv", "frame list"])
def test_a_one_frame_video_is_refused_at_load(kind, tmp_path):
    if kind == "frame list":
        video = write_frames(tmp_path / "f", clip("up", n=1))
        where = re.escape(f"video 0 ({tmp_path / video[0]} (+0 frames)): the list has 1 frame")
    else:
        video = write_clip(tmp_path / f"one.{kind}", clip("up", n=1)).name
        where = re.escape(f"video 0 ({tmp_path / video}): the video has 1 frame")
    text = refused(tmp_path, video)
    assert re.search(
        f"field 'video': {where}, and a video needs at least 2 .*give a single frame as an image", text
    )


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_one_frame_at_encoding_is_one_line_and_short_clips_are_sampled(family, tiny_model, tmp_path):
    """A dataset built in Python: a one-frame file or list is one line naming it, in every family. A clip of a few
    frames, shorter than one sampling interval, gives the family frames it reads (InternVL's processor would divide by
    zero; GLM's repeats its one sampled frame into a pair)."""
    model_family, processor = configured(tiny_model, family)
    one = write_video(tmp_path / "one.mp4", clip("up", n=1))
    listed = [str(tmp_path / name) for name in write_frames(tmp_path / "f", clip("up", n=1))]
    for video, what in ((str(one), "the video"), (listed, "the list")):
        with pytest.raises(VLMGRPOError) as error:
            model_family.encode_prompt(processor, video_message(), [], None, [video])
        message = str(error.value)
        assert "\n" not in message and f"{what} has 1 frame, and a video needs at least 2" in message
        assert (str(one) if video == str(one) else listed[0]) in message

    short = write_video(tmp_path / "short.mp4", clip("up", n=3), fps=30)  # 0.1 s at video_fps 2
    decoded = decode_video(str(short), processor.video_processor, 2.0, model_family.video_sampler(processor))
    frames, _ = decode_all(short)
    indices = [int(i) for i in decoded.metadata.frames_indices]
    assert indices and all(np.array_equal(f, frames[i]) for f, i in zip(decoded.frames, indices, strict=True))
    encoded = model_family.encode_prompt(processor, video_message(), [], None, [str(short)])
    assert encoded.num_videos == 1 and video_pixels(encoded.image_inputs).numel() > 0


def test_video_max_frames_below_two_is_refused(tiny_model):
    with pytest.raises(
        VLMGRPOError, match="video_max_frames is 1, and a video needs at least 2 frames"
    ) as error:
        configured(tiny_model, VIDEO_FAMILIES[0], max_frames=1)
    assert "\n" not in str(error.value)


def test_a_video_file_removed_after_loading_is_one_line(tiny_model, tmp_path):
    file = write_video(tmp_path / "clip.mp4", clip("right"))
    data = load_records(tmp_path, [{"video": "clip.mp4", "problem": "<video> Where?", "solution": "right"}])
    model_family, processor = configured(tiny_model, VIDEO_FAMILIES[0])
    row = data[0]
    assert model_family.encode_prompt(processor, row["prompt"], [], None, row["videos"]).num_videos == 1
    file.unlink()
    with pytest.raises(VLMGRPOError) as error:
        model_family.encode_prompt(processor, row["prompt"], [], None, row["videos"])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"Video file '{file}' of a training row is gone")
    assert "found it readable" in message and "restore it" in message


# ------------------------------------------------------------------------------------------------ pixel bounds
VIDEO_PIXEL_BOUNDS = {
    "qwen2_vl": "each frame",
    "qwen2_5_vl": "each frame",
    "qwen3_vl": "all frames",
    "qwen3_vl_moe": "all frames",
    "qwen3_5": "all frames",
    "qwen3_5_moe": "all frames",
    "glm4v": "all frames",
    "glm46v": "all frames",
    "glm4v_moe": "all frames",
    "internvl": None,
    "internvl_moe": None,
    "gemma4": None,
}
"""What `video_min_pixels` / `video_max_pixels` bound in each family (docs/families.md): each sampled frame's pixels,
all sampled frames' pixels together, or nothing (the options are refused)."""


def resized(encoded, video_processor) -> tuple[int, int]:
    """`(frames, pixels per frame)` of the one video of a prompt, from its grid: Qwen's `video_grid_thw`, or GLM's
    temporal patches stored as image rows."""
    inputs = encoded.image_inputs
    grid = inputs["video_grid_thw"] if "video_grid_thw" in inputs else inputs["image_grid_thw"]  # [N, 3]
    patch = video_processor.patch_size
    frames = int(grid[:, 0].sum()) * video_processor.temporal_patch_size
    return frames, int(grid[0, 1] * grid[0, 2]) * patch * patch


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_video_pixel_bounds_mean_what_the_docs_say_per_family(family, tiny_model, tmp_path):
    """Eight frames, bounded by `video_max_pixels` (frames of 224x224), then by `video_min_pixels` (frames of 28x28):
    each frame within the bound, or all frames together within it, as the family's table says; refused in one line
    where the family has no bound."""
    assert set(VIDEO_PIXEL_BOUNDS) >= set(VIDEO_FAMILIES), "pin the new family's meaning here and in the docs"
    scope = VIDEO_PIXEL_BOUNDS[family]
    if scope is None:
        with pytest.raises(VLMGRPOError, match="has no video pixel bounds; remove video_min_pixels") as error:
            configured(tiny_model, family, max_pixels=8 * 56 * 56)
        assert "\n" not in str(error.value)
        return

    def encode(size: int, **bounds: int) -> tuple[int, int]:
        model_family, processor = configured(tiny_model, family, **bounds)
        names = write_frames(tmp_path / f"{size}_{sorted(bounds)}", np.full((8, size, size, 3), 90, np.uint8))
        listed = [str(tmp_path / name) for name in names]
        encoded = model_family.encode_prompt(processor, video_message(), [], None, [listed])
        return resized(encoded, processor.video_processor)

    bound = 8 * 56 * 56
    frames, per_frame = encode(224, max_pixels=bound)
    assert frames == 8
    if scope == "each frame":
        assert per_frame <= bound < frames * per_frame
    else:
        assert frames * per_frame <= bound
    floor = 8 * 56 * 56
    frames, per_frame = encode(28, min_pixels=floor, max_pixels=64 * floor)
    if scope == "each frame":
        assert per_frame >= floor
    else:
        assert frames * per_frame >= floor > per_frame
