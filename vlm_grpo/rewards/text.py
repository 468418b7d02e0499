"""Text helpers shared by the rewards: completion flattening and tag, box and `\\boxed{}` parsing.

All helpers are pure functions on strings; none of them raises on odd model output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_FORMAT_RE = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_BLOCK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_BOX_RE = re.compile(rf"\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]")
_BOXED_RE = re.compile(r"\\boxed\s*\{")


REASONING_OPENED = "reasoning_opened"
"""The reward argument the trainer adds when the chat template's generation prompt opens the reasoning block itself
(Qwen3.5 4B and larger write `<think>` there): one `True` per completion. TRL passes no such argument."""


def completion_texts(completions: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    """The text of each completion, as the model wrote it after its prompt: where the generation prompt opened the
    reasoning block (`kwargs[REASONING_OPENED]`), `<think>` is put back in front, so that the format and the answer
    are read alike whether the template or the model opens the block.

    Args:
        completions (`Sequence[Any]`): the completions, as `completion_text` takes them.
        kwargs (`dict[str, Any]`): the other arguments the reward got.

    Returns:
        `list[str]`: one text per completion.
    """
    opened = kwargs.get(REASONING_OPENED) or [False] * len(completions)
    return [
        THINK_OPEN + "\n" + completion_text(c) if o else completion_text(c)
        for c, o in zip(completions, opened)
    ]


def completion_text(completion: Any) -> str:
    """Return the text of one completion as TRL passes it to reward functions.

    Args:
        completion (`str | list[dict] | dict | None`): a plain string, or a conversational completion: a list of
            messages `{"role": ..., "content": ...}` (the last `assistant` message is used, or the last
            message when none has that role), or a single message. `content` may be a string or a list of
            parts `{"type": "text", "text": ...}`; non-text parts (images) are skipped.

    Returns:
        `str`: the text, `""` for `None` or empty content.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, dict)]
        if not messages:
            return "".join(str(part) for part in completion)
        assistant = [m for m in messages if m.get("role") == "assistant"]
        return _content_text((assistant or messages)[-1].get("content"))
    return str(completion)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text":
                parts.append(str(part.get("text") or ""))
        return "".join(parts)
    return str(content)


def strip_answer_tag(solution: Any) -> Any:
    """Unwrap a ground truth written as `<answer>...</answer>` (as VLM-R1 data stores it).

    Args:
        solution (`Any`): the `solution` value of one record. Non-strings are returned unchanged.

    Returns:
        `Any`: the content of the last `<answer>` block, stripped, when the string has one; otherwise the
        stripped string (or the value unchanged when it is not a string).
    """
    if not isinstance(solution, str):
        return solution
    found = _ANSWER_RE.findall(solution)
    return (found[-1] if found else solution).strip()


def has_think_answer_format(text: str) -> bool:
    """Whether `text` is exactly `<think>...</think>` then `<answer>...</answer>`.

    Whitespace is allowed before, between and after the two blocks; nothing else is. Each tag must appear
    exactly once, so an answer smuggled into a second `<answer>` block, or tags nested inside a block, fail.

    Args:
        text (`str`): the completion text.

    Returns:
        `bool`: `True` when the format holds.
    """
    if _FORMAT_RE.fullmatch(text) is None:
        return False
    return all(text.count(tag) == 1 for tag in _TAGS)


def extract_answer(text: str) -> str | None:
    """Return the stripped content of the last complete `<answer>...</answer>` block.

    Args:
        text (`str`): the completion text.

    Returns:
        `str | None`: the content, or `None` when there is no complete block.
    """
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def answer_or_text(text: str) -> str | None:
    """Return the part of a completion that holds its answer.

    Rule: when the text contains `<answer>` at all, the answer is the content of the last complete
    `<answer>...</answer>` block, and `None` when that block is never closed (a truncated answer is not
    graded). Without an `<answer>` tag the answer is the whole text with any `<think>...</think>` blocks
    removed, stripped.

    Args:
        text (`str`): the completion text.

    Returns:
        `str | None`: the answer text, or `None` when there is nothing to grade.
    """
    if ANSWER_OPEN in text:
        return extract_answer(text)
    return _THINK_BLOCK_RE.sub("", text).strip()


def find_box(text: str) -> list[float] | None:
    """Return the first box `[x1, y1, x2, y2]` written in `text`.

    A box is four numbers (ints or floats, optional sign, optional spaces) in square brackets separated by
    commas, e.g. `[10, 20.5, -3, 4]`; a box inside JSON such as `{"bbox_2d": [1, 2, 3, 4]}` is found too.

    Args:
        text (`str`): text to search.

    Returns:
        `list[float] | None`: the four coordinates, or `None` when no box is written.
    """
    match = _BOX_RE.search(text)
    return [float(v) for v in match.groups()] if match else None


def last_boxed(text: str) -> str | None:
    """Return the content of the last `\\boxed{...}` in `text`, braces balanced (nesting allowed).

    Args:
        text (`str`): text to search.

    Returns:
        `str | None`: the stripped content, or `None` when there is no closed `\\boxed{`.
    """
    for match in reversed(list(_BOXED_RE.finditer(text))):
        content = _balanced(text, match.end())
        if content is not None:
            return content.strip()
    return None


def boxed_end(text: str, start: int = 0) -> int | None:
    """Return the index just after the first closed `\\boxed{...}` at or after `start`.

    Args:
        text (`str`): text to search.
        start (`int`, *optional*, defaults to `0`): where to start searching.

    Returns:
        `int | None`: the end index, or `None` when there is no closed `\\boxed{` there.
    """
    for match in _BOXED_RE.finditer(text, start):
        content = _balanced(text, match.end())
        if content is not None:
            return match.end() + len(content) + 1
    return None


def _balanced(text: str, start: int) -> str | None:
    """Content from `start` (just after an opening brace) to its matching closing brace."""
    depth = 1
    for i in range(start, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def normalize_phrase(text: str) -> str:
    """Normalize a short answer for exact comparison.

    Strips surrounding whitespace and trailing periods, collapses runs of whitespace to one space and
    case-folds: `" Red. "` -> `"red"`, `"Coca  Cola"` -> `"coca cola"`.

    Args:
        text (`str`): the phrase.

    Returns:
        `str`: the normalized phrase.
    """
    return " ".join(text.strip().rstrip(".").split()).casefold()
