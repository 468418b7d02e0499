"""Format rewards: does the completion follow the `<think>...</think><answer>...</answer>` layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .text import completion_text, has_think_answer_format


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Registered as `format`: 1.0 iff the completion is `<think>...</think>` then `<answer>...</answer>`.

    Whitespace is allowed around and between the two blocks, nothing else; each tag must appear exactly once
    (see `vlm_grpo.rewards.text.has_think_answer_format`). Never returns `None`: the format applies
    to every sample.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        **kwargs (`Any`): every other argument TRL passes (`solution`, `prompts`, dataset columns, ...);
            ignored.

    Returns:
        `list[float]`: 1.0 or 0.0 per completion.
    """
    return [1.0 if has_think_answer_format(completion_text(c)) else 0.0 for c in completions]
