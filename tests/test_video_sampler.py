"""`video_sampler`: a video's frames picked and sized by the family's video processor (`processor`, the default) or
by qwen-vl-utils as the Qwen model cards run it (`qwen_vl_utils`).

With `qwen_vl_utils`, the encoded prompt of every Qwen family must equal the model cards' pipeline on the same video:
`qwen_vl_utils.process_vision_info` on a message holding the video, then the processor on its frames and metadata,
neither sampling nor resizing them again. The clips are real MP4 files written with PyAV, or PNG frame files; the
processors are the tiny models' real ones.

qwen-vl-utils reads a video file with torchcodec or decord where one is installed, else with torchvision's
`read_video`, which the torchvision releases this package runs with no longer have. For the reference pipeline,
`read_video` is given back here as torchvision defined it (every frame of the file, `[T, C, H, W]` uint8, and its
`video_fps`), decoded with PyAV as torchvision decoded it; the trainer's own sampling runs no reader of qwen-vl-utils.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import grpo_args, length_reward, square_image
from datasets import Dataset
from test_video import decode_all, video_message, write_frames, write_video
from test_video_files import noise, write_clip
from transformers import AutoConfig

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family
from vlm_grpo.models.registry import FAMILY_CLASSES
from vlm_grpo.testing import TINY_FAMILIES

qwen_vl_utils = pytest.importorskip("qwen_vl_utils")


def offers_qwen_vl_utils(name: str) -> bool:
    """Whether the family module serving the tiny family `name` (its model type) takes `video_sampler: qwen_vl_utils`."""
    return any(
        "qwen_vl_utils" in cls(name).video_samplers() for cls in FAMILY_CLASSES if name in cls.model_types
    )


QWEN_VL_UTILS_FAMILIES = tuple(name for name in TINY_FAMILIES if offers_qwen_vl_utils(name))
OTHER_FAMILIES = tuple(name for name in TINY_FAMILIES if not offers_qwen_vl_utils(name))
OTHER_VIDEO_FAMILY = next(
    name for name in OTHER_FAMILIES for cls in FAMILY_CLASSES if name in cls.model_types and cls.reads_video
)
SOURCE_FPS = 10  # frames per second of the written clips
OPTIONS = {
    "defaults": {"fps": 2.0},
    "bounded": {"fps": 3.0, "max_frames": 7, "min_pixels": 2 * 32 * 32, "max_pixels": 6 * 32 * 32},
}
"""`VLMGRPOConfig` video options by case (`video_fps` as `fps`, `video_max_frames` as `max_frames`, ...): qwen-vl-utils'
own bounds, and a frame cap it rounds down to an even count with pixel bounds below them."""


def moving_bar(n: int, width: int = 320, height: int = 240) -> np.ndarray:
    """`[n, height, width, 3]` uint8 frames of a red bar moving right over a horizontal gradient."""
    frames = np.empty((n, height, width, 3), np.uint8)
    frames[...] = np.linspace(40, 200, width, dtype=np.uint8)[None, None, :, None]
    for t in range(n):
        x = (t * 3) % (width - 40)
        frames[t, :, x : x + 40] = (220, 30, 30)
    return frames


def read_video(filename, start_pts=0, end_pts=None, pts_unit="pts", output_format="THWC"):
    """torchvision's `read_video` (removed from torchvision), as qwen-vl-utils' torchvision reader calls it for a whole
    file: every frame, with PyAV (torchvision's own decoder), and the stream's average frame rate."""
    assert start_pts == 0 and end_pts is None, "the clips here are read whole"
    frames, metadata = decode_all(filename)
    video = torch.from_numpy(frames)  # [T, H, W, C]
    return (
        (video.permute(0, 3, 1, 2) if output_format == "TCHW" else video),
        torch.empty(0),
        {"video_fps": metadata.fps},
    )


@pytest.fixture
def model_card_pipeline(monkeypatch):
    """`pipeline(processor, text, messages, image_patch_size)`: the Qwen model cards' video pipeline on transformers 5
    (as the Qwen3-VL card writes it): `process_vision_info` with the frames' metadata, then the processor on the
    frames, without sampling or resizing them again."""
    import torchvision

    monkeypatch.setattr(torchvision.io, "read_video", read_video, raising=False)

    def pipeline(processor, text: str, messages: list[dict], image_patch_size: int):
        _, videos, video_kwargs = qwen_vl_utils.process_vision_info(
            messages, return_video_kwargs=True, return_video_metadata=True, image_patch_size=image_patch_size
        )
        frames, metadata = zip(*videos, strict=True)
        return processor(
            text=[text], videos=list(frames), video_metadata=list(metadata), do_resize=False, return_tensors="pt",
            **video_kwargs,
        )  # fmt: skip

    return pipeline


def configured(tiny_model, family: str, **video: object):
    """The family module, its processor with `configure_video(**video)`, and the model's config."""
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, **video)
    return model_family, processor, AutoConfig.from_pretrained(path)


def card_message(
    video: str | list[str], text: str = "Where does the square move?", **entry: object
) -> list[dict]:
    """`video_message()` as the model cards write it: the video's entry holds the video and its own options."""
    return [
        {
            "role": "user",
            "content": [{"type": "video", "video": video, **entry}, {"type": "text", "text": text}],
        }
    ]


def assert_same_inputs(encoded, expected, model_family) -> None:
    """The encoded prompt holds the pipeline's ids and every video tensor it gives, exactly."""
    assert encoded.input_ids == expected["input_ids"][0].tolist()
    keys = {key for key in model_family.video_input_keys if key in expected}
    assert keys and set(encoded.image_inputs) == keys
    for key in keys:
        assert torch.equal(encoded.image_inputs[key], torch.as_tensor(expected[key])), key


# ------------------------------------------------------------------------------------------------- the same input
@pytest.mark.parametrize("case", list(OPTIONS))
@pytest.mark.parametrize("family", QWEN_VL_UTILS_FAMILIES)
def test_a_video_file_is_encoded_as_the_model_cards_pipeline_encodes_it(
    family, case, tiny_model, tmp_path, model_card_pipeline
):
    """A 10 s 320x240 MP4: the trainer's family module with `video_sampler: qwen_vl_utils` gives the ids (the video's
    token count, Qwen3-VL's timestamps) and tensors (`pixel_values_videos`, `video_grid_thw`, Qwen2.5-VL's
    `second_per_grid_ts`) of the model cards' pipeline on a message whose video entry holds the options under
    qwen-vl-utils' names. With its own bounds, qwen-vl-utils samples 2 frames a second up to the last frame and sizes
    each to 140 tokens (1,400 for the clip); the video processor's own sampling gives another input."""
    options = OPTIONS[case]
    model_family, processor, config = configured(tiny_model, family, sampler="qwen_vl_utils", **options)
    file = str(write_video(tmp_path / "clip.mp4", moving_bar(100), fps=SOURCE_FPS))
    text = processor.apply_chat_template(video_message(), add_generation_prompt=True, tokenize=False)

    encoded = model_family.encode_prompt(processor, video_message(), [], None, [{"path": file, "frames": []}])
    expected = model_card_pipeline(
        processor, text, card_message(file, **options), config.vision_config.patch_size
    )
    assert_same_inputs(encoded, expected, model_family)
    pair = config.vision_config.temporal_patch_size
    sampled = int(expected["video_grid_thw"][0, 0]) * pair
    if "second_per_grid_ts" in expected:  # seconds per temporal patch, at the rate the frames were sampled at
        assert float(expected["second_per_grid_ts"][0]) == pytest.approx(pair / (sampled / 100 * SOURCE_FPS))
    video_tokens = encoded.input_ids.count(config.video_token_id)
    if case == "defaults":
        assert video_tokens == 1400
    else:  # 7 frames at most, rounded down to pairs: 3 temporal patches, each of at most 6 x 32 x 32 pixels
        assert sampled == 6 and 0 < video_tokens <= 3 * 6

    model_family.configure_video(processor, fps=options["fps"])
    assert (
        model_family.encode_prompt(processor, video_message(), [], None, [file]).input_ids
        != encoded.input_ids
    )


@pytest.mark.parametrize("family", QWEN_VL_UTILS_FAMILIES)
def test_a_list_of_frame_files_is_encoded_as_the_model_cards_pipeline_encodes_it(
    family, tiny_model, tmp_path, model_card_pipeline
):
    """Five PNG frames: qwen-vl-utils keeps every frame of a list (the last repeated to make pairs) and takes them at
    `sample_fps`, which `video_fps` sets; the pixel bounds apply as for a file."""
    options = {"min_pixels": 2 * 32 * 32, "max_pixels": 6 * 32 * 32}
    model_family, processor, config = configured(
        tiny_model, family, fps=1.5, sampler="qwen_vl_utils", **options
    )
    names = write_frames(tmp_path / "frames", moving_bar(5, width=96, height=64))
    listed = [str(tmp_path / name) for name in names]
    text = processor.apply_chat_template(video_message(), add_generation_prompt=True, tokenize=False)

    encoded = model_family.encode_prompt(
        processor, video_message(), [], None, [{"path": None, "frames": listed}]
    )
    messages = card_message(listed, sample_fps=1.5, **options)
    expected = model_card_pipeline(processor, text, messages, config.vision_config.patch_size)
    assert_same_inputs(encoded, expected, model_family)
    assert int(expected["video_grid_thw"][0, 0]) == 3  # 6 frames, in pairs
    assert (
        model_family.encode_prompt(processor, video_message(), [], None, [listed]).input_ids
        == encoded.input_ids
    )


def test_the_prompts_images_are_still_resized_by_the_image_processor(tiny_model, tmp_path):
    """A prompt holding an image and a video: the video's inputs are those of the video alone, and the image's those
    of the image alone, resized by the image processor (the frames' `do_resize=False` does not reach it)."""
    family = QWEN_VL_UTILS_FAMILIES[0]
    model_family, processor, _ = configured(tiny_model, family, fps=2.0, sampler="qwen_vl_utils")
    file = str(write_video(tmp_path / "clip.mp4", moving_bar(20, width=64, height=48), fps=SOURCE_FPS))
    image = square_image("red", size=100)  # resized to sides that are multiples of 28 or 32
    both = [
        {"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Same?"}]}
    ]
    just_image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Same?"}]}]

    encoded = model_family.encode_prompt(processor, both, [image], None, [file])
    video_alone = model_family.encode_prompt(processor, video_message(), [], None, [file]).image_inputs
    image_alone = model_family.encode_prompt(processor, just_image, [image], None, None).image_inputs
    for key, value in {**video_alone, **image_alone}.items():
        assert torch.equal(encoded.image_inputs[key], value), key


# ------------------------------------------------------------------------------------------- the default sampler
@pytest.mark.parametrize("family", QWEN_VL_UTILS_FAMILIES)
def test_the_processor_sampler_still_samples_as_the_video_processor(family, tiny_model, tmp_path):
    """`video_sampler: processor` (the default, and after qwen_vl_utils on the same module): the processor's own
    `sample_frames` over every frame of the file, as before the option."""
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    file = write_video(tmp_path / "clip.mp4", moving_bar(40, width=64, height=48), fps=SOURCE_FPS)
    text = processor.apply_chat_template(video_message(), add_generation_prompt=True, tokenize=False)
    frames, metadata = decode_all(file)
    expected = processor(
        text=[text], videos=[frames], video_metadata=[metadata], do_sample_frames=True, fps=2.0, return_tensors="pt"
    )  # fmt: skip
    for video in ({}, {"sampler": "qwen_vl_utils"}, {"sampler": "processor"}):
        model_family.configure_video(processor, fps=2.0, **video)
        encoded = model_family.encode_prompt(processor, video_message(), [], None, [str(file)])
        if video.get("sampler") == "qwen_vl_utils":
            assert encoded.input_ids != expected["input_ids"][0].tolist()
        else:
            assert_same_inputs(encoded, expected, model_family)


def test_qwen_vl_utils_samples_up_to_the_last_frame(tmp_path):
    """The frames qwen-vl-utils picks from a 10 s clip at 2 frames a second: 20, spread from the first frame to the last
    (Qwen2-VL's video processor stops half a second before the end), in pairs even where `max_frames` is odd."""
    from vlm_grpo.data.video_frames import decode_video_qwen_vl_utils

    file = write_video(tmp_path / "clip.mp4", moving_bar(100, width=64, height=48), fps=SOURCE_FPS)
    decoded = decode_video_qwen_vl_utils(str(file), fps=2.0, image_patch_size=14)
    assert decoded.metadata.frames_indices == [round(i * 99 / 19) for i in range(20)]
    assert decoded.metadata.fps == SOURCE_FPS and decoded.metadata.total_num_frames == 100
    # scaled up to 128 tokens of 28 x 28 pixels at least, the aspect kept: 10 x 14 tokens
    assert tuple(decoded.frames.shape) == (20, 3, 280, 392)
    capped = decode_video_qwen_vl_utils(str(file), fps=2.0, max_frames=7, image_patch_size=14)
    assert capped.metadata.frames_indices == [round(i * 99 / 5) for i in range(6)]


# ---------------------------------------------------------------------------------------------------- the trainer
def test_the_trainer_samples_with_qwen_vl_utils_when_asked(tiny_model, tmp_path, model_card_pipeline):
    """`video_sampler: qwen_vl_utils` in the training config reaches the trainer's family module, which encodes a
    row's video as the model cards' pipeline does, with the config's options."""
    family = QWEN_VL_UTILS_FAMILIES[0]
    file = str(write_video(tmp_path / "clip.mp4", moving_bar(30, width=64, height=48), fps=SOURCE_FPS))
    rows = [
        {
            "prompt": video_message(),
            "images": [],
            "videos": [{"path": file, "frames": []}],
            "solution": "right",
        }
    ]
    args = grpo_args(
        tmp_path / "run", video_sampler="qwen_vl_utils", video_fps=3.0, video_max_frames=6,
        video_min_pixels=2 * 28 * 28, video_max_pixels=4 * 28 * 28,
    )  # fmt: skip
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_list(rows * 2),
    )
    processor, model_family = trainer.processing_class, trainer.family
    assert model_family.video_sampling == "qwen_vl_utils"
    text = processor.apply_chat_template(video_message(), add_generation_prompt=True, tokenize=False)
    encoded = model_family.encode_prompt(processor, video_message(), [], None, rows[0]["videos"])
    messages = card_message(file, fps=3.0, max_frames=6, min_pixels=2 * 28 * 28, max_pixels=4 * 28 * 28)
    expected = model_card_pipeline(processor, text, messages, trainer.model.config.vision_config.patch_size)
    assert_same_inputs(encoded, expected, model_family)


# ------------------------------------------------------------------------------------------------------- refusals
def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_a_bad_value_and_vllm_are_refused_when_the_config_is_built(tmp_path):
    with pytest.raises(VLMGRPOError) as error:
        grpo_args(tmp_path, video_sampler="decord")
    assert one_line(error) == "video_sampler must be processor or qwen_vl_utils, got 'decord'."
    with pytest.raises(VLMGRPOError) as error:
        grpo_args(tmp_path, video_sampler="qwen_vl_utils", use_vllm=True)
    assert one_line(error).startswith("video_sampler: qwen_vl_utils with use_vllm: true")
    assert one_line(error).endswith("set use_vllm: false, or video_sampler: processor.")
    assert grpo_args(tmp_path).video_sampler == "processor"
    assert "sampler" not in grpo_args(tmp_path).video_kwargs()
    assert grpo_args(tmp_path, video_sampler="qwen_vl_utils").video_kwargs()["sampler"] == "qwen_vl_utils"


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_qwen_vl_utils_is_refused_on_a_family_that_is_not_qwen(family, tiny_model):
    """One line naming the family and what to do, when the video is configured (the trainer does it when built)."""
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    with pytest.raises(VLMGRPOError) as error:
        model_family.configure_video(processor, fps=2.0, sampler="qwen_vl_utils")
    text = one_line(error)
    assert text.startswith(
        f"video_sampler: qwen_vl_utils is not offered for {model_family.model_type} models"
    )
    assert text.endswith("set video_sampler: processor.")


def test_qwen_vl_utils_is_refused_when_a_trainer_of_another_family_is_built(tiny_model, tmp_path):
    with pytest.raises(VLMGRPOError) as error:
        VLMGRPOTrainer(
            model=tiny_model(OTHER_VIDEO_FAMILY), reward_funcs=length_reward,
            args=grpo_args(tmp_path / "run", video_sampler="qwen_vl_utils"),
            train_dataset=Dataset.from_list([{"prompt": video_message(), "images": [], "videos": [], "solution": ""}]),
        )  # fmt: skip
    assert f"is not offered for {OTHER_VIDEO_FAMILY} models" in one_line(error)


def test_pixel_bounds_qwen_vl_utils_would_fail_on_are_refused(tiny_model):
    """A `video_max_pixels` below qwen-vl-utils' per-frame minimum (its default, or `video_min_pixels`)."""
    path = tiny_model(QWEN_VL_UTILS_FAMILIES[0])
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    with pytest.raises(VLMGRPOError) as error:
        model_family.configure_video(processor, fps=2.0, max_pixels=64 * 64, sampler="qwen_vl_utils")
    assert one_line(error).startswith(
        "video_max_pixels (4096) is below the pixels qwen-vl-utils gives each frame"
    )
    model_family.configure_video(
        processor, fps=2.0, min_pixels=32 * 32, max_pixels=64 * 64, sampler="qwen_vl_utils"
    )


def test_frames_sampled_by_qwen_vl_utils_are_not_handed_to_vllm(tiny_model, tmp_path):
    """vLLM's processor would resize them again: `vllm_video` refuses them in one line (the config refuses
    `use_vllm` with `video_sampler: qwen_vl_utils` first)."""
    path = tiny_model(QWEN_VL_UTILS_FAMILIES[0])
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, fps=2.0, sampler="qwen_vl_utils")
    file = str(write_video(tmp_path / "clip.mp4", moving_bar(8, width=64, height=48), fps=SOURCE_FPS))
    with pytest.raises(VLMGRPOError) as error:
        model_family.vllm_video(processor, {"path": file, "frames": []})
    assert "set use_vllm: false, or video_sampler: processor" in one_line(error)
    model_family.configure_video(processor, fps=2.0)
    frames, metadata = model_family.vllm_video(processor, {"path": file, "frames": []})
    assert len(frames) == len(metadata["frames_indices"]) and metadata["do_sample_frames"] is False


def test_a_missing_qwen_vl_utils_is_one_line_naming_the_extra(tiny_model, monkeypatch):
    path = tiny_model(QWEN_VL_UTILS_FAMILIES[0])
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    monkeypatch.setitem(
        sys.modules, "qwen_vl_utils", None
    )  # as if not installed: importing it raises ImportError
    with pytest.raises(VLMGRPOError) as error:
        model_family.configure_video(processor, fps=2.0, sampler="qwen_vl_utils")
    assert "install the video extra (pip install 'vlm-grpo[video]')" in one_line(error)


def test_a_file_cut_short_or_gone_is_one_line_naming_it(tiny_model, tmp_path):
    """qwen-vl-utils samples up to the last frame the header declares: a file cut after its header stops the row with
    the file and the counts, as the processor's sampling does; so does a file removed after loading."""
    path = tiny_model(QWEN_VL_UTILS_FAMILIES[0])
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, fps=2.0, sampler="qwen_vl_utils")
    file = write_clip(tmp_path / "cut.mp4", noise(60), fps=SOURCE_FPS, movflags="faststart")
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    readable = decode_all(file)[0].shape[0]
    with pytest.raises(VLMGRPOError) as error:
        model_family.encode_prompt(processor, video_message(), [], None, [str(file)])
    assert one_line(error) == (
        f"Cannot decode video {str(file)!r} of a training row with qwen-vl-utils: only {readable} of its 60 frames "
        "decode (frame 59 is sampled): the file is cut short or damaged; replace it with a whole copy"
    )
    file.unlink()
    with pytest.raises(VLMGRPOError) as error:
        model_family.encode_prompt(processor, video_message(), [], None, [str(file)])
    assert one_line(error).startswith(f"Video file {str(file)!r} of a training row is gone")
