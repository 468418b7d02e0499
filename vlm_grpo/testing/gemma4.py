"""Tiny Gemma 4 (vision tower + Gemma 4 text tower, no audio tower) with a word-level tokenizer, built offline.

The layout is Gemma 3's (`<start_of_turn>`/`<end_of_turn>`, "assistant" spelled "model") with Gemma 4's image
tokens: each image part is written `<|image|>`, which `Gemma4Processor` expands to
`<|image>` + `<|image|>` * soft tokens + `<image|>`. Audio and video tokens are in the vocabulary (so that the
trainer can keep them out of completions) but the model has no audio tower.
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

from ._common import BuildOptions, check_sizes, save_tiny
from .expectations import TinyFamily
from .gemma3 import GEMMA3_CHAT_TEMPLATE

GEMMA4_CHAT_TEMPLATE = GEMMA3_CHAT_TEMPLATE.replace("<start_of_image>", "<|image|>")

# Order gives the real low ids: <pad>=0, <eos>=1, <bos>=2.
GEMMA4_SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
]

GEMMA4_NAMED_TOKENS = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
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
    tokenizer, ids = o.tokenizer(GEMMA4_SPECIAL_TOKENS, GEMMA4_NAMED_TOKENS, GEMMA4_CHAT_TEMPLATE)
    pad_id, eos_id, bos_id, eot_id = ids["<pad>"], ids["<eos>"], ids["<bos>"], ids["<end_of_turn>"]

    sizes = {"patch_size": PATCH_SIZE, "pooling_kernel_size": POOLING, "max_soft_tokens": MAX_SOFT_TOKENS}
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**sizes),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(**sizes, num_frames=2),
        chat_template=GEMMA4_CHAT_TEMPLATE,
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
    return save_tiny(
        out_dir, Gemma4ForConditionalGeneration, config, processor, o, eos_token_ids=[eot_id, eos_id],
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
    refused_inputs=("audio", "video"),
    placeholder_tokens=frozenset(
        {"<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>", "<|audio>", "<audio|>"}
    ),
)
