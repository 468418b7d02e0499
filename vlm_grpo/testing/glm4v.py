"""Tiny GLM-4.1V (`glm4v`), GLM-4.6V (`glm46v`, the same layers under its own classes) and GLM-4.5V
(`glm4v_moe`: expert MLPs after a first dense layer), offline.

GLM's chat layout: `[gMASK]<sop>` then `<|{role}|>\\n{content}` per message and `<|assistant|>\\n` to answer;
the model ends its turn by starting the next one (`<|user|>`). Each image part is written
`<|begin_of_image|><|image|><|end_of_image|>`, and `Glm4vProcessor` repeats `<|image|>` once per merged
2x2 block of 14-pixel patches, as Qwen2-VL does.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from transformers import (
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessor,
    Glm4vMoeConfig,
    Glm4vMoeForConditionalGeneration,
    Glm4vProcessor,
    Glm4vVideoProcessor,
    Glm46VConfig,
    Glm46VForConditionalGeneration,
    Glm46VProcessor,
)

from ._common import BuildOptions, check_sizes, round_to_multiple, save_tiny
from .expectations import TinyFamily

GLM4V_CHAT_TEMPLATE = (
    "{{ '[gMASK]<sop>' }}"
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{ '<|begin_of_image|><|image|><|end_of_image|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{ '<|begin_of_video|><|video|><|end_of_video|>' }}"
    "{%- elif 'text' in part -%}"
    "{{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|assistant|>\\n' }}"
    "{%- endif -%}"
)

GLM4V_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
]

GLM4V_NAMED_TOKENS = {
    "eos_token": "<|user|>",
    "pad_token": "<|endoftext|>",
    "image_token": "<|image|>",
    "video_token": "<|video|>",
}

NUM_HEADS = 4
NUM_KV_HEADS = 2
VISION_WIDTH = 32
VISION_HEADS = 2
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 14, 2, 2


def build_glm4v(out_dir: str | os.PathLike, family: str = "glm4v", **options: Any) -> str:
    """Build and save a tiny `glm4v`, `glm46v` or `glm4v_moe` model with its processor.

    Half of each text head rotates, as in GLM-4.1V. Images are resized to at most about `image_size**2` pixels (a
    multiple of 28 a side): 4 visual tokens at the default.

    Args:
        out_dir (`str | os.PathLike`): output directory.
        family (`str`, *optional*, defaults to `"glm4v"`): `"glm4v"`, `"glm46v"` or `"glm4v_moe"` (layer 0
            dense, the others 4 routed experts, 2 per token, plus a shared expert, as GLM-4.5V's first-dense layout).
        **options (`Any`): the fields of `BuildOptions`.

    Returns:
        `str`: `str(out_dir)`.
    """
    classes = {
        "glm4v": (Glm4vConfig, Glm4vForConditionalGeneration, Glm4vProcessor),
        "glm46v": (Glm46VConfig, Glm46VForConditionalGeneration, Glm46VProcessor),
        "glm4v_moe": (Glm4vMoeConfig, Glm4vMoeForConditionalGeneration, Glm4vProcessor),
    }
    if family not in classes:
        raise ValueError(f"build_glm4v builds {', '.join(classes)}, not {family!r}")
    config_cls, model_cls, processor_cls = classes[family]
    o = BuildOptions(**options)
    hidden_size, num_hidden_layers = o.hidden_size, o.num_hidden_layers
    head_dim = check_sizes(hidden_size, num_hidden_layers, NUM_HEADS)
    factor = PATCH_SIZE * MERGE_SIZE
    side = round_to_multiple(o.image_size, factor)
    tokenizer, ids = o.tokenizer(GLM4V_SPECIAL_TOKENS, GLM4V_NAMED_TOKENS, GLM4V_CHAT_TEMPLATE)
    pad_id, eos_id = ids["<|endoftext|>"], ids["<|user|>"]

    # GLM-4.1V's resize budget counts the pixels of both frames of a temporal patch pair.
    image_kwargs: dict[str, Any] = {
        "size": {"shortest_edge": factor * factor, "longest_edge": TEMPORAL_PATCH_SIZE * side * side},
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
    }
    processor = processor_cls(
        image_processor=Glm4vImageProcessor(**image_kwargs),
        tokenizer=tokenizer,
        video_processor=Glm4vVideoProcessor(**dict(image_kwargs, size={"shortest_edge": factor * factor,
                                                                        "longest_edge": 8 * side * side})),
        chat_template=GLM4V_CHAT_TEMPLATE,
    )  # fmt: skip

    rotary_half = head_dim // 4  # half of each head rotates: head_dim / 2 dims, head_dim / 4 frequencies
    experts = {}
    if family == "glm4v_moe":
        experts = {
            "moe_intermediate_size": hidden_size,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "norm_topk_prob": True,
            "use_qk_norm": False,  # as the published config.json (vLLM reads it)
        }
    prefix = "glm4v_moe" if family == "glm4v_moe" else "glm4v"
    config = config_cls(
        text_config={
            **experts,
            "model_type": f"{prefix}_text",
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": NUM_HEADS,
            "num_key_value_heads": NUM_KV_HEADS,
            "max_position_embeddings": 4096,
            # as the published config.json (vLLM reads both; transformers' attention always has q/k/v biases)
            "head_dim": head_dim,
            "attention_bias": True,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [rotary_half - 2 * (rotary_half // 4), rotary_half // 4, rotary_half // 4],
            },
            "pad_token_id": pad_id,
            "eos_token_id": [eos_id, pad_id],
        },
        vision_config={
            "model_type": f"{prefix}_vision",
            "depth": num_hidden_layers,
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_heads": VISION_HEADS,
            "image_size": side,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": TEMPORAL_PATCH_SIZE,
            "out_hidden_size": hidden_size,
        },
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )
    return save_tiny(
        out_dir, model_cls, config, processor, o, eos_token_ids=[eos_id, pad_id], pad_token_id=pad_id
    )


def _glm_family(name: str, title: str, architecture: str, checkpoint: str, **expectations: Any) -> TinyFamily:
    """The record of one of the GLM shapes, which share tokens and layout."""
    return TinyFamily(
        name=name,
        build=partial(build_glm4v, family=name),
        title=title,
        architecture=architecture,
        image_token="<|image|>",
        image_rule="grid",
        checkpoints=(checkpoint,),
        tied_embeddings=False,
        mrope=True,
        **expectations,
    )


GLM4V = _glm_family("glm4v", "GLM-4.1V", "Glm4vForConditionalGeneration", "GLM-4.1V")
GLM46V = _glm_family("glm46v", "GLM-4.6V", "Glm46VForConditionalGeneration", "GLM-4.6V")
GLM4V_MOE = _glm_family("glm4v_moe", "GLM-4.5V", "Glm4vMoeForConditionalGeneration", "GLM-4.5V", moe=True)
