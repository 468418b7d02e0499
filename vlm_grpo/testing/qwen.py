"""Tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL models with a word-level tokenizer, built offline."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from ._common import (
    DEFAULT_WORDS,
    TAG_TOKENS,
    UNK_TOKEN,
    BuildOptions,
    check_sizes,
    round_to_multiple,
    save_tiny,
    token_id,
)
from .expectations import ChatLayout, TinyFamily

# Layout of the Qwen chat format:
#   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
# Qwen2-VL and Qwen2.5-VL open with a default system turn ("You are a helpful assistant.") when the messages give
# none; Qwen3-VL does not.
# with each image part rendered as <|vision_start|><|image_pad|><|vision_end|> (the processor then repeats
# <|image_pad|> once per merged visual token) and each video part with <|video_pad|>.
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part -%}"
    "{{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)

QWEN2_CHAT_TEMPLATE = QWEN_CHAT_TEMPLATE.replace(
    "{%- for message in messages -%}",
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}",
)
"""Qwen2-VL's and Qwen2.5-VL's template: the default system turn first when the messages give no system turn."""

# The sampling fields of the published checkpoints' generation_config.json (eos, pad and bos are written from the
# tokenizer: eos [<|im_end|>, <|endoftext|>], pad and bos <|endoftext|>).
QWEN_SAMPLING = {
    "qwen2_vl": {
        "do_sample": True,
        "repetition_penalty": 1.0,
        "temperature": 0.01,
        "top_k": 1,
        "top_p": 0.001,
    },
    "qwen2_5_vl": {"do_sample": True, "repetition_penalty": 1.05, "temperature": 1e-06},
    "qwen3_vl": {"do_sample": True, "top_k": 20, "top_p": 0.8, "temperature": 0.7},
}

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

QWEN_NAMED_TOKENS = {
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}

QWEN_TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""The tool-call tags of the Qwen3 tokenizers: added tokens, not special (they decode with the text)."""


def qwen3_vl_chat_template() -> str:
    """The published Qwen3-VL chat template (tool definitions, tool calls and tool results with images included),
    as TRL 1.16 ships it and recognises it for tool-call parsing (`trl.chat_template_utils`)."""
    from trl.chat_template_utils import qwen3_vl_chat_template as template

    return template


def qwen3_5_chat_template() -> str:
    """The published Qwen3.5 chat template of the 4B and larger checkpoints (thinking on by default: the generation
    prompt opens `<think>`), with tool calls in its XML form, as TRL 1.16 ships it and recognises it for tool-call
    parsing (`trl.chat_template_utils`)."""
    from trl.chat_template_utils import qwen3_5_think_chat_template as template

    return template


# Qwen3.5's pre-tokenizer split (as in `Qwen3_5Tokenizer`): contractions, letters with one leading non-letter,
# single digits, punctuation runs with one leading space, newlines, spaces.
QWEN3_5_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def byte_level_tokenizer(
    words: Sequence[str] | None = None,
    base_words: Sequence[str] = DEFAULT_WORDS,
    added_tokens: Sequence[str] = TAG_TOKENS,
    chat_template: str = QWEN_CHAT_TEMPLATE,
    special_tokens: Sequence[str] = QWEN_SPECIAL_TOKENS,
    named_tokens: Mapping[str, str] = QWEN_NAMED_TOKENS,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE with the published Qwen pipeline in which every vocabulary word is one token (`"red"`,
    `"Ġred"`): every text decodes back exactly (tool calls' JSON included). Other families whose tool calls must
    decode exactly take it with their own special tokens (Gemma 4).

    Args:
        words (`Sequence[str]`, *optional*, defaults to `None`): extra vocabulary words; one holding punctuation
            (`"Coca-Cola"`) is matched whole, like the tags.
        base_words (`Sequence[str]`, defaults to `DEFAULT_WORDS`): the vocabulary before `words`.
        added_tokens (`Sequence[str]`, defaults to `TAG_TOKENS`): tokens matched whole before the split, not special
            (the reasoning and answer tags; the tool-call tags where the published tokenizer has them).
        chat_template (`str`, defaults to `QWEN_CHAT_TEMPLATE`): the template stored on the tokenizer.
        special_tokens (`Sequence[str]`, defaults to `QWEN_SPECIAL_TOKENS`): the control tokens, the first ids, in
            this order; `[UNK]` follows unless `named_tokens` names an `unk_token` among them.
        named_tokens (`Mapping[str, str]`, defaults to `QWEN_NAMED_TOKENS`): named tokens of the tokenizer (see
            `TokenizerSpec`).
    """
    unk_token = named_tokens.get("unk_token", UNK_TOKEN)
    specials = list(dict.fromkeys([*special_tokens, unk_token]))
    vocabulary = list(dict.fromkeys([*base_words, *(words or ())]))
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1_000_000,  # never reached: merging stops once every word is one token
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([*vocabulary, *(" " + w for w in vocabulary)], trainer)
    glued = [w for w in vocabulary if not w.isalnum() and len(w) > 1]
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in [*added_tokens, *glued]])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        **{"unk_token": unk_token, **named_tokens},  # never produced (every byte is a token), declared alike
    )


NUM_HEADS = 4
NUM_KV_HEADS = 2
VISION_WIDTH = 32
VISION_HEADS = 2


def _mrope_section(head_dim: int, interleaved: bool) -> list[int]:
    """Split of the rotary half-dimension into (temporal, height, width) sections; sums to head_dim // 2.

    Args:
        head_dim (`int`): attention head dimension.
        interleaved (`bool`): Qwen3-VL interleaved layout (height/width take every third frequency, so each
            gets at most a third of the half-dimension); otherwise the Qwen2-VL 2:3:3 split.
    """
    half = head_dim // 2
    hw = half // 4 if interleaved else (half * 3) // 8
    return [half - 2 * hw, hw, hw]


def build_qwen(
    family: str,
    out_dir: str | os.PathLike,
    *,
    tie_word_embeddings: bool = True,
    num_attention_heads: int = NUM_HEADS,
    **options: Any,
) -> str:
    """Build and save a tiny `qwen2_vl`, `qwen2_5_vl` or `qwen3_vl` model with its processor.

    Images are resized to at most about `image_size**2` pixels, rounded to a multiple of `patch_size * 2` (patch
    14 for Qwen2/2.5, 16 for Qwen3, where 56 -> 64).

    Args:
        family (`str`): `"qwen2_vl"`, `"qwen2_5_vl"` or `"qwen3_vl"`.
        out_dir (`str | os.PathLike`): output directory.
        tie_word_embeddings (`bool`, *optional*, defaults to `True`): share the input embeddings with the LM head, as
            the 2B-4B checkpoints do; False as the 7B ones.
        num_attention_heads (`int`, *optional*, defaults to `4`): the text tower's heads (`hidden_size` divided by
            them is the head dim; vLLM's CPU attention runs head dims of 32 or more). Key/value heads: 2, or fewer
            when there are fewer heads.
        **options (`Any`): the fields of `BuildOptions`.

    Returns:
        `str`: `str(out_dir)`.
    """
    o = BuildOptions(**options)
    hidden_size, num_hidden_layers = o.hidden_size, o.num_hidden_layers
    head_dim = check_sizes(hidden_size, num_hidden_layers, num_attention_heads)
    is_qwen3 = family == "qwen3_vl"
    patch_size, merge_size, temporal_patch_size = (16 if is_qwen3 else 14), 2, 2
    factor = patch_size * merge_size
    side = round_to_multiple(o.image_size, factor)

    if (
        is_qwen3
    ):  # the published template and a byte-level BPE, so that tool calls render and parse as published
        chat_template = qwen3_vl_chat_template()
        tokenizer = byte_level_tokenizer(
            o.words, o.base_words, (*TAG_TOKENS, *QWEN_TOOL_TOKENS), chat_template=chat_template
        )
        ids = {tok: token_id(tokenizer, tok) for tok in QWEN_SPECIAL_TOKENS}
    else:
        chat_template = QWEN2_CHAT_TEMPLATE
        tokenizer, ids = o.tokenizer(QWEN_SPECIAL_TOKENS, QWEN_NAMED_TOKENS, chat_template)
    pad_id, eos_id = ids["<|endoftext|>"], ids["<|im_end|>"]

    # Image budget: from one merged token (factor**2 pixels) up to side**2 pixels.
    image_kwargs: dict[str, Any] = {
        "size": {"shortest_edge": factor * factor, "longest_edge": side * side},
        "patch_size": patch_size,
        "temporal_patch_size": temporal_patch_size,
        "merge_size": merge_size,
    }
    # Video budget: about 8 such frames in all, with the per-frame cap of qwen-vl-utils.
    video_kwargs = dict(
        image_kwargs,
        size={"shortest_edge": factor * factor, "longest_edge": 8 * side * side},
        cap_pixels_per_frame=True,
    )
    if is_qwen3:
        # Qwen3-VL normalises with mean = std = 0.5.
        image_kwargs.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        video_kwargs.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        video_processor = Qwen3VLVideoProcessor(**video_kwargs)
    else:
        video_processor = Qwen2VLVideoProcessor(**video_kwargs)
    image_processor = Qwen2VLImageProcessor(**image_kwargs)
    processor_cls = {
        "qwen2_vl": Qwen2VLProcessor,
        "qwen2_5_vl": Qwen2_5_VLProcessor,
        "qwen3_vl": Qwen3VLProcessor,
    }
    processor = processor_cls[family](
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template,
    )

    text_config: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": min(NUM_KV_HEADS, num_attention_heads),
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": _mrope_section(head_dim, interleaved=is_qwen3),
        },
        "pad_token_id": pad_id,
        "bos_token_id": pad_id,  # <|endoftext|>, as in the published text configs of Qwen2-VL to Qwen3-VL
        "eos_token_id": eos_id,
    }
    vision_config: dict[str, Any] = {
        "depth": num_hidden_layers,
        "num_heads": VISION_HEADS,
        "in_channels": 3,
        "patch_size": patch_size,
        "spatial_merge_size": merge_size,
        "temporal_patch_size": temporal_patch_size,
    }
    token_ids = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    if family == "qwen2_vl":
        # Qwen2-VL's patch merger projects straight to `vision_config.hidden_size`, the text width.
        vision_config.update(embed_dim=VISION_WIDTH, hidden_size=hidden_size, mlp_ratio=2)
        config = Qwen2VLConfig(
            text_config=text_config,
            vision_config=vision_config,
            **token_ids,
            tie_word_embeddings=tie_word_embeddings,
        )
        model_cls: type = Qwen2VLForConditionalGeneration
    elif family == "qwen2_5_vl":
        vision_config.update(
            hidden_size=VISION_WIDTH,
            intermediate_size=2 * VISION_WIDTH,
            out_hidden_size=hidden_size,
            # window attention everywhere except the last block, as in the real 7/15/23/31 pattern
            fullatt_block_indexes=[num_hidden_layers - 1],
            window_size=112,
            tokens_per_second=2,
        )
        config = Qwen2_5_VLConfig(
            text_config=text_config,
            vision_config=vision_config,
            **token_ids,
            tie_word_embeddings=tie_word_embeddings,
        )
        model_cls = Qwen2_5_VLForConditionalGeneration
    else:
        text_config.update(head_dim=head_dim)
        text_config["rope_parameters"]["mrope_interleaved"] = True
        vision_config.update(
            hidden_size=VISION_WIDTH,
            intermediate_size=2 * VISION_WIDTH,
            out_hidden_size=hidden_size,
            num_position_embeddings=(side // patch_size) ** 2,
            # deepstack: features of the early vision blocks are added to the first text layers
            deepstack_visual_indexes=list(range(max(1, num_hidden_layers - 1))),
        )
        config = Qwen3VLConfig(
            text_config=text_config,
            vision_config=vision_config,
            **token_ids,
            tie_word_embeddings=tie_word_embeddings,
        )
        model_cls = Qwen3VLForConditionalGeneration

    return save_tiny(
        out_dir, model_cls, config, processor, o, eos_token_ids=[eos_id, pad_id], pad_token_id=pad_id,
        bos_token_id=pad_id, sampling=QWEN_SAMPLING[family],
    )  # fmt: skip


QWEN_VISION_PREFIXES = ("model.visual.",)
QWEN_CONFIG_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}
QWEN_LAYOUT = ChatLayout(
    turn_open="<|im_start|>{role}\n",
    turn_end="<|im_end|>",
    image="<|vision_start|><|image_pad|><|vision_end|>",
    vision_prefixes=QWEN_VISION_PREFIXES,
    config_tokens=QWEN_CONFIG_TOKENS,
)
QWEN2_LAYOUT = replace(QWEN_LAYOUT, default_system="You are a helpful assistant.")
QWEN3_LAYOUT = replace(QWEN_LAYOUT, presampled_video_kwargs={"do_sample_frames": False})
"""Qwen3-VL's layout, which the Qwen3-VL MoE builder shares: its video processor samples frames."""
QWEN3_5_LAYOUT = replace(QWEN3_LAYOUT, thinking_prompt="<think>\n", history_reasoning=False)
"""Qwen3.5's layout (4B and larger): Qwen3-VL's, with thinking on by default and earlier turns' reasoning dropped."""


def qwen_family(name: str, title: str, architecture: str, build: Any, **expectations: Any) -> TinyFamily:
    """The record of a Qwen shape: Qwen's image token and grid of merged patches, and M-RoPE positions.

    Args:
        name (`str`): the shape's name.
        title (`str`): its name in messages.
        architecture (`str`): the model class saved in `config.json`.
        build (`Any`): the builder taking the options of `BuildOptions`.
        **expectations (`Any`): the other fields of `TinyFamily`.
    """
    return TinyFamily(
        name=name, build=build, title=title, architecture=architecture, image_token="<|image_pad|>",
        image_rule="grid", mrope=True, **expectations,
    )  # fmt: skip


def _qwen_vl(
    name: str, title: str, architecture: str, checkpoint: str, layout: ChatLayout, **expectations: Any
) -> TinyFamily:
    return qwen_family(
        name, title, architecture, partial(build_qwen, name), checkpoints=(checkpoint,), core=True,
        sampling=QWEN_SAMPLING[name], layout=layout, **expectations,
    )  # fmt: skip


QWEN2_VL = _qwen_vl("qwen2_vl", "Qwen2-VL", "Qwen2VLForConditionalGeneration", "Qwen2-VL", QWEN2_LAYOUT)
QWEN2_5_VL = _qwen_vl(
    "qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLForConditionalGeneration", "Qwen2.5-VL", QWEN2_LAYOUT
)
QWEN3_VL = _qwen_vl(
    "qwen3_vl", "Qwen3-VL", "Qwen3VLForConditionalGeneration", "Qwen3-VL-8B", QWEN3_LAYOUT, byte_level=True,
    tool_calls=True,
)  # fmt: skip
