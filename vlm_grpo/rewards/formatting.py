"""Format rewards: does the completion follow the `<think>...</think><answer>...</answer>` layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .text import completion_texts, has_think_answer_format


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Registered as `format`: 1.0 iff the completion is `<think>...</think>` then `<answer>...</answer>`.

    Whitespace is allowed around and between the two blocks, nothing else; each tag must appear exactly once
    (see `vlm_grpo.rewards.text.has_think_answer_format`). Never returns `None`: the format applies
    to every sample.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        **kwargs (`Any`): every other argument TRL passes (`solution`, `prompts`, dataset columns, ...);
            `reasoning_opened` is read (see `vlm_grpo.rewards.text.completion_texts`), the rest ignored.

    Returns:
        `list[float]`: 1.0 or 0.0 per completion.
    """
    return [1.0 if has_think_answer_format(text) else 0.0 for text in completion_texts(completions, kwargs)]
