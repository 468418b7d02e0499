"""Tiny Qwen3-VL MoE, Qwen3.5 and Qwen3.5 MoE models, built offline.

All three take Qwen3-VL's processor (patch 16, mean = std = 0.5) and a byte-level BPE with the tool-call tags of the
published tokenizers. Qwen3-VL MoE carries the published Qwen3-VL template (tool calls as JSON); Qwen3.5 and Qwen3.5
MoE the published Qwen3.5 template of the 4B and larger checkpoints (thinking on by default, tool calls as XML).
Qwen3-VL MoE replaces the MLP of
every text layer by a few tiny experts; Qwen3.5 alternates Gated DeltaNet linear-attention layers with full
attention (the last layer of the tiny model is full attention), and Qwen3.5 MoE adds experts and a shared expert.

transformers loads every `qwen3_5` tokenizer as `Qwen3_5Tokenizer`, which rebuilds a byte-level BPE from the
saved vocabulary and merges: the Qwen3.5 models get a byte-level BPE (`byte_level_tokenizer`) whose merges make
every vocabulary word one token, with or without its leading space (`"Ġcolor"`), instead of a word-level one.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from transformers import (
    Qwen2VLImageProcessor,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from ._common import TAG_TOKENS, BuildOptions, check_sizes, round_to_multiple, save_tiny, token_id
from .expectations import TinyFamily
from .qwen import (
    QWEN3_5_LAYOUT,
    QWEN3_LAYOUT,
    QWEN_SPECIAL_TOKENS,
    QWEN_TOOL_TOKENS,
    _mrope_section,
    byte_level_tokenizer,
    qwen3_5_chat_template,
    qwen3_vl_chat_template,
    qwen_family,
)

QWEN_MOE_FAMILIES: tuple[str, ...] = ("qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")

NUM_HEADS = 4
NUM_KV_HEADS = 2
VISION_WIDTH = 32
VISION_HEADS = 2
NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 16, 2, 2


def _processor(tokenizer: Any, side: int, chat_template: str) -> Qwen3VLProcessor:
    """Qwen3-VL's processor with images of at most `side**2` pixels (and about 8 such frames per video)."""
    factor = PATCH_SIZE * MERGE_SIZE
    image_kwargs: dict[str, Any] = {
        "size": {"shortest_edge": factor * factor, "longest_edge": side * side},
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    video_kwargs = dict(
        image_kwargs,
        size={"shortest_edge": factor * factor, "longest_edge": 8 * side * side},
        cap_pixels_per_frame=True,
    )
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**image_kwargs),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**video_kwargs),
        chat_template=chat_template,
    )


def build_qwen_moe(family: str, out_dir: str | os.PathLike, **options: Any) -> str:
    """Build and save a tiny `qwen3_vl_moe`, `qwen3_5` or `qwen3_5_moe` model with its processor.

    MoE layers have 4 experts of width `hidden_size / 2`, 2 per token; Qwen3.5 layers are linear attention except
    every fourth and the last. Images are resized to at most about `image_size**2` pixels, rounded to a multiple
    of 32 (56 -> 64: 4 visual tokens).

    Args:
        family (`str`): one of `QWEN_MOE_FAMILIES`.
        out_dir (`str | os.PathLike`): output directory.
        **options (`Any`): the fields of `BuildOptions`.

    Returns:
        `str`: `str(out_dir)`.
    """
    if family not in QWEN_MOE_FAMILIES:
        raise ValueError(f"build_qwen_moe builds {', '.join(QWEN_MOE_FAMILIES)}, not {family!r}")
    o = BuildOptions(**options)
    hidden_size, num_hidden_layers = o.hidden_size, o.num_hidden_layers
    head_dim = check_sizes(hidden_size, num_hidden_layers, NUM_HEADS)
    side = round_to_multiple(o.image_size, PATCH_SIZE * MERGE_SIZE)

    is_hybrid = family.startswith("qwen3_5")
    # the published template and a byte-level BPE, so that tool calls render and parse as published
    chat_template = qwen3_5_chat_template() if is_hybrid else qwen3_vl_chat_template()
    tokenizer = byte_level_tokenizer(
        o.words, o.base_words, (*TAG_TOKENS, *QWEN_TOOL_TOKENS), chat_template=chat_template
    )
    ids = {tok: token_id(tokenizer, tok) for tok in QWEN_SPECIAL_TOKENS}
    pad_id, eos_id = ids["<|endoftext|>"], ids["<|im_end|>"]
    processor = _processor(tokenizer, side, chat_template)

    # Qwen3.5 rotates only part of each head (a quarter in the real models; half here, so that M-RoPE keeps
    # one frequency per axis at head_dim 16).
    rotary_dim = head_dim // 2 if is_hybrid else head_dim
    text_config: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": _mrope_section(rotary_dim, interleaved=True),
            "mrope_interleaved": True,
        },
        "pad_token_id": pad_id,
        "tie_word_embeddings": False,
    }
    if family != "qwen3_5":
        text_config.update(
            num_experts=NUM_EXPERTS,
            num_experts_per_tok=EXPERTS_PER_TOKEN,
            # a quarter for qwen3_vl_moe: its fused gate_up_proj [E, 2 * moe_intermediate, hidden] must not be square,
            # or transformers cannot tell the published layout (saved below) from its own
            moe_intermediate_size=hidden_size // (4 if family == "qwen3_vl_moe" else 2),
            output_router_logits=False,  # saved explicitly: transformers 5.17 leaves it out by default
        )
    if family == "qwen3_vl_moe":
        text_config["norm_topk_prob"] = True  # as the published config.json (vLLM reads it)
    if is_hybrid:
        text_config["rope_parameters"]["partial_rotary_factor"] = rotary_dim / head_dim
        text_config.update(
            partial_rotary_factor=rotary_dim / head_dim,
            layer_types=[
                "full_attention" if (i + 1) % 4 == 0 or i == num_hidden_layers - 1 else "linear_attention"
                for i in range(num_hidden_layers)
            ],
            linear_conv_kernel_dim=4,
            linear_num_key_heads=NUM_KV_HEADS,
            linear_num_value_heads=NUM_HEADS,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
        )
    if family == "qwen3_5_moe":
        text_config["shared_expert_intermediate_size"] = hidden_size // 2
    vision_config: dict[str, Any] = {
        "depth": num_hidden_layers,
        "num_heads": VISION_HEADS,
        "in_channels": 3,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "hidden_size": VISION_WIDTH,
        "intermediate_size": 2 * VISION_WIDTH,
        "out_hidden_size": hidden_size,
        "num_position_embeddings": (side // PATCH_SIZE) ** 2,
    }
    if family == "qwen3_vl_moe":
        # deepstack: features of the early vision blocks are added to the first text layers
        vision_config["deepstack_visual_indexes"] = list(range(max(1, num_hidden_layers - 1)))
    token_ids = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    classes = {
        "qwen3_vl_moe": (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration),
        "qwen3_5": (Qwen3_5Config, Qwen3_5ForConditionalGeneration),
        "qwen3_5_moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration),
    }
    config_cls, model_cls = classes[family]
    config = config_cls(text_config=text_config, vision_config=vision_config, **token_ids)
    save_tiny(out_dir, model_cls, config, processor, o, eos_token_ids=[eos_id, pad_id], pad_token_id=pad_id)
    if family == "qwen3_vl_moe":
        _published_expert_layout(Path(out_dir) / "model.safetensors")
    return str(out_dir)


def _published_expert_layout(weights: Path) -> None:
    """Store Qwen3-VL-MoE's fused expert weights as the published checkpoints do, `[E, in, out]`.

    transformers (>= 5) holds and saves them `[E, out, in]` and transposes the published layout on load; vLLM reads
    only the published one.
    """
    tensors = load_file(weights)
    for name in tensors:
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})


def _qwen_moe(name: str, title: str, architecture: str, **expectations: Any) -> TinyFamily:
    layout = QWEN3_5_LAYOUT if name.startswith("qwen3_5") else QWEN3_LAYOUT
    return qwen_family(
        name, title, architecture, partial(build_qwen_moe, name), tied_embeddings=False, layout=layout,
        **expectations,
    )  # fmt: skip


QWEN3_VL_MOE = _qwen_moe(
    "qwen3_vl_moe",
    "Qwen3-VL MoE",
    "Qwen3VLMoeForConditionalGeneration",
    checkpoints=("Qwen3-VL-30B-A3B",),
    moe=True,
    byte_level=True,
    tool_calls=True,
)
QWEN3_5 = _qwen_moe(
    "qwen3_5", "Qwen3.5", "Qwen3_5ForConditionalGeneration", checkpoints=("Qwen3.5-4B",), byte_level=True,
    tool_calls=True,
)  # fmt: skip
QWEN3_5_MOE = _qwen_moe(
    "qwen3_5_moe", "Qwen3.5 MoE", "Qwen3_5MoeForConditionalGeneration", moe=True, byte_level=True, tool_calls=True,
    # Open: in a training step, vLLM 0.31's sampling log-probs of the tiny Qwen3.5-MoE stay further from the
    # trainer's than bfloat16 rounding and routing ties explain (0.59 at most per token, already with the initial
    # weights, on two machines), with every weight loaded. After a sync, one scored completion is within the MoE bound.
    vllm_logprob_gaps=("steps",),
)  # fmt: skip
