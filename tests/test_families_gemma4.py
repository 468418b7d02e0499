"""A family that refuses some inputs (Gemma 4): audio entries (and video entries before transformers 5.19) are refused
with one line; their tokens are never sampled."""

from __future__ import annotations

import re

import pytest
from conftest import color_rows

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family
from vlm_grpo.testing import a_family_with, tiny_family

FAMILY = tiny_family(a_family_with(refused_inputs=True))


@pytest.fixture(scope="module")
def images_only(tiny_model):
    path = tiny_model(FAMILY.name)
    family = get_model_family(path)
    return family, family.load_processor(path)


@pytest.mark.parametrize("kind", FAMILY.refused_inputs)
def test_audio_and_video_entries_are_refused(kind, images_only):
    family, processor = images_only
    messages = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "What is it ?"}]}]
    with pytest.raises(
        VLMGRPOError,
        match=rf"^{re.escape(FAMILY.title)} {kind} inputs are not supported .*only images(, videos)? and text",
    ) as info:
        family.encode_prompt(processor, messages, None)
    assert "\n" not in str(info.value)


def test_audio_and_video_tokens_are_placeholders(images_only, tiny_model):
    from transformers import AutoConfig

    family, processor = images_only
    placeholders = family.placeholder_token_ids(
        processor, AutoConfig.from_pretrained(tiny_model(FAMILY.name))
    )
    tokens = set(processor.tokenizer.convert_ids_to_tokens(placeholders))
    assert FAMILY.placeholder_tokens and FAMILY.placeholder_tokens <= tokens


def test_image_prompt_marks_image_tokens_for_bidirectional_attention(images_only, tiny_model):
    import torch
    from transformers import AutoConfig
    from trl.data_utils import prepare_multimodal_messages

    family, processor = images_only
    row = color_rows(1, images_per_prompt=2)[0]
    encoded = family.encode_prompt(
        processor, prepare_multimodal_messages(row["prompt"], images=row["images"]), row["images"]
    )
    config = AutoConfig.from_pretrained(tiny_model(FAMILY.name))
    ids = torch.tensor([encoded.input_ids])
    inputs = family.model_inputs(config, ids, torch.ones_like(ids), [encoded.image_inputs])
    assert inputs["pixel_values"].shape[:2] == inputs["image_position_ids"].shape[:2]  # [images, patches]
    assert inputs["mm_token_type_ids"].sum() == (ids == config.image_token_id).sum() > 0


def test_videos_are_read_with_transformers_5_19_or_later(images_only):
    """Gemma 4's video frames share one axis from transformers 5.19 on (`tests/test_video.py` trains on them);
    before, a video is refused in one line naming the version needed and the one installed."""
    import transformers
    from packaging.version import Version

    family, _ = images_only
    assert family.reads_video == (Version(transformers.__version__) >= Version("5.19"))
    reason = family.no_video_reason()
    assert f"transformers >= 5.19 ({transformers.__version__} is installed" in reason and "\n" not in reason
