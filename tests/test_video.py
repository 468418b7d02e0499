"""Video records: the data config reads them, the family's processor samples their frames, and training on them is
exact and computes each group's prompt and video once.

The clips are real video files written by the tests with PyAV (MPEG-4 Part 2 in .mp4), or folders of PNG frames.
Each video family's encoding must equal its processor's own frame sampling of frames decoded independently, and the
shared-prefix log-probs of mixed video, image and text-only batches must equal full rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from conftest import color_rows, grpo_args, length_reward, square_image
from datasets import Dataset
from test_shared_prefix import G, logps_and_grads, rollout_batch
from transformers.video_utils import VideoMetadata

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.data import load_data_config
from vlm_grpo.data.errors import DataConfigError
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family
from vlm_grpo.models.registry import FAMILY_CLASSES
from vlm_grpo.testing import TINY_FAMILIES

VIDEO_FAMILIES = tuple(
    name for name in TINY_FAMILIES for cls in FAMILY_CLASSES if name in cls.model_types and cls.reads_video
)
VLLM_VIDEO_REFUSED = tuple(
    name
    for name in VIDEO_FAMILIES
    for cls in FAMILY_CLASSES
    if name in cls.model_types and cls.vllm_video_refusal
)
"""Video families whose videos vLLM does not take here (e.g. it expands them into other ids than their processor
writes)."""
NO_VIDEO_FAMILIES = tuple(
    name
    for name in TINY_FAMILIES
    for cls in FAMILY_CLASSES
    if name in cls.model_types and not cls.reads_video
)
NO_VIDEO_FAMILY = NO_VIDEO_FAMILIES[0]
FPS = 4  # frames per second of the written clips
MOVES = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}


def clip(direction: str, n: int = 12, size: int = 56) -> np.ndarray:
    """`[n, size, size, 3]` uint8 frames of a red square moving in `direction` on grey."""
    dx, dy = MOVES[direction]
    frames = np.full((n, size, size, 3), 128, np.uint8)
    for t in range(n):
        x, y = size // 2 - 8 + dx * (2 * t - n), size // 2 - 8 + dy * (2 * t - n)
        frames[t, max(y, 0) : max(y + 16, 0), max(x, 0) : max(x + 16, 0)] = (220, 30, 30)
    return frames


def write_video(path: Path, frames: np.ndarray, fps: int = FPS) -> Path:
    """Encode `frames` `[T, H, W, 3]` as an MPEG-4 video file."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def write_frames(folder: Path, frames: np.ndarray) -> list[str]:
    """Write `frames` as PNG files in `folder`; returns their names relative to its parent."""
    from PIL import Image

    folder.mkdir(parents=True)
    for k, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{k:03d}.png")
    return [f"{folder.name}/{k:03d}.png" for k in range(len(frames))]


def decode_all(path: Path) -> tuple[np.ndarray, VideoMetadata]:
    """Every frame of a video file, decoded with PyAV directly, and the file's metadata."""
    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        fps = float(container.streams.video[0].average_rate)
    metadata = VideoMetadata(
        total_num_frames=len(frames), fps=fps, width=frames.shape[2], height=frames.shape[1],
        duration=len(frames) / fps,
    )  # fmt: skip
    return frames, metadata


def video_message(text: str = "Where does the square move?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]


def video_rows(folder: Path, n: int) -> list[dict]:
    """Rows with one video each (files, and every third a list of frame files), directions in turn."""
    rows = []
    for i in range(n):
        direction = list(MOVES)[i % len(MOVES)]
        frames = clip(direction)
        if i % 3 == 2:
            names = write_frames(folder / f"frames{i}", frames[::2])
            video = {"path": None, "frames": [str(folder / name) for name in names]}
        else:
            video = {"path": str(write_video(folder / f"{i}.mp4", frames)), "frames": []}
        rows.append({"prompt": video_message(), "images": [], "videos": [video], "solution": direction})
    return rows


# ------------------------------------------------------------------------------------------------- data configs
def test_data_config_reads_video_records(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    write_video(media / "right.mp4", clip("right"))
    frames = write_frames(media / "up", clip("up")[::3])
    records = [
        {"video": "right.mp4", "problem": "<video> Where does it move?", "solution": "right"},
        {"video": frames, "problem": "Where does it move?", "solution": "up"},
        {"videos": ["right.mp4", frames], "problem": "First <video>, then <video>: same?", "solution": "no"},
        {"image": "up/000.png", "problem": "What is it?", "solution": "a square"},
        {"problem": "No media here.", "solution": "ok"},
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "data.yaml").write_text("image_root: media/\ndatasets:\n  - json_path: train.jsonl\n")
    data = load_data_config(tmp_path / "data.yaml")

    file = str(media / "right.mp4")
    framed = [str(media / name) for name in frames]
    assert data["videos"] == [
        [{"path": file, "frames": []}],
        [{"path": None, "frames": framed}],
        [{"path": file, "frames": []}, {"path": None, "frames": framed}],
        [],
        [],
    ]
    kinds = [[part["type"] for part in row["prompt"][-1]["content"]] for row in data]
    assert kinds == [
        ["video", "text"],
        ["video", "text"],
        ["text", "video", "text", "video", "text"],
        ["image", "text"],
        ["text"],
    ]
    assert "video" not in data.column_names  # consumed: the rewards see the `videos` column


def test_parquet_records_carry_videos(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_video(tmp_path / "left.mp4", clip("left"))
    table = pa.table({"problem": ["Where?"], "answer": ["left"], "videos": [["left.mp4"]]})
    pq.write_table(table, tmp_path / "train.parquet")
    (tmp_path / "data.yaml").write_text("datasets:\n  - parquet_path: train.parquet\n")
    data = load_data_config(tmp_path / "data.yaml")
    assert data[0]["videos"] == [{"path": str(tmp_path / "left.mp4"), "frames": []}]
    assert data[0]["solution"] == "left"


BAD_VIDEOS = {
    "missing file": ({"video": "nope.mp4"}, r"field 'video': video 0 \(\S*nope.mp4\): file not found"),
    "not a video": ({"video": "bad.mp4"}, r"field 'video': video 0 \(\S*bad.mp4\): unreadable video file"),
    "empty file": ({"video": "empty.mp4"}, r"field 'video': video 0 \(\S*empty.mp4\): unreadable video file"),
    "missing frame": (
        {"video": ["f/000.png", "f/nope.png"]},
        r"field 'video': video 0 .*: frame 1 \(\S*nope.png\): file not found",
    ),
    "no frames": ({"video": []}, "field 'video': the value is an empty list of frames"),
    "both fields": ({"video": "ok.mp4", "videos": ["ok.mp4"]}, "record has both 'video' and 'videos'"),
    "wrong type": ({"videos": [3]}, "field 'videos': video 0 has type int"),
    "placeholders": (
        {"video": "ok.mp4", "problem": "<video> and <video>"},
        "field 'video': the prompt has 2 <video> placeholder",
    ),
}


@pytest.mark.parametrize("case", list(BAD_VIDEOS))
def test_bad_videos_stop_the_loader_naming_file_record_and_field(case, tmp_path):
    fields, message = BAD_VIDEOS[case]
    write_video(tmp_path / "ok.mp4", clip("up"))
    write_frames(tmp_path / "f", clip("up")[:1])
    (tmp_path / "bad.mp4").write_text("not a video")
    (tmp_path / "empty.mp4").write_bytes(b"")
    records = [
        {"video": "ok.mp4", "problem": "Where?", "solution": "up"},
        {"problem": "Where?", "solution": "up", **fields},
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "data.yaml").write_text("datasets:\n  - json_path: train.jsonl\n")
    with pytest.raises(DataConfigError) as error:
        load_data_config(tmp_path / "data.yaml")
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{tmp_path / 'train.jsonl'}: record 2 (line 2)")
    assert re.search(message, text), text


# ------------------------------------------------------------------------------------------------------ encoding
@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_video_tokens_equal_the_processors_own_sampling(family, tiny_model, tmp_path):
    """A video file: the processor samples frames (at `video_fps`) from every frame, decoded by PyAV directly. A
    list of frame files: the frames as given, at `video_fps`."""
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, fps=2.0)
    file = write_video(tmp_path / "clip.mp4", clip("right", n=16))
    text = processor.apply_chat_template(video_message(), add_generation_prompt=True, tokenize=False)

    frames, metadata = decode_all(file)
    expected = processor(
        text=[text],
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=True,
        fps=2.0,
        return_tensors="pt",
    )
    encoded = model_family.encode_prompt(
        processor, video_message(), [], None, [{"path": str(file), "frames": []}]
    )
    assert encoded.input_ids == expected["input_ids"][0].tolist() and encoded.num_videos == 1
    assert torch.equal(video_pixels(encoded.image_inputs), video_pixels(expected))
    for key in set(encoded.image_inputs) & set(expected):
        assert torch.equal(encoded.image_inputs[key], torch.as_tensor(expected[key])), key
    # to the model, the stored inputs are the processor's own video: the same logits as transformers' video path
    model = model_family.load_model(path, **model_family.model_init_kwargs()).eval()
    ids = torch.tensor([encoded.input_ids])  # [1, L]
    mask = torch.ones_like(ids)
    inputs = model_family.model_inputs(model.config, ids, mask, [encoded.image_inputs])
    positions = model_family.position_ids(model, ids, mask, [encoded.image_inputs])
    own = {k: v for k, v in expected.items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        ours, theirs = model(**inputs, position_ids=positions).logits, model(**own).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
    as_path = model_family.encode_prompt(
        processor, video_message(), [], None, [str(file)]
    )  # a dataset built in Python
    assert as_path.input_ids == encoded.input_ids

    names = write_frames(tmp_path / "frames", clip("left", n=6))
    listed = [str(tmp_path / name) for name in names]
    encoded = model_family.encode_prompt(
        processor, video_message(), [], None, [{"path": None, "frames": listed}]
    )
    frames = clip("left", n=6)
    metadata = VideoMetadata(total_num_frames=6, fps=2.0, frames_indices=list(range(6)))
    expected = processor(
        text=[text],
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        fps=2.0,
        return_tensors="pt",
    )
    assert encoded.input_ids == expected["input_ids"][0].tolist()
    assert torch.equal(video_pixels(encoded.image_inputs), video_pixels(expected))
    as_list = model_family.encode_prompt(processor, video_message(), [], None, [listed])
    assert torch.equal(video_pixels(as_list.image_inputs), video_pixels(expected))


def video_pixels(image_inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The patches of a prompt holding one video and no image, under whichever key its family (or its processor)
    stores them."""
    (pixels,) = (value for key, value in image_inputs.items() if key.startswith("pixel_values"))
    return pixels


@pytest.mark.parametrize("video_first", [True, False], ids=["video_then_image", "image_then_video"])
@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_a_prompt_with_an_image_and_a_video_reaches_the_language_model_as_the_processor_says(
    family, video_first, tiny_model, tmp_path
):
    """One prompt holding an image and a video, in either order: the embeddings entering the language model hold the
    vision tower's image features on the tokens the processor marks as the image's and its video features on the
    video's (`get_image_features` / `get_video_features` of the processor's own tensors), and the positions are the
    model's M-RoPE rule over the processor's token types and grids."""
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, fps=2.0)
    model = model_family.load_model(path, **model_family.model_init_kwargs()).eval()
    parts = [{"type": "image"}, {"type": "video"}]
    messages = [
        {"role": "user", "content": [*parts[:: -1 if video_first else 1], {"type": "text", "text": "Same?"}]}
    ]
    image, frames = square_image("red"), clip("up", n=6)
    names = write_frames(tmp_path / "frames", frames)
    video = {"path": None, "frames": [str(tmp_path / name) for name in names]}
    encoded = model_family.encode_prompt(processor, messages, [image], None, [video])
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    metadata = VideoMetadata(total_num_frames=6, fps=2.0, frames_indices=list(range(6)))
    expected = processor(
        text=[text], images=[image], videos=[frames], video_metadata=[metadata], do_sample_frames=False, fps=2.0,
        return_tensors="pt",
    )  # fmt: skip
    assert encoded.input_ids == expected["input_ids"][0].tolist()
    ids = torch.tensor([encoded.input_ids])  # [1, L]
    mask = torch.ones_like(ids)
    inputs = model_family.model_inputs(model.config, ids, mask, [encoded.image_inputs])
    if (
        "video_grid_thw" not in expected
    ):  # frames as images, or no M-RoPE grid: transformers' forward is the reference
        own = {k: v for k, v in expected.items() if isinstance(v, torch.Tensor)}
        with torch.no_grad():
            assert torch.allclose(model(**inputs).logits, model(**own).logits, atol=1e-5, rtol=0)
        return

    entering = {}
    hook = model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: entering.update(kwargs), with_kwargs=True
    )
    with torch.no_grad():
        model(**inputs, position_ids=model_family.position_ids(model, ids, mask, [encoded.image_inputs]))
        hook.remove()
        grids = {
            k: expected[k]
            for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
            if k in expected
        }
        image_features = model.model.get_image_features(expected["pixel_values"], expected["image_grid_thw"])
        video_features = model.model.get_video_features(
            expected["pixel_values_videos"], expected["video_grid_thw"]
        )
        types = torch.as_tensor(expected["mm_token_type_ids"])  # [1, L]: 1 image, 2 video
        positions, _ = model.model.get_rope_index(ids, mm_token_type_ids=types, attention_mask=mask, **grids)
    embeds = entering["inputs_embeds"][0]  # [L, D]
    assert types.eq(1).any() and types.eq(2).any()
    assert torch.allclose(embeds[types[0] == 1], torch.cat(image_features.pooler_output), atol=1e-6, rtol=0)
    assert torch.allclose(embeds[types[0] == 2], torch.cat(video_features.pooler_output), atol=1e-6, rtol=0)
    assert torch.equal(entering["position_ids"][-3:], positions)


# ------------------------------------------------------------------------------------------------------ training
def mixed_rows(folder: Path) -> list[dict]:
    """Video, image and text-only prompts."""
    images = color_rows(3, text_only_every=3)
    for row in images:
        row["videos"] = []
    return video_rows(folder, 3) + images


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_shared_prefix_logps_match_full_rows_with_videos(family, tiny_model, tmp_path):
    """Each group's prompt (its video included) once: log-probs, entropies and gradients equal full rows, and M-RoPE
    positions equal the model's own rule over the videos' grids."""
    rows = mixed_rows(tmp_path)
    trainer = VLMGRPOTrainer(
        model=tiny_model(family), reward_funcs=length_reward, args=grpo_args(tmp_path / "run"),
        train_dataset=Dataset.from_list(color_rows(4)),
    )  # fmt: skip
    batch = rollout_batch(trainer, rows)
    assert all(batch["image_inputs"][: 3 * G])  # the video rows hold their video's inputs
    full_logps, full_ent, full_grads = logps_and_grads(trainer, batch, share=False)
    shared_logps, shared_ent, shared_grads = logps_and_grads(trainer, batch, share=True)
    mask = batch["completion_mask"].bool()
    assert torch.allclose(shared_logps[mask], full_logps[mask], atol=1e-5, rtol=0)
    assert torch.allclose(shared_ent[mask], full_ent[mask], atol=1e-5, rtol=0)
    scale = max(g.abs().max().item() for g in full_grads.values())
    assert any(trainer.family.is_vision_module(n) for n in shared_grads)
    for name, full in full_grads.items():
        assert (shared_grads[name] - full).abs().max().item() <= 1e-5 * full.abs().max().item() + 1e-6 * scale

    model, family_module = trainer.model, trainer.family
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = family_module.position_ids(model, ids, mask, batch["image_inputs"])
    if positions is None:  # the model's own 1-D positions
        return
    types = family_module.token_type_inputs(ids, model.config)["mm_token_type_ids"]
    grids = {
        k: v for k, v in family_module.collate(batch["image_inputs"]).items() if k in family_module.grid_keys
    }
    expected, _ = model.model.get_rope_index(ids, mm_token_type_ids=types, attention_mask=mask, **grids)
    valid = mask.bool().expand_as(positions)
    assert torch.equal(positions[valid], expected[valid])


def video_encoder_families() -> list[str]:
    """One family per distinct set of video-encoder arguments (`video_feature_keys`), the second video family first
    (Qwen2.5-VL: its videos carry their frame timing, `second_per_grid_ts`)."""
    chosen: dict[tuple[str, ...], str] = {}
    for name in (VIDEO_FAMILIES[1], *VIDEO_FAMILIES):
        keys = next(cls.video_feature_keys for cls in FAMILY_CLASSES if name in cls.model_types)
        if keys:
            chosen.setdefault(keys, name)
    return list(chosen.values())


@pytest.mark.parametrize("family", video_encoder_families())
def test_training_on_videos_computes_each_groups_video_once(family, tiny_model, tmp_path):
    """Two steps on video, image and text-only prompts with frozen vision: the language model trains, the vision
    tower does not, and each group's video goes through it once per generation batch."""
    rows = mixed_rows(tmp_path)[:4]
    trainer = VLMGRPOTrainer(
        model=tiny_model(family), reward_funcs=length_reward,
        args=grpo_args(tmp_path / "run", freeze_vision_modules=True, share_prompt_prefix="true", video_fps=2.0),
        train_dataset=Dataset.from_list(rows),
    )  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and not any(trainer.family.is_vision_module(n) for n in changed)
    # 2 steps of 2 prompts (groups of 2), each with a video or an image: each prompt's media goes through the vision
    # tower once per step (a cache miss), and generation and the loss's forward reuse it
    assert trainer.image_features.encoded_rows == 2 * 2
    log = trainer.state.log_history
    assert all(np.isfinite(entry["loss"]) for entry in log if "loss" in entry)


@pytest.mark.parametrize("family", NO_VIDEO_FAMILIES)
def test_a_family_without_video_is_refused_at_construction(family, tiny_model, tmp_path):
    """One line saying why the family reads no video here (its model does not, or the installed transformers)."""
    rows = video_rows(tmp_path, 2)
    reason = get_model_family(tiny_model(family)).no_video_reason()
    with pytest.raises(
        VLMGRPOError, match=f"^The dataset holds videos, but {re.escape(reason)}; remove"
    ) as error:
        VLMGRPOTrainer(
            model=tiny_model(family), reward_funcs=length_reward, args=grpo_args(tmp_path / "run"),
            train_dataset=Dataset.from_list(rows),
        )  # fmt: skip
    assert "\n" not in str(error.value)


def test_training_yaml_sets_video_sampling(tiny_model, tmp_path):
    from vlm_grpo.trainer.setup import load_policy

    args = grpo_args(tmp_path, video_fps=1.0, video_max_frames=6, video_max_pixels=4 * 56 * 56)
    family = get_model_family(tiny_model(VIDEO_FAMILIES[0]))
    _, processor, _ = load_policy(tiny_model(VIDEO_FAMILIES[0]), args, family, None, None)
    video_processor = processor.video_processor
    assert (video_processor.fps, video_processor.max_frames) == (1.0, 6)
    assert video_processor.size["longest_edge"] == 4 * 56 * 56
    with pytest.raises(VLMGRPOError, match="video_fps must be a positive number"):
        grpo_args(tmp_path, video_fps=0)


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_video_max_frames_caps_the_frames_sampled_from_a_file(family, tiny_model, tmp_path):
    """A 10-second file at `video_fps: 2` gives 20 frames, or `video_max_frames` where it is set (each family's video
    processor caps in its own way; `configure_video` maps the option onto it, or refuses it in one line where the
    processor caps nothing)."""
    from vlm_grpo.data.video_frames import decode_video

    file = write_video(tmp_path / "long.mp4", clip("right", n=10 * FPS))
    path = tiny_model(family)
    model_family = get_model_family(path)
    sampled = {}
    for max_frames in (None, 6):
        processor = model_family.load_processor(path)
        try:
            model_family.configure_video(processor, fps=2.0, max_frames=max_frames)
        except VLMGRPOError as refused:
            assert max_frames and "remove video_max_frames" in str(refused) and "\n" not in str(refused)
            continue
        sampled[max_frames] = len(decode_video(str(file), processor.video_processor, 2.0).frames)
    assert sampled in ({None: 20, 6: 6}, {None: 20})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"use_vllm": True, "vllm_mode": "server"}, "which vLLM server mode does not take"),
        ({"use_vllm": True, "vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size > 1"),
        (
            {"use_vllm": True, "video_max_pixels": 56 * 56 * 4},
            "video_min_pixels and video_max_pixels do not reach",
        ),
        ({"rollout_func": lambda prompts, trainer: {}}, "which tools, environment_factory"),
    ],
    ids=["vllm_server", "vllm_tensor_parallel", "vllm_video_pixels", "rollout_func"],
)
def test_what_cannot_take_videos_is_refused_at_construction(options, message, tiny_model, tmp_path):
    """One line at construction, before any engine is built (vLLM colocate mode takes videos: `test_vllm.py`)."""
    rows = video_rows(tmp_path, 2)
    extra = {k: v for k, v in options.items() if k == "rollout_func"}
    args = grpo_args(tmp_path / "run", **{k: v for k, v in options.items() if k != "rollout_func"})
    with pytest.raises(VLMGRPOError, match=message) as refused:
        VLMGRPOTrainer(
            model=tiny_model(VIDEO_FAMILIES[0]), reward_funcs=length_reward, args=args,
            train_dataset=Dataset.from_list(rows), **extra,
        )  # fmt: skip
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("family", VLLM_VIDEO_REFUSED)
def test_videos_with_vllm_are_refused_where_vllm_does_not_take_them(family, tiny_model, tmp_path):
    args = grpo_args(tmp_path / "run", use_vllm=True, vllm_mode="colocate")
    with pytest.raises(VLMGRPOError, match=f"which vLLM does not take for {family} here") as refused:
        VLMGRPOTrainer(
            model=tiny_model(family), reward_funcs=length_reward, args=args,
            train_dataset=Dataset.from_list(video_rows(tmp_path, 2)),
        )  # fmt: skip
    assert "\n" not in str(refused.value) and str(refused.value).endswith(
        "set use_vllm: false to generate with transformers."
    )


# ------------------------------------------------------------------------------------------------------- planner
@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_planner_counts_the_video_tokens_the_processor_writes(family, tiny_model, tmp_path):
    """`vlm-grpo plan`'s tokens of one video (the family's count with the folder's video size bounds, as the plan
    reads them) equal the placeholders the processor writes for a list of that many frames of that size."""
    from vlm_grpo.planner.architectures import load_model_config

    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    model_family.configure_video(processor, fps=2.0)
    config, settings, _ = load_model_config(path)
    bounds = (settings.get("video_min_pixels"), settings.get("video_max_pixels"))
    for frames, (width, height) in ((4, (56, 56)), (6, (80, 48)), (8, (200, 120))):
        folder = tmp_path / f"{frames}_{width}x{height}"
        names = write_frames(folder, np.zeros((frames, height, width, 3), np.uint8))
        listed = [str(tmp_path / name) for name in names]
        encoded = model_family.encode_prompt(processor, video_message(), [], None, [listed])
        placeholders = {model_family.image_token_id(processor), model_family.prompt_video_token(processor)[1]}
        written = sum(
            encoded.input_ids.count(t) for t in placeholders
        )  # GLM and InternVL write frames as images
        assert model_family.video_tokens(config, frames, width, height, *bounds) == written > 0


def test_plan_counts_the_videos_of_a_prompt(tiny_model, tmp_path):
    """`--videos 1 --video_frames 8 --video_size 112x112` adds the family's tokens of such a video to the prompt;
    `video_max_frames` caps the frames; a family that reads no video is one line."""
    from test_plan import plan_command, planned

    from vlm_grpo.planner.architectures import load_model_config
    from vlm_grpo.planner.report import VideoShape

    model = tiny_model(VIDEO_FAMILIES[0])
    config, settings, _ = load_model_config(model)
    family = get_model_family(config)
    tokens = family.video_tokens(
        config, 8, 112, 112, settings["video_min_pixels"], settings["video_max_pixels"]
    )
    without = planned(model, plan_options={"images": 0}).recipe.prompt_tokens
    with_video = planned(model, plan_options={"images": 0, "videos": VideoShape(1, 8, (112, 112))})
    assert with_video.recipe.prompt_tokens == without + tokens and with_video.videos.tokens == tokens
    capped = planned(model, plan_options={"videos": VideoShape(2, 8, (112, 112))}, video_max_frames=4)
    assert capped.videos.frames == 4 and capped.videos.tokens < tokens

    train = tmp_path / "train.yaml"
    train.write_text(f"model_name_or_path: {model}\n", encoding="utf-8")
    shown = plan_command(str(train), "--videos", "1", "--video_frames", "8", "--video_size", "112x112")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert f"1 video of 8 frames 112x112, {tokens} tokens each" in shown.stdout

    train.write_text(f"model_name_or_path: {tiny_model(NO_VIDEO_FAMILY)}\n", encoding="utf-8")
    refused = plan_command(str(train), "--videos", "1")
    assert refused.returncode == 1 and "read no video here; drop --videos" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
