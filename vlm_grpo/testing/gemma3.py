"""Tiny Gemma 3 (SigLIP vision tower + Gemma 3 text tower) with a word-level tokenizer, built offline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

from ._common import BuildOptions, check_sizes, round_to_multiple, save_tiny
from .expectations import ChatLayout, TinyFamily

# Gemma 3 chat layout:
#   <bos><start_of_turn>user\n{system}\n\n{content}<end_of_turn>\n<start_of_turn>model\n{content}<end_of_turn>\n
#   ... [<start_of_turn>model\n]
# A system message is folded into the first turn; "assistant" is spelled "model"; text is trimmed; each image
# part is "<start_of_image>", which Gemma3Processor expands to
# "\n\n<start_of_image>" + "<image_soft_token>" * image_seq_length + "<end_of_image>\n\n".
GEMMA3_CHAT_TEMPLATE = (
    "{{ '<bos>' }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set system_text = messages[0]['content'] -%}"
    "{%- else -%}"
    "{%- set system_text = messages[0]['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join(' ') -%}"
    "{%- endif -%}"
    "{%- set first_prefix = system_text | trim + '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_prefix = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif 'text' in part -%}"
    "{{ part['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\\n' }}"
    "{%- endif -%}"
)

# Order gives the real low ids: <pad>=0, <eos>=1, <bos>=2.
GEMMA3_SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]

GEMMA3_NAMED_TOKENS = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    # names read by Gemma3Processor
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}

GEMMA3_SAMPLING = {"cache_implementation": "hybrid", "do_sample": True, "top_k": 64, "top_p": 0.95}
"""The sampling fields of gemma-3-*-it's generation_config.json."""

PATCH_SIZE = 14
VISION_WIDTH = 32
VISION_HEADS = 2


def build_gemma3(out_dir: str | os.PathLike, **options: Any) -> str:
    """Build and save a tiny `gemma3` model with its processor.

    The last text layer uses full attention, the others sliding-window attention (window 4096, wider than any test
    prompt). `image_size` is the SigLIP input size, rounded to a multiple of `2 * patch_size` (28); every image
    is resized to it and gives `(image_size / 28) ** 2` tokens (4 at 56) after the 2x2 average pooling of the
    projector.

    Args:
        out_dir (`str | os.PathLike`): output directory.
        **options (`Any`): the fields of `BuildOptions`.

    Returns:
        `str`: `str(out_dir)`.
    """
    o = BuildOptions(**options)
    hidden_size, num_hidden_layers = o.hidden_size, o.num_hidden_layers
    head_dim = check_sizes(hidden_size, num_hidden_layers)
    side = round_to_multiple(o.image_size, 2 * PATCH_SIZE)
    mm_tokens_per_image = (side // (2 * PATCH_SIZE)) ** 2

    tokenizer, ids = o.tokenizer(GEMMA3_SPECIAL_TOKENS, GEMMA3_NAMED_TOKENS, GEMMA3_CHAT_TEMPLATE)
    pad_id, eos_id, bos_id, eot_id = ids["<pad>"], ids["<eos>"], ids["<bos>"], ids["<end_of_turn>"]

    image_processor = Gemma3ImageProcessor(size={"height": side, "width": side}, do_pan_and_scan=False)
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=mm_tokens_per_image,
    )

    layer_types = ["sliding_attention"] * (num_hidden_layers - 1) + ["full_attention"]
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,
            "max_position_embeddings": 4096,
            "sliding_window": 4096,
            "layer_types": layer_types,
            "pad_token_id": pad_id,
            "eos_token_id": [eos_id, eot_id],
            "bos_token_id": bos_id,
        },
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": VISION_HEADS,
            "image_size": side,
            "patch_size": PATCH_SIZE,
            "vision_use_head": False,
        },
        mm_tokens_per_image=mm_tokens_per_image,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
        tie_word_embeddings=True,
    )
    # gemma-3-*-it: eos [<eos>, <end_of_turn>], and the sampling fields of its generation_config.json
    save_tiny(
        out_dir, Gemma3ForConditionalGeneration, config, processor, o, eos_token_ids=[eos_id, eot_id],
        pad_token_id=pad_id, bos_token_id=bos_id, sampling=GEMMA3_SAMPLING, init=_random_projection,
    )  # fmt: skip
    _hub_layout(Path(out_dir) / "model.safetensors")
    return str(out_dir)


def _random_projection(model: Gemma3ForConditionalGeneration) -> None:
    """Gemma 3 initialises the vision->text projection to zeros, which would cut the vision tower off from the loss;
    give it small random values instead."""
    model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.02)


def _hub_layout(weights: Path) -> None:
    """Rename the SigLIP tower's weights to the published checkpoints' layout, `vision_tower.vision_model.*`.

    transformers (>= 5) saves them as `vision_tower.*` and maps the published names on load; vLLM reads only the
    published ones.
    """
    tensors = load_file(weights)
    renamed = {
        f"vision_tower.vision_model.{k.removeprefix('vision_tower.')}"
        if k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.")
        else k: v
        for k, v in tensors.items()
    }
    save_file(renamed, weights, metadata={"format": "pt"})


GEMMA3 = TinyFamily(
    name="gemma3",
    build=build_gemma3,
    title="Gemma 3",
    architecture="Gemma3ForConditionalGeneration",
    image_token="<image_soft_token>",
    image_rule="fixed",
    bidirectional_images=True,
    checkpoints=("gemma-3",),
    core=True,
    sampling=GEMMA3_SAMPLING,
    # no unused parameters: the SigLIP tower is built without its pooling head (`vision_use_head=False`)
    layout=ChatLayout(
        turn_open="<start_of_turn>{role}\n",
        turn_end="<end_of_turn>",
        image="<start_of_image>",
        vision_prefixes=("model.vision_tower.", "model.multi_modal_projector."),
        bos="<bos>",
        assistant_role="model",
        system_turn=False,
        config_tokens={
            "image_token_index": "<image_soft_token>",
            "boi_token_index": "<start_of_image>",
            "eoi_token_index": "<end_of_image>",
        },
        video=False,
    ),
)
