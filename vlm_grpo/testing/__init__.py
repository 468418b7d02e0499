"""Tiny, randomly initialised vision-language models built fully offline, for tests.

`build_tiny_model(family, out_dir)` writes a directory that `AutoModelForImageTextToText.from_pretrained`
and `AutoProcessor.from_pretrained` load: float32 weights (deterministic from `seed`), a word-level
tokenizer (see `DEFAULT_WORDS`), the family's image (and video) processor with small image sizes, a chat
template with the family's layout, and a `generation_config.json`. What a trainer or an inference engine reads is
as in the published checkpoints: special tokens and their order (eos `[<|im_end|>, <|endoftext|>]` for Qwen,
`[<eos>, <end_of_turn>]` for Gemma 3), newline tokens, the sampling fields of `generation_config.json`, the
chat template's default system turn, and tied embeddings where the small checkpoints tie them.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any

from ._common import DEFAULT_WORDS, ROLE_WORDS, TAG_TOKENS, UNK_TOKEN, BuildOptions
from .expectations import IMAGE_RULES, ChatLayout, TinyFamily
from .gemma3 import GEMMA3
from .gemma4 import GEMMA4
from .glm4v import GLM4V, GLM4V_MOE, GLM46V
from .internvl import INTERNVL
from .internvl_moe import INTERNVL_MOE
from .qwen import QWEN2_5_VL, QWEN2_VL, QWEN3_VL
from .qwen3_5 import QWEN3_5, QWEN3_5_MOE, QWEN3_VL_MOE

FAMILIES: dict[str, TinyFamily] = {
    record.name: record
    for record in (
        QWEN2_VL,
        QWEN2_5_VL,
        QWEN3_VL,
        INTERNVL,
        GEMMA3,
        QWEN3_VL_MOE,
        QWEN3_5,
        QWEN3_5_MOE,
        GEMMA4,
        GLM4V,
        GLM46V,
        GLM4V_MOE,
        INTERNVL_MOE,
    )
}
"""The one place a tiny family is registered: its `TinyFamily` record, declared next to its builder, by name."""

TINY_FAMILIES: tuple[str, ...] = tuple(FAMILIES)
"""Shapes `build_tiny_model` builds. Each is the `model_type` of the saved config, except `internvl_moe`: an
`internvl` model (InternVL3.5's MoE checkpoints) whose language model is a `qwen3_moe` mixture of experts."""
VLLM_LOGPROB_GAPS: dict[str, tuple[str, ...]] = {
    name: record.vllm_logprob_gaps for name, record in FAMILIES.items() if record.vllm_logprob_gaps
}
"""Tiny families whose vLLM log-probs are known to stay apart from the trainer's, and in which checks (`"sync"`,
`"steps"`), as each family's record says."""
DEFAULT_FAMILY: str = TINY_FAMILIES[0]
"""The family a test that needs just some model trains on: the first registered."""


def tiny_family(name: str) -> TinyFamily:
    """The record of the tiny family `name`.

    Args:
        name (`str`): one of `TINY_FAMILIES`.

    Raises:
        `ValueError`: unknown `name`.
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown tiny model family {name!r}; supported: {', '.join(TINY_FAMILIES)}")
    return FAMILIES[name]


def families_with(*, besides: Collection[str] = (), **properties: Any) -> tuple[str, ...]:
    """Names of the tiny families whose records have every one of `properties`, in registration order.

    Args:
        besides (`Collection[str]`, *optional*, defaults to `()`): families to leave out.
        **properties (`Any`): `TinyFamily` attributes and their values (`indexable_cache=False`); a `bool` value
            matches by truth (`refused_inputs=True`: the family refuses some input).
    """

    def matches(record: TinyFamily, name: str, wanted: Any) -> bool:
        value = getattr(record, name)
        return bool(value) == wanted if isinstance(wanted, bool) else value == wanted

    return tuple(
        name
        for name, record in FAMILIES.items()
        if name not in besides and all(matches(record, k, v) for k, v in properties.items())
    )


def a_family_with(*, besides: Collection[str] = (), **properties: Any) -> str:
    """The first registered tiny family with every one of `properties` (see `families_with`).

    Args:
        besides (`Collection[str]`, *optional*, defaults to `()`): families to leave out.
        **properties (`Any`): `TinyFamily` attributes and their values.

    Raises:
        `LookupError`: no family has them.
    """
    found = families_with(besides=besides, **properties)
    if not found:
        raise LookupError(f"no tiny family with {properties} besides {sorted(besides)}")
    return found[0]


def one_family_per_image_rule(*, besides: Collection[str] = (), **properties: Any) -> tuple[str, ...]:
    """For each of `IMAGE_RULES`, the first registered core family with that rule and `properties`.

    Args:
        besides (`Collection[str]`, *optional*, defaults to `()`): families to leave out.
        **properties (`Any`): further `TinyFamily` attributes and their values.
    """
    return tuple(
        a_family_with(besides=besides, core=True, image_rule=rule, **properties) for rule in IMAGE_RULES
    )


__all__ = [
    "DEFAULT_FAMILY",
    "DEFAULT_WORDS",
    "FAMILIES",
    "IMAGE_RULES",
    "ROLE_WORDS",
    "TAG_TOKENS",
    "TINY_FAMILIES",
    "UNK_TOKEN",
    "VLLM_LOGPROB_GAPS",
    "BuildOptions",
    "ChatLayout",
    "TinyFamily",
    "a_family_with",
    "build_tiny_model",
    "families_with",
    "one_family_per_image_rule",
    "tiny_family",
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
    """Build a tiny random model of `family` with tokenizer and processor, and save it to `out_dir`.

    Args:
        family (`str`): one of `TINY_FAMILIES`.
        out_dir (`str | os.PathLike`): directory to write (created if missing, files overwritten).
        words (`Sequence[str]`, *optional*, defaults to `None`): extra vocabulary words (no whitespace),
            added after `base_words`; duplicates are ignored.
        base_words (`Sequence[str]`, *optional*, defaults to `None`): the vocabulary before `words`; None is
            `DEFAULT_WORDS`. Pass `ROLE_WORDS` to get only the chat roles plus `words` (a small vocabulary
            learns faster).
        seed (`int`, *optional*, defaults to 0): seed of the random weights; the caller's torch RNG state is
            left untouched.
        hidden_size (`int`, *optional*, defaults to 64): text hidden size, a multiple of 8 (4 attention
            heads, 2 KV heads); vision towers are 32 wide with 2 heads.
        num_hidden_layers (`int`, *optional*, defaults to 2): depth of both the text and the vision tower.
        image_size (`int`, *optional*, defaults to 56): target image side in pixels. A square image of this
            size gives 4 image tokens at the default for every family (Qwen3-VL rounds 56 up to 64).

    Returns:
        `str`: `str(out_dir)`.

    Raises:
        `ValueError`: unknown `family`, or sizes the architectures cannot take.
    """
    return tiny_family(family).build(
        out_dir, words=words, base_words=DEFAULT_WORDS if base_words is None else base_words, seed=seed,
        hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, image_size=image_size,
    )  # fmt: skip
