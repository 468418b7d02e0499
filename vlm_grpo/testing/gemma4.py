"""Tiny Gemma 4 (vision tower + Gemma 4 text tower, no audio tower), built offline.

It carries the published chat template (`gemma4_v5.jinja`, the current revision of `google/gemma-4-E2B-it`'s, as TRL
1.16 ships and recognises it for tool-call parsing): turns `<|turn>{role}\n ... <turn|>`, "assistant" spelled
"model", tool declarations in the system turn (`<|tool>...<tool|>`), calls `<|tool_call>call:NAME{...}<tool_call|>`
closed by `<|tool_response>`, tool results `<|tool_response>response:NAME{...}<tool_response|>` followed by the
tool's images within the same model turn. Each image part is written `<|image|>`, which `Gemma4Processor` expands to
`<|image>` + `<|image|>` * soft tokens + `<image|>`. The tokenizer is a byte-level BPE (every text decodes back
exactly, as tool calls need) with Gemma 4's control tokens as special tokens. Audio tokens are in the vocabulary (so
that the trainer can keep them out of completions) but the model has no audio tower; videos go through the vision
tower frame by frame.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import (
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessor,
    Gemma4Processor,
    Gemma4VideoProcessor,
)

from ..models.gemma4 import READS_VIDEO
from ._common import TAG_TOKENS, BuildOptions, check_sizes, save_tiny, token_id
from .expectations import TinyFamily
from .qwen import byte_level_tokenizer


def gemma4_chat_template() -> str:
    """The published Gemma 4 template, as TRL 1.16 ships it (`trl.chat_template_utils`)."""
    from trl.chat_template_utils import gemma4_v5_chat_template as template

    return template


# Order gives the published low ids: <pad>=0, <eos>=1, <bos>=2, <unk>=3, <mask>=4.
GEMMA4_SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|channel>",
    "<channel|>",
    "<|think|>",
]

GEMMA4_NAMED_TOKENS = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    # names read by Gemma4Processor
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
}

PATCH_SIZE = 4
POOLING = 3
MAX_SOFT_TOKENS = 70  # the smallest budget Gemma 4's processors accept
VISION_WIDTH = 32
VISION_HEADS = 2


def build_gemma4(out_dir: str | os.PathLike, **options: Any) -> str:
    """Build and save a tiny `gemma4` model with its processor.

    The last text layer uses full attention, the others sliding-window attention (window 4096, wider than any test
    prompt). `image_size` is unused: the processor resizes every image (aspect kept) to at most 70 soft tokens of
    3x3 patches of 4 pixels.

    Args:
        out_dir (`str | os.PathLike`): output directory.
        **options (`Any`): the fields of `BuildOptions`.

    Returns:
        `str`: `str(out_dir)`.
    """
    o = BuildOptions(**options)
    hidden_size, num_hidden_layers = o.hidden_size, o.num_hidden_layers
    head_dim = check_sizes(hidden_size, num_hidden_layers)
    chat_template = gemma4_chat_template()
    tokenizer = byte_level_tokenizer(
        o.words, o.base_words, TAG_TOKENS, chat_template, GEMMA4_SPECIAL_TOKENS, GEMMA4_NAMED_TOKENS
    )
    ids = {token: token_id(tokenizer, token) for token in GEMMA4_SPECIAL_TOKENS}
    pad_id, eos_id, bos_id, eot_id = ids["<pad>"], ids["<eos>"], ids["<bos>"], ids["<turn|>"]

    sizes = {"patch_size": PATCH_SIZE, "pooling_kernel_size": POOLING, "max_soft_tokens": MAX_SOFT_TOKENS}
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**sizes),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(**sizes),  # the published 32 frames (cleared by video_fps)
        chat_template=chat_template,
        image_seq_length=MAX_SOFT_TOKENS,
    )

    layer_types = ["sliding_attention"] * (num_hidden_layers - 1) + ["full_attention"]
    config = Gemma4Config(
        text_config={
            "vocab_size": len(tokenizer),
            "vocab_size_per_layer_input": len(tokenizer),
            "hidden_size_per_layer_input": 8,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "global_head_dim": head_dim,
            "max_position_embeddings": 4096,
            "sliding_window": 4096,
            "layer_types": layer_types,
            "use_bidirectional_attention": "vision",
            "pad_token_id": pad_id,
            "eos_token_id": [eos_id, eot_id],
            "bos_token_id": bos_id,
        },
        vision_config={
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": VISION_HEADS,
            "num_key_value_heads": VISION_HEADS,
            "head_dim": VISION_WIDTH // VISION_HEADS,
            "patch_size": PATCH_SIZE,
            "pooling_kernel_size": POOLING,
            "position_embedding_size": 1024,
            "default_output_length": MAX_SOFT_TOKENS,  # soft tokens per image, as the published configs (vLLM reads it)
        },
        audio_config=None,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
        tie_word_embeddings=True,
    )
    # gemma-4-*-it: generation stops at <eos>, at the end of a turn, and where a tool call hands over to its result
    return save_tiny(
        out_dir, Gemma4ForConditionalGeneration, config, processor, o,
        eos_token_ids=[eos_id, eot_id, ids["<|tool_response>"]],
        pad_token_id=pad_id, bos_token_id=bos_id,
    )  # fmt: skip


GEMMA4 = TinyFamily(
    name="gemma4",
    build=build_gemma4,
    title="Gemma 4",
    architecture="Gemma4ForConditionalGeneration",
    image_token="<|image|>",
    image_rule="fixed",
    bidirectional_images=True,
    checkpoints=("gemma-4",),
    fixed_image_tokens=64,  # the processor's budget of 70 soft tokens, as 8 x 8 pooled patches of a square image
    byte_level=True,
    tool_calls=True,
    stock_tool_images=False,
    refused_inputs=("audio",) if READS_VIDEO else ("audio", "video"),  # video with transformers >= 5.19
    placeholder_tokens=frozenset(
        {"<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"}
    ),
)
