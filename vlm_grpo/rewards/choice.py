"""Choice rewards: the model picks one option out of a list given per record (brands, multiple choice)."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

from ..errors import VLMGRPOError
from .columns import batch_size, require_column, require_value
from .text import answer_or_text, completion_texts, normalize_phrase, strip_answer_tag

_LABEL_RE = re.compile(r"\(?([a-z])\)?")
_LABELLED_TEXT_RE = re.compile(r"(?:\(([a-z])\)|([a-z])\s*[.:)])\s*(.+)")
_OPTIONS_HINT = "a list of the option texts offered to the model, e.g. ['Nike', 'Adidas', 'Puma']"


def choice_accuracy(
    completions: Sequence[Any],
    solution: Sequence[Any] | None = None,
    labels: bool = True,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 iff the answer names exactly the correct option, by exact (normalized) match only.

    The answer is the content of the last `<answer>` block when the completion contains `<answer>`, else
    the text outside `<think>` blocks. Answer, options and solution are compared after
    `vlm_grpo.rewards.text.normalize_phrase` (case, surrounding whitespace, trailing period and
    repeated spaces ignored).

    Rule (simple on purpose, so that it cannot be gamed by substring matching):

    1. The answer names option `o` when the whole normalized answer equals the normalized text of `o`.
       So `"red or green"`, `"red, green, blue"`, `"reddish"`, the whole option list and an empty
       answer name no option and get 0.0.
    2. Otherwise, when `labels` is on and there are at most 26 options, options are also labelled by their
       position: `A` is `options[0]`, `B` is `options[1]`, ... The answer names an option by its label
       alone (`"B"`, `"(B)"`, `"B)"`, `"B:"`) or by its label and its text together (`"B. green"`,
       `"(B) green"`), where the text must then be that option's text.
    3. The solution is resolved the same way: an option text, or (under rule 2) a label.
    4. Reward is 1.0 when the option named by the answer is the option of the solution, else 0.0. Options
       with the same normalized text count as one.

    Options must be the bare texts (`"green"`, not `"B. green"`).

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        solution (`Sequence[str | None] | None`, *optional*, defaults to `None`): per record, the correct
            option's text or label, possibly wrapped in `<answer>`. A record whose solution is `None` gets `None`
            (reward does not apply). The column is required: `None` raises.
        labels (`bool`, *optional*, defaults to `True`): accept position labels `A`, `B`, ... (rule 2).
        **kwargs (`Any`): must hold the `options` column (per record, a list of option texts);
            `reasoning_opened` is read (see `vlm_grpo.rewards.text.completion_texts`); every other argument TRL
            passes is ignored.

    Returns:
        `list[float | None]`: 1.0, 0.0 or `None` per completion.

    Raises:
        VLMGRPOError: the `options` or `solution` column is missing, or a record's `options` is not a
            list of strings, or a solution names none of its options.
    """
    if solution is None:
        raise VLMGRPOError(
            "Reward 'choice_accuracy' needs the dataset column 'solution' with the correct option."
        )
    size = batch_size(completions, solution)
    options = require_column(kwargs, "options", size, "choice_accuracy", _OPTIONS_HINT)

    rewards: list[float | None] = []
    for i, (text, sol, opts) in enumerate(zip(completion_texts(completions, kwargs), solution, options)):
        texts = _option_texts(opts, i)
        if sol is None:
            rewards.append(None)
            continue
        gold = _named_option(str(strip_answer_tag(sol)), texts, labels)
        if gold is None:
            raise VLMGRPOError(
                f"choice_accuracy: the solution {sol!r} at batch position {i} is none of its options {list(opts)!r}; "
                "the solution must be one of the option texts (or its label A, B, ... when labels=True)."
            )
        answer = answer_or_text(text)
        named = _named_option(answer, texts, labels) if answer is not None else None
        rewards.append(1.0 if named == gold else 0.0)
    return rewards


def _option_texts(opts: Any, index: int) -> list[str]:
    opts = require_value(opts, "options", index, "choice_accuracy", _OPTIONS_HINT)
    if (
        isinstance(opts, (str, bytes))
        or not isinstance(opts, Sequence)
        or not all(isinstance(o, str) for o in opts)
    ):
        raise VLMGRPOError(
            f"choice_accuracy: column 'options' at batch position {index} is {opts!r}; expected {_OPTIONS_HINT}."
        )
    return [normalize_phrase(o) for o in opts]


def _named_option(answer: str, texts: list[str], labels: bool) -> str | None:
    """The normalized text of the single option `answer` names, or `None`."""
    phrase = normalize_phrase(answer)
    if not phrase:
        return None
    if phrase in texts:
        return phrase
    if not labels or len(texts) > len(string.ascii_lowercase):
        return None
    match = _LABEL_RE.fullmatch(phrase.rstrip(":"))
    if match:
        return _by_label(match.group(1), texts)
    match = _LABELLED_TEXT_RE.fullmatch(phrase)
    if match:
        option = _by_label(match.group(1) or match.group(2), texts)
        return option if option == normalize_phrase(match.group(3)) else None
    return None


def _by_label(letter: str, texts: list[str]) -> str | None:
    index = ord(letter) - ord("a")
    return texts[index] if index < len(texts) else None
