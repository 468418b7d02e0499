"""Tiny InternVL3.5-style model with a mixture-of-experts language model (`internvl` + `qwen3_moe`), offline.

The released InternVL3.5 MoE checkpoints in transformers' own format (`OpenGVLab/InternVL3_5-30B-A3B-HF`) are
`internvl` models whose `text_config` is a `qwen3_moe` config. This builder writes the tiny `internvl` model
of `build_internvl` (same tokenizer, processor and vision tower) with such a language model: 4 experts of width
`hidden_size / 2`, 2 per token.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import GenerationConfig, InternVLConfig, InternVLForConditionalGeneration, Qwen3MoeConfig

from ._common import BuildOptions, seeded
from .expectations import TinyFamily
from .internvl import build_internvl

NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2


def build_internvl_moe(out_dir: str | os.PathLike, **options: Any) -> str:
    """Build and save a tiny `internvl` model whose language model is a `qwen3_moe` mixture of experts.

    Args:
        out_dir (`str | os.PathLike`): output directory.
        **options (`Any`): the fields of `BuildOptions`, as `build_internvl` takes them.

    Returns:
        `str`: `str(out_dir)`.
    """
    build_internvl(out_dir, **options)  # tokenizer, processor, generation config, dense weights
    config = InternVLConfig.from_pretrained(out_dir)
    dense = config.text_config
    config.text_config = Qwen3MoeConfig(
        vocab_size=dense.vocab_size,
        hidden_size=dense.hidden_size,
        intermediate_size=dense.intermediate_size,
        num_hidden_layers=dense.num_hidden_layers,
        num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads,
        head_dim=dense.hidden_size // dense.num_attention_heads,
        max_position_embeddings=dense.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        moe_intermediate_size=dense.hidden_size // 2,
        norm_topk_prob=True,
        output_router_logits=False,
        bos_token_id=dense.bos_token_id,
        eos_token_id=dense.eos_token_id,
        pad_token_id=dense.pad_token_id,
        tie_word_embeddings=False,
    )
    generation_config = GenerationConfig.from_pretrained(out_dir)
    with seeded(BuildOptions(**options).seed):
        model = InternVLForConditionalGeneration(config).float().eval()
    model.generation_config = generation_config
    model.save_pretrained(out_dir)  # replaces the dense weights and config
    return str(out_dir)


INTERNVL_MOE = TinyFamily(
    name="internvl_moe",
    build=build_internvl_moe,
    title="InternVL3.5 MoE",
    architecture="InternVLForConditionalGeneration",
    image_token="<IMG_CONTEXT>",
    image_rule="tiles",
    model_type="internvl",
    checkpoints=("InternVL3_5-30B-A3B",),
    tied_embeddings=False,
    moe=True,
)
