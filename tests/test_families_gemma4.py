"""Gemma 4: images train; audio and video entries are refused with one line; their tokens are never sampled."""

from __future__ import annotations

import pytest
from conftest import color_rows

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family


@pytest.fixture(scope="module")
def gemma4(tiny_model):
    path = tiny_model("gemma4")
    family = get_model_family(path)
    return family, family.load_processor(path)


@pytest.mark.parametrize("kind", ["audio", "video"])
def test_audio_and_video_entries_are_refused(kind, gemma4):
    family, processor = gemma4
    messages = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "What is it ?"}]}]
    with pytest.raises(
        VLMGRPOError, match=rf"^Gemma 4 {kind} inputs are not supported .*only images and text"
    ) as info:
        family.encode_prompt(processor, messages, None)
    assert "\n" not in str(info.value)


def test_audio_and_video_tokens_are_placeholders(gemma4, tiny_model):
    from transformers import AutoConfig

    family, processor = gemma4
    placeholders = family.placeholder_token_ids(processor, AutoConfig.from_pretrained(tiny_model("gemma4")))
    tokens = set(processor.tokenizer.convert_ids_to_tokens(placeholders))
    assert {"<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"} <= tokens


def test_image_prompt_marks_image_tokens_for_bidirectional_attention(gemma4, tiny_model):
    import torch
    from transformers import AutoConfig
    from trl.data_utils import prepare_multimodal_messages

    family, processor = gemma4
    row = color_rows(1, images_per_prompt=2)[0]
    encoded = family.encode_prompt(
        processor, prepare_multimodal_messages(row["prompt"], images=row["images"]), row["images"]
    )
    config = AutoConfig.from_pretrained(tiny_model("gemma4"))
    ids = torch.tensor([encoded.input_ids])
    inputs = family.model_inputs(config, ids, torch.ones_like(ids), [encoded.image_inputs])
    assert inputs["pixel_values"].shape[:2] == inputs["image_position_ids"].shape[:2]  # [images, patches]
    assert inputs["mm_token_type_ids"].sum() == (ids == config.image_token_id).sum() > 0
