"""Attention among an image's tokens: bidirectional in Gemma 3 and 4, causal elsewhere, and what vLLM's CPU backend
computes instead (causal for every family, `vlm_grpo.rollout.vllm.payload.warn_vllm_cpu_image_mask`)."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import color_rows
from transformers import AutoConfig
from trl.data_utils import prepare_multimodal_messages

from vlm_grpo.data.rows import load_rows
from vlm_grpo.models import SUPPORTED_MODEL_TYPES, get_model_family
from vlm_grpo.rollout.vllm.payload import warn_vllm_cpu_image_mask
from vlm_grpo.testing import TINY_FAMILIES, tiny_family

FAMILIES = [name for name in TINY_FAMILIES if tiny_family(name).model_type in SUPPORTED_MODEL_TYPES]


def logits_of(family, model, processor, row: dict, causal_images: bool) -> torch.Tensor:
    """The model's logits `[L, V]` for the row's prompt."""
    (row,) = load_rows([row])
    messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
    encoded = family.encode_prompt(processor, messages, row["images"])
    ids = torch.tensor([encoded.input_ids])
    inputs = family.model_inputs(
        model.config, ids, torch.ones_like(ids), [encoded.image_inputs], causal_images=causal_images
    )
    with torch.no_grad():
        return model(**inputs).logits[0]


@pytest.mark.parametrize("name", FAMILIES)
def test_causal_images_change_only_bidirectional_families(name, tiny_model):
    """`causal_images` changes the logits of a prompt with images exactly for the families that attend
    bidirectionally among an image's tokens; a text-only prompt is unchanged for every family."""
    path = tiny_model(name)
    family = get_model_family(path)
    config = AutoConfig.from_pretrained(path)
    assert family.bidirectional_image_attention(config) == tiny_family(name).bidirectional_images
    model = family.model_class().from_pretrained(path).eval()
    processor = family.load_processor(path)
    two_images, text_only = color_rows(1, images_per_prompt=2)[0], color_rows(2, text_only_every=2)[1]
    own, causal = (logits_of(family, model, processor, two_images, c) for c in (False, True))
    if tiny_family(name).bidirectional_images:
        assert (own - causal).abs().max() > 1e-3
    else:
        torch.testing.assert_close(own, causal, rtol=0, atol=0)
    own, causal = (logits_of(family, model, processor, text_only, c) for c in (False, True))
    torch.testing.assert_close(own, causal, rtol=0, atol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_vllm_cpu_image_mask_warning(name, caplog):
    """One warning on a CPU for the families whose images attend bidirectionally; none on a GPU, none for others."""
    config = AutoConfig.for_model(tiny_family(name).model_type)
    family = get_model_family(config)
    bidirectional = family.bidirectional_image_attention(config)
    with caplog.at_level(logging.WARNING, logger="vlm_grpo.rollout.vllm.payload"):
        assert warn_vllm_cpu_image_mask(family, config, "cuda:0") is False
        assert warn_vllm_cpu_image_mask(family, config, "cpu") is bidirectional
    lines = [r.getMessage() for r in caplog.records]
    if bidirectional:
        (line,) = lines
        assert "\n" not in line and f"{family.model_type} attends bidirectionally" in line
    else:
        assert lines == []
