"""How a judge's reply becomes a reward: a number in a range, yes/no, or a weighted JSON rubric.

Each parser takes the reply text and returns a reward in [0, 1], or None when the reply does not say what the parser
looks for (the judge reward counts it under `judge/unparsed` and gives that completion no reward). A reasoning block
`<think>...</think>` at the start of the reply is skipped.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import VLMGRPOError

Parser = Callable[[str], float | None]
"""`parser(reply) -> reward in [0, 1] | None`."""

PARSERS = ("score", "yes_no", "rubric")
"""The parsers a judge can name (`parser:` in its spec)."""

_THINK_RE = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
# a number, optionally written as a fraction of the scale ("7/10", "7 / 10"): the numerator is the score
_SCORE_RE = re.compile(rf"(?<![\w.])({_NUMBER})(?:\s*/\s*{_NUMBER})?(?![\w.])")
_YES_NO_RE = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def visible_text(reply: str) -> str:
    """The reply less a leading `<think>...</think>` block."""
    return _THINK_RE.sub("", reply, count=1)


def rescale(value: float, low: float, high: float) -> float | None:
    """`value` mapped from `[low, high]` to `[0, 1]`; None when it is outside the range or not finite."""
    if not math.isfinite(value) or not low <= value <= high:
        return None
    return (value - low) / (high - low)


def parse_score(reply: str, low: float = 0.0, high: float = 10.0) -> float | None:
    """The last number of the reply, rescaled from `[low, high]` to `[0, 1]`.

    "Score: 7", "7/10" and "... so I give it 7." all read 7. A reply without a number, or whose last number is
    outside the range, gives None.

    Args:
        reply (`str`): the judge's reply.
        low (`float`, *optional*, defaults to 0.0): the lowest score the template asks for.
        high (`float`, *optional*, defaults to 10.0): the highest.

    Returns:
        `float | None`: the rescaled score.
    """
    found = _SCORE_RE.findall(visible_text(reply))
    return rescale(float(found[-1]), low, high) if found else None


def parse_yes_no(reply: str) -> float | None:
    """1.0 when the first "yes" or "no" word of the reply (any case) is "yes", 0.0 when it is "no", else None.

    Args:
        reply (`str`): the judge's reply.

    Returns:
        `float | None`: the verdict.
    """
    found = _YES_NO_RE.search(visible_text(reply))
    if found is None:
        return None
    return 1.0 if found.group(1).lower() == "yes" else 0.0


def json_object(reply: str) -> dict[str, Any] | None:
    """The JSON object the reply holds: inside a ```json fence if there is one, else from its first `{` to its last
    `}`; None when there is none or it does not decode to an object."""
    text = visible_text(reply)
    fenced = _FENCE_RE.search(text)
    if fenced is not None:
        text = fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        value = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def parse_rubric(
    reply: str, weights: Mapping[str, float], low: float = 0.0, high: float = 10.0
) -> float | None:
    """The weighted mean of the rubric's items, each rescaled from `[low, high]` to `[0, 1]`.

    The reply holds a JSON object with one entry per rubric item, e.g. `{"correct": 8, "grounded": 6}`; an item may
    also be `true`/`false` (1/0 before the weighting, not rescaled). Keys besides the rubric's are ignored. A missing
    item, or one that is not a number in the range, gives None.

    Args:
        reply (`str`): the judge's reply.
        weights (`Mapping[str, float]`): each item's weight (positive numbers, normalised to sum to 1).
        low (`float`, *optional*, defaults to 0.0): the lowest score of an item.
        high (`float`, *optional*, defaults to 10.0): the highest.

    Returns:
        `float | None`: the weighted score.
    """
    found = json_object(reply)
    if found is None:
        return None
    total, weight_sum = 0.0, 0.0
    for item, weight in weights.items():
        value = found.get(item)
        if isinstance(value, bool):
            score = float(value)
        elif isinstance(value, numbers.Real):
            score = rescale(float(value), low, high)
        else:
            return None
        if score is None:
            return None
        total += weight * score
        weight_sum += weight
    return total / weight_sum


def check_range(score_range: Any) -> tuple[float, float]:
    """`score_range` as `(low, high)`; refuses anything but two finite numbers with low < high."""
    if (
        isinstance(score_range, (str, bytes))
        or not isinstance(score_range, Sequence)
        or len(score_range) != 2
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in score_range)
        or not all(math.isfinite(v) for v in score_range)
        or not score_range[0] < score_range[1]
    ):
        raise VLMGRPOError(
            f"reward 'judge': score_range must be two numbers [low, high] with low < high, got {score_range!r}."
        )
    return float(score_range[0]), float(score_range[1])


def check_rubric(rubric: Any) -> dict[str, float]:
    """`rubric` as `{item: weight}`; refuses an empty mapping, non-string items and weights that are not positive."""
    if not isinstance(rubric, Mapping) or not rubric:
        raise VLMGRPOError(
            "reward 'judge': parser 'rubric' needs `rubric: {item: weight, ...}`, e.g. "
            f"{{correct: 2, grounded: 1}}; got {rubric!r}."
        )
    for item, weight in rubric.items():
        if (
            not isinstance(item, str)
            or isinstance(weight, bool)
            or not isinstance(weight, numbers.Real)
            or not (math.isfinite(weight) and weight > 0)
        ):
            raise VLMGRPOError(
                f"reward 'judge': rubric item {item!r}: give a name and a positive weight, got {weight!r}."
            )
    return {item: float(weight) for item, weight in rubric.items()}


def make_parser(name: str, score_range: Any = (0, 10), rubric: Any = None) -> Parser:
    """The parser `name` with its settings bound, checked.

    Args:
        name (`str`): `score`, `yes_no` or `rubric` (see `PARSERS`).
        score_range (`Sequence[float]`, *optional*, defaults to `(0, 10)`): `[low, high]` of a score or rubric item.
        rubric (`Mapping[str, float] | None`, *optional*, defaults to `None`): the rubric's items and weights;
            required by `rubric`, refused by the others.

    Raises:
        VLMGRPOError: an unknown parser, a bad range or rubric, or a rubric given to another parser.
    """
    low, high = check_range(score_range)
    if name == "rubric":
        weights = check_rubric(rubric)
        return lambda reply: parse_rubric(reply, weights, low, high)
    if rubric is not None:
        raise VLMGRPOError(f"reward 'judge': `rubric` goes with `parser: rubric`, not {name!r}; remove one.")
    if name == "score":
        return lambda reply: parse_score(reply, low, high)
    if name == "yes_no":
        return parse_yes_no
    raise VLMGRPOError(f"reward 'judge': unknown parser {name!r}; use one of {', '.join(PARSERS)}.")
