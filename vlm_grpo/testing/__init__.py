"""Tiny, randomly initialised vision-language models built fully offline, for tests.

``build_tiny_model(family, out_dir)`` writes a directory that ``AutoModelForImageTextToText.from_pretrained``
and ``AutoProcessor.from_pretrained`` load: float32 weights (deterministic from ``seed``), a word-level
tokenizer (see ``DEFAULT_WORDS``), the family's image (and video) processor with small image sizes, a chat
template with the family's layout, and a ``generation_config.json``. What a trainer or an inference engine reads is
as in the published checkpoints: special tokens and their order (eos ``[<|im_end|>, <|endoftext|>]`` for Qwen,
``[<eos>, <end_of_turn>]`` for Gemma 3), newline tokens, the sampling fields of ``generation_config.json``, the
chat template's default system turn, and tied embeddings where the small checkpoints tie them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial

from ._common import DEFAULT_WORDS, ROLE_WORDS, TAG_TOKENS, UNK_TOKEN
from .gemma3 import build_gemma3
from .gemma4 import build_gemma4
from .glm4v import VLLM_LOGPROB_GAPS as GLM4V_VLLM_GAPS
from .glm4v import build_glm4v
from .internvl import build_internvl
from .internvl_moe import build_internvl_moe
from .qwen import build_qwen
from .qwen3_5 import VLLM_LOGPROB_GAPS as QWEN3_5_VLLM_GAPS
from .qwen3_5 import build_qwen_moe

BUILDERS: dict[str, Callable[..., str]] = {
    "qwen2_vl": partial(build_qwen, "qwen2_vl"),
    "qwen2_5_vl": partial(build_qwen, "qwen2_5_vl"),
    "qwen3_vl": partial(build_qwen, "qwen3_vl"),
    "internvl": build_internvl,
    "gemma3": build_gemma3,
    "qwen3_vl_moe": partial(build_qwen_moe, "qwen3_vl_moe"),
    "qwen3_5": partial(build_qwen_moe, "qwen3_5"),
    "qwen3_5_moe": partial(build_qwen_moe, "qwen3_5_moe"),
    "gemma4": build_gemma4,
    "glm4v": partial(build_glm4v, family="glm4v"),
    "glm46v": partial(build_glm4v, family="glm46v"),
    "glm4v_moe": partial(build_glm4v, family="glm4v_moe"),
    "internvl_moe": build_internvl_moe,
}
"""The one place a tiny builder is registered: ``shape -> builder(out_dir, **kwargs)``."""

TINY_FAMILIES: tuple[str, ...] = tuple(BUILDERS)
VLLM_LOGPROB_GAPS: dict[str, tuple[str, ...]] = {**GLM4V_VLLM_GAPS, **QWEN3_5_VLLM_GAPS}
"""Tiny families whose vLLM log-probs are known to stay apart from the trainer's, and in which checks (`"sync"`,
`"steps"`), as each builder's module records them."""
"""Shapes ``build_tiny_model`` builds. Each is the ``model_type`` of the saved config, except ``internvl_moe``: an
``internvl`` model (InternVL3.5's MoE checkpoints) whose language model is a ``qwen3_moe`` mixture of experts."""

__all__ = [
    "DEFAULT_WORDS",
    "ROLE_WORDS",
    "TAG_TOKENS",
    "TINY_FAMILIES",
    "UNK_TOKEN",
    "VLLM_LOGPROB_GAPS",
    "build_tiny_model",
]


def build_tiny_model(
    family: str,
    out_dir: str | os.PathLike,
    *,
    words: Sequence[str] | None = None,
    base_words: Sequence[str] | None = None,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    image_size: int = 56,
) -> str:
    """Build a tiny random model of ``family`` with tokenizer and processor, and save it to ``out_dir``.

    Args:
        family (`str`): one of ``TINY_FAMILIES`` (the keys of ``BUILDERS``).
        out_dir (`str | os.PathLike`): directory to write (created if missing, files overwritten).
        words (`Sequence[str]`, *optional*, defaults to `None`): extra vocabulary words (no whitespace),
            added after ``base_words``; duplicates are ignored.
        base_words (`Sequence[str]`, *optional*, defaults to `None`): the vocabulary before ``words``; None is
            ``DEFAULT_WORDS``. Pass ``ROLE_WORDS`` to get only the chat roles plus ``words`` (a small vocabulary
            learns faster).
        seed (`int`, *optional*, defaults to 0): seed of the random weights; the caller's torch RNG state is
            left untouched.
        hidden_size (`int`, *optional*, defaults to 64): text hidden size, a multiple of 8 (4 attention
            heads, 2 KV heads); vision towers are 32 wide with 2 heads.
        num_hidden_layers (`int`, *optional*, defaults to 2): depth of both the text and the vision tower.
        image_size (`int`, *optional*, defaults to 56): target image side in pixels. A square image of this
            size gives 4 image tokens at the default for every family (Qwen3-VL rounds 56 up to 64).

    Returns:
        `str`: ``str(out_dir)``.

    Raises:
        `ValueError`: unknown ``family``, or sizes the architectures cannot take.
    """
    kwargs = {
        "words": words,
        "base_words": DEFAULT_WORDS if base_words is None else base_words,
        "seed": seed,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "image_size": image_size,
    }
    if family not in BUILDERS:
        raise ValueError(f"unknown tiny model family {family!r}; supported: {', '.join(TINY_FAMILIES)}")
    return BUILDERS[family](out_dir, **kwargs)
