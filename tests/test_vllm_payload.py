"""vLLM payloads: raw images plus prompts with one unexpanded image placeholder per image (TRL issue #6294); and the
refusal, before anything loads, of a model whose head dims vLLM's CPU backend cannot run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FAMILIES, color_rows, square_image
from test_video import VIDEO_FAMILIES, video_rows
from transformers import AutoConfig
from trl.data_utils import prepare_multimodal_messages

from vlm_grpo.data.rows import load_rows
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family
from vlm_grpo.rollout.vllm.payload import (
    VLLM_CPU_HEAD_DIMS,
    build_vllm_payload,
    check_vllm_cpu_attention,
    check_vllm_prompts,
    vllm_generate_kwargs,
    vllm_history_prompts,
    vllm_prompt_inputs,
)
from vlm_grpo.testing import (
    DEFAULT_FAMILY,
    a_family_with,
    families_with,
    one_family_per_image_rule,
    tiny_family,
)


@pytest.fixture(scope="module")
def family_setup(tiny_model):
    """`family_setup(family) -> (module, processor, image_token_id)`, loaded once per family."""
    cache = {}

    def get(family):
        if family not in cache:
            path = tiny_model(family)
            module = get_model_family(path)
            cache[family] = (
                module,
                module.load_processor(path),
                AutoConfig.from_pretrained(path).image_token_id,
            )
        return cache[family]

    return get


def expanded_ids(module, processor, row):
    """The processor-expanded prompt ids the trainer trains on."""
    images = row.get("images") or []
    return module.encode_prompt(processor, prepare_multimodal_messages(row["prompt"], images=images), images)


def collapse_runs(ids, token_id):
    """`ids` with every run of `token_id` shrunk to one token."""
    return [t for i, t in enumerate(ids) if t != token_id or i == 0 or ids[i - 1] != token_id]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("images_per_prompt", [1, 2])
def test_one_placeholder_per_image(family, images_per_prompt, family_setup):
    module, processor, image_token_id = family_setup(family)
    rows = color_rows(3, images_per_prompt=images_per_prompt)
    payload = build_vllm_payload(processor, module, load_rows(rows))
    token, token_id = module.prompt_image_token(processor)
    for row, text, ids in zip(rows, payload.texts, payload.prompt_ids, strict=True):
        assert text.count(token) == images_per_prompt
        assert ids.count(token_id) == images_per_prompt
        assert ids == processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        expanded = expanded_ids(module, processor, row).input_ids
        assert expanded.count(image_token_id) > 2 * images_per_prompt  # the processor expands each image
        if (
            tiny_family(family).image_rule == "grid"
        ):  # the same prompt, up to the expansion of the image token
            assert collapse_runs(expanded, image_token_id) == ids


@pytest.mark.parametrize("family", FAMILIES)
def test_images_are_the_rows_own_objects_in_order(family, family_setup):
    module, processor, _ = family_setup(family)
    rows = color_rows(2, images_per_prompt=2)
    single = {"prompt": color_rows(1)[0]["prompt"], "image": square_image("blue")}
    payload = build_vllm_payload(processor, module, load_rows([*rows, single]))
    for row, images in zip(rows, payload.images[:2], strict=True):
        assert len(images) == 2 and all(a is b for a, b in zip(images, row["images"], strict=True))
    assert payload.images[2][0] is single["image"]


@pytest.mark.parametrize("family", one_family_per_image_rule())
def test_text_only_rows_get_no_images(family, family_setup):
    module, processor, _ = family_setup(family)
    token, token_id = module.prompt_image_token(processor)
    mixed = build_vllm_payload(processor, module, load_rows(color_rows(4, text_only_every=2)))
    assert [x is None for x in mixed.images] == [False, True, False, True]
    assert mixed.prompt_ids[1].count(token_id) == 0 and token not in mixed.texts[1]
    inputs = vllm_prompt_inputs(mixed)
    assert (
        "multi_modal_data" not in inputs[1] and inputs[0]["multi_modal_data"]["image"] is mixed.images[0][0]
    )
    text_only = build_vllm_payload(processor, module, load_rows([color_rows(2, text_only_every=1)[0]]))
    assert text_only.images is None  # TRL wants None, not [None], when no row has an image


def test_group_copies_share_one_rendering(family_setup):
    module, processor, _ = family_setup(a_family_with(image_rule="grid", besides=[DEFAULT_FAMILY]))
    row = color_rows(1)[0]
    shared = [expanded_ids(module, processor, row)] * 3  # the trainer's encoding, one object per group
    payload = build_vllm_payload(processor, module, load_rows([row] * 3), shared)
    assert payload.texts == [payload.texts[0]] * 3 and payload.prompt_ids == [payload.prompt_ids[0]] * 3
    assert all(images[0] is row["images"][0] for images in payload.images)


@pytest.mark.parametrize("family", FAMILIES)
def test_image_entries_must_match_images(family, family_setup):
    module, processor, _ = family_setup(family)
    row = color_rows(1, images_per_prompt=2)[0]
    row["images"] = row["images"][:1]
    with pytest.raises(ValueError, match=r"^Row 0: the prompt has 2 image entries but 1 images\.$"):
        build_vllm_payload(processor, module, load_rows([row]))


@pytest.mark.parametrize("family", FAMILIES)
def test_expanded_placeholders_are_rejected(family, family_setup):
    module, processor, _ = family_setup(family)
    row = color_rows(1)[0]
    expanded_text = processor.tokenizer.decode(expanded_ids(module, processor, row).input_ids)
    row["prompt"] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": expanded_text}]}
    ]
    with pytest.raises(ValueError, match=r"^Row 1: the prompt holds \d+ image tokens for 1 image\(s\)"):
        build_vllm_payload(processor, module, load_rows([color_rows(1)[0], row]))


def test_generate_kwargs_per_mode(family_setup):
    module, processor, _ = family_setup(DEFAULT_FAMILY)
    rows = [r for r in color_rows(2, text_only_every=2) for _ in range(2)]  # G = 2 copies per prompt
    payload = build_vllm_payload(processor, module, load_rows(rows))
    expanded = [expanded_ids(module, processor, r).input_ids for r in rows]
    colocate = vllm_generate_kwargs(payload, 2)
    assert colocate == {"prompts": payload.prompt_ids, "images": payload.images, "num_generations": 2}
    assert vllm_generate_kwargs(payload, 2, "server", expanded_prompt_ids=expanded)["prompts"] == expanded
    with pytest.raises(ValueError, match="server mode needs the processor-expanded"):
        vllm_generate_kwargs(payload, 2, "server")
    with pytest.raises(ValueError, match="vllm_mode must be"):
        vllm_generate_kwargs(payload, 2, "remote")


# ------------------------------------------------------------------------------- vLLM's CPU backend: head dims
@pytest.mark.parametrize("family", families_with(tool_calls=True))
def test_a_tool_history_goes_to_vllm_as_its_template_writes_it(family, family_setup):
    """A turn after a tool's image: the trainer's row holds both images expanded by the processor; what vLLM gets
    (`vllm_history_ids`) is the history as the chat template writes it, one placeholder per image, which vLLM's
    processor expands itself."""
    module, processor, _ = family_setup(family)
    images = [square_image("red"), square_image("blue", 32)]
    history = [
        {"role": "user", "content": [{"type": "image", "image": images[0]}, {"type": "text", "text": "Color ?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "zoom", "arguments": {"region": 2}}}
        ]},
        {"role": "tool", "name": "zoom", "content": [
            {"type": "image", "image": images[1]}, {"type": "text", "text": "quarter 2"}
        ]},
    ]  # fmt: skip
    text = processor.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    written = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    expanded = processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()
    placeholder_id = module.prompt_image_token(processor)[1]
    assert len(expanded) > len(written) and written.count(placeholder_id) == 2
    assert module.vllm_history_ids(processor, expanded) == written
    assert vllm_history_prompts(module, processor, [expanded]) == [written]
    assert vllm_history_prompts(module, processor, [expanded], "server") == [
        expanded
    ]  # the server places features


def test_a_head_dim_vllm_cpu_cannot_run_is_refused_in_one_line(tiny_model):
    path = tiny_model(DEFAULT_FAMILY)  # the test builders' default: hidden size 64, 4 heads
    config = AutoConfig.from_pretrained(path)
    family = get_model_family(config)
    with pytest.raises(VLMGRPOError) as error:
        check_vllm_cpu_attention(family, config, torch.device("cpu"), path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert "attention head dim 16; it runs 32, 64" in message
    assert "Set use_vllm: false" in message and "--hidden_size 256" in message
    for device in (torch.device("cuda"), "cuda:0"):  # vLLM's GPU kernels: not this check's business
        check_vllm_cpu_attention(family, config, device, path)


def test_a_linear_attention_head_dim_vllm_cpu_cannot_run_is_refused(tmp_path):
    """A hybrid family at hidden size 128: its attention head dim (32) runs, its linear-attention key head dim does
    not; at 256 both do."""
    from vlm_grpo.testing import a_family_with, build_tiny_model

    shape = a_family_with(indexable_cache=False)  # linear-attention layers: no indexable cache
    for hidden, refused in ((128, True), (256, False)):
        path = build_tiny_model(shape, tmp_path / str(hidden), hidden_size=hidden)
        config = AutoConfig.from_pretrained(path)
        family = get_model_family(config)
        assert set(family.attention_head_dims(config)) == {
            "attention", "linear-attention key", "linear-attention value"
        }  # fmt: skip
        if refused:
            with pytest.raises(VLMGRPOError, match="linear-attention key head dim 32; it runs 64, 128"):
                check_vllm_cpu_attention(family, config, "cpu", "tiny")
        else:
            check_vllm_cpu_attention(family, config, "cpu", "tiny")


@pytest.mark.vllm
def test_cpu_head_dims_are_the_installed_vllms():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert VLLM_CPU_HEAD_DIMS == tuple(CPUAttentionBackend.get_supported_head_sizes())


# ------------------------------------------------------------------------------------------------------------ videos
@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_a_video_goes_to_vllm_as_the_frames_the_trainer_samples(family, tiny_model, tmp_path):
    """One video placeholder per video in the ids; the frames and metadata are what the trainer's processor decodes,
    marked as sampled; `fps` for vLLM's processor is the sampled rate the trainer gives its own."""
    from vlm_grpo.data.video_frames import decode_video

    module = get_model_family(tiny_model(family))
    processor = module.load_processor(tiny_model(family))
    module.configure_video(processor, fps=2.0)
    rows = load_rows([*video_rows(tmp_path, 1), color_rows(1)[0] | {"videos": []}])
    payload = build_vllm_payload(processor, module, rows)
    _, video_id = module.prompt_video_token(processor)
    assert [ids.count(video_id) for ids in payload.prompt_ids] == [1, 0]
    ((frames, metadata),) = payload.videos[0]
    decoded = decode_video(rows[0]["videos"][0], processor.video_processor, 2.0)
    assert payload.videos[1] is None and np.array_equal(frames, decoded.frames)
    assert (
        metadata["frames_indices"] == list(decoded.metadata.frames_indices)
        and not metadata["do_sample_frames"]
    )
    video_input, image_input = vllm_prompt_inputs(payload)
    assert video_input["multi_modal_data"] == {"video": (frames, metadata)}
    assert video_input["mm_processor_kwargs"] == {"fps": decoded.metadata.sampled_fps}
    assert set(image_input["multi_modal_data"]) == {"image"} and "mm_processor_kwargs" not in image_input


def test_a_prompt_vllm_expanded_otherwise_stops_in_one_line():
    check_vllm_prompts([[1, 2, 3]], [[1, 2, 3]])
    with pytest.raises(
        VLMGRPOError, match="vLLM expanded row 1's prompt into 2 tokens where the trainer"
    ) as error:
        check_vllm_prompts([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5, 5]])
    assert "\n" not in str(error.value)
