"""Tiny InternVL (transformers-native `internvl`, Qwen2 text tower) with a word-level tokenizer, built offline."""

from __future__ import annotations

import os
from typing import Any

from transformers import (
    GotOcr2ImageProcessor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    InternVLVideoProcessor,
)

from ._common import BuildOptions, check_sizes, round_to_multiple, save_tiny
from .expectations import ChatLayout, TinyFamily
from .qwen import QWEN_CHAT_TEMPLATE

# Qwen chat layout; each image part is rendered as "<IMG_CONTEXT>\n", which InternVLProcessor expands to
# "<img>" + "<IMG_CONTEXT>" * (image_seq_length * num_patches) + "</img>"; a video part is "<video>\n".
INTERNVL_CHAT_TEMPLATE = QWEN_CHAT_TEMPLATE.replace(
    "<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>\\n"
).replace("<|vision_start|><|video_pad|><|vision_end|>", "<video>\\n")

INTERNVL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<video>",
]

INTERNVL_NAMED_TOKENS = {
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    # names read by InternVLProcessor
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}

PATCH_SIZE = 14
DOWNSAMPLE_RATIO = 0.5
VISION_WIDTH = 32
VISION_HEADS = 2


def build_internvl(out_dir: str | os.PathLike, **options: Any) -> str:
    """Build and save a tiny `internvl` model with its processor.

    `image_size` is the tile size of the vision tower, rounded to a multiple of `2 * patch_size` (28); each tile
    gives `(image_size / 14) ** 2 / 4` tokens (4 at 56). Images are cut into at most 2 tiles, plus a thumbnail
    tile whenever there is more than one.

    Args:
        out_dir (`str | os.PathLike`): output directory.
        **options (`Any`): the fields of `BuildOptions`.

    Returns:
        `str`: `str(out_dir)`.
    """
    o = BuildOptions(**options)
    hidden_size, num_hidden_layers = o.hidden_size, o.num_hidden_layers
    check_sizes(hidden_size, num_hidden_layers)
    side = round_to_multiple(o.image_size, int(PATCH_SIZE / DOWNSAMPLE_RATIO))
    image_seq_length = int((side // PATCH_SIZE) ** 2 * DOWNSAMPLE_RATIO**2)

    tokenizer, ids = o.tokenizer(INTERNVL_SPECIAL_TOKENS, INTERNVL_NAMED_TOKENS, INTERNVL_CHAT_TEMPLATE)
    pad_id, eos_id = ids["<|endoftext|>"], ids["<|im_end|>"]

    image_processor = GotOcr2ImageProcessor(
        size={"height": side, "width": side}, crop_to_patches=True, min_patches=1, max_patches=2
    )
    video_processor = InternVLVideoProcessor(size={"height": side, "width": side})
    processor = InternVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        image_seq_length=image_seq_length,
        chat_template=INTERNVL_CHAT_TEMPLATE,
    )

    config = InternVLConfig(
        vision_config={
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": VISION_HEADS,
            "attention_bias": True,
            "image_size": side,
            "patch_size": PATCH_SIZE,
            "use_mean_pooling": True,
        },
        text_config={
            "model_type": "qwen2",
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "bos_token_id": pad_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "tie_word_embeddings": False,
        },
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=image_seq_length,
        downsample_ratio=DOWNSAMPLE_RATIO,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    return save_tiny(
        out_dir, InternVLForConditionalGeneration, config, processor, o, eos_token_ids=[eos_id, pad_id],
        pad_token_id=pad_id,
    )  # fmt: skip


INTERNVL = TinyFamily(
    name="internvl",
    build=build_internvl,
    title="InternVL",
    architecture="InternVLForConditionalGeneration",
    image_token="<IMG_CONTEXT>",
    image_rule="tiles",
    checkpoints=("InternVL",),
    core=True,
    tied_embeddings=False,
    layout=ChatLayout(
        turn_open="<|im_start|>{role}\n",
        turn_end="<|im_end|>",
        image="<IMG_CONTEXT>\n",
        vision_prefixes=("model.vision_tower.", "model.multi_modal_projector."),
        config_tokens={"image_token_id": "<IMG_CONTEXT>"},
    ),
)
