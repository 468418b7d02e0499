"""Math rewards: the final answer is mathematically equal to the solution (graded with `math-verify`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import VLMGRPOError
from .columns import batch_size
from .text import (
    THINK_CLOSE,
    THINK_OPEN,
    boxed_end,
    completion_texts,
    extract_answer,
    last_boxed,
    normalize_phrase,
    strip_answer_tag,
)

_WORDS_RE = re.compile(r"[^\W\d_]{2,}(?:\s+[^\W\d_]+)*", re.UNICODE)
"""A purely verbal answer ("yes", "red car"): compared as a phrase, not as a product of symbols."""

TIMEOUT_SECONDS = 5
"""Time limit of one `math-verify` parse or comparison; applied only in the main thread (it uses SIGALRM)."""


def _math_verify() -> tuple[Any, Any]:
    try:
        from math_verify import parse, verify
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The math rewards need the 'math-verify' package: pip install 'math-verify>=0.9'."
        ) from exc
    return parse, verify


def math_equal(answer: str, solution: str) -> bool:
    """Whether `answer` is mathematically equal to `solution` (both LaTeX or plain expressions).

    Both sides are parsed as a whole, as if written in `\\boxed{...}`, so that text around a number
    (`"it is 3 or 5"`) is not searched for something that happens to match. Math delimiters (`$...$`,
    `\\(...\\)`) and units are handled by `math-verify`. Answers equal as phrases
    (`vlm_grpo.rewards.text.normalize_phrase`) are equal without parsing. A purely verbal solution
    (letters and spaces only, at least two letters, e.g. `"yes"`) is compared only as a phrase, because
    `math-verify` would read it as a product of symbols (`"cat" == "tac"`). Parsing and comparison are
    time-limited to `TIMEOUT_SECONDS` in the main thread; in other threads the signal-based limit is
    unavailable and none is applied.

    Args:
        answer (`str`): the model's answer.
        solution (`str`): the ground truth.

    Returns:
        `bool`: `True` when equal.
    """
    answer, solution = answer.strip(), solution.strip()
    if not answer or not solution:
        return False
    if normalize_phrase(answer) == normalize_phrase(solution):
        return True
    if _WORDS_RE.fullmatch(solution):
        return False
    parse, verify = _math_verify()
    timeout = TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    gold = parse("\\boxed{" + solution + "}", parsing_timeout=timeout)
    pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _final_answer(text: str) -> str | None:
    """The last `\\boxed{}` content of the text, else the last `<answer>` content, else `None`."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else extract_answer(text)


def _solution_text(sol: Any) -> str:
    sol = strip_answer_tag(sol)
    if not isinstance(sol, str):
        return str(sol)
    boxed = last_boxed(sol)
    return boxed if boxed is not None else sol


def math_accuracy(
    completions: Sequence[Any], solution: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """1.0 iff the final answer is mathematically equal to the solution (see `math_equal`).

    The final answer is the content of the last `\\boxed{...}` in the completion (balanced braces, nesting
    allowed), else of the last complete `<answer>` block; with neither there is nothing to grade: 0.0.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        solution (`Sequence[str | float | None] | None`, *optional*, defaults to `None`): per record, the ground
            truth (LaTeX, a plain expression or a number), possibly wrapped in `<answer>` or in `\\boxed{}`. A
            record whose solution is `None` gets `None` (reward does not apply). The column is required: `None`
            raises.
        **kwargs (`Any`): every other argument TRL passes; `reasoning_opened` is read (see `completion_texts`).

    Returns:
        `list[float | None]`: 1.0, 0.0 or `None` per completion.

    Raises:
        VLMGRPOError: the `solution` column is missing.
    """
    if solution is None:
        raise VLMGRPOError(
            "Reward 'math_accuracy' needs the dataset column 'solution' with the ground-truth answer."
        )
    batch_size(completions, solution)
    rewards: list[float | None] = []
    for text, sol in zip(completion_texts(completions, kwargs), solution):
        if sol is None:
            rewards.append(None)
            continue
        answer = _final_answer(text)
        rewards.append(1.0 if answer is not None and math_equal(answer, _solution_text(sol)) else 0.0)
    return rewards


def has_geo_format(text: str) -> bool:
    """Whether `text` starts with `<think>...</think>` followed, after anything, by a closed `\\boxed{...}`.

    Leading whitespace is allowed; any text may come between `</think>` and `\\boxed{` and after the box.

    Args:
        text (`str`): the completion text.

    Returns:
        `bool`: `True` when the format holds.
    """
    text = text.lstrip()
    if not text.startswith(THINK_OPEN):
        return False
    close = text.find(THINK_CLOSE)
    return close >= 0 and boxed_end(text, close + len(THINK_CLOSE)) is not None


def geo3k(
    completions: Sequence[Any], solution: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """Geometry3K score: `0.9 * math_accuracy + 0.1 * geo_format`.

    `geo_format` is 1.0 iff `has_geo_format` holds. Possible values: 0.0, 0.1, 0.9 and 1.0.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        solution (`Sequence[str | float | None] | None`, *optional*, defaults to `None`): per record, the ground
            truth, as for `math_accuracy`. A record whose solution is `None` gets `None`. The column is required:
            `None` raises.
        **kwargs (`Any`): every other argument TRL passes; `reasoning_opened` is read (see `completion_texts`).

    Returns:
        `list[float | None]`: the score per completion.

    Raises:
        VLMGRPOError: the `solution` column is missing.
    """
    if solution is None:
        raise VLMGRPOError("Reward 'geo3k' needs the dataset column 'solution' with the ground-truth answer.")
    accuracies = math_accuracy(completions, solution, **kwargs)
    rewards: list[float | None] = []
    for text, acc in zip(completion_texts(completions, kwargs), accuracies):
        if acc is None:
            rewards.append(None)
            continue
        fmt = 1.0 if has_geo_format(text) else 0.0
        rewards.append(0.9 * acc + 0.1 * fmt)
    return rewards
