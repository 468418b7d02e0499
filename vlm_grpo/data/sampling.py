"""Sampling strategies that pick a subset of one data file's records.

A strategy is written `MODE:N` in the YAML data config, where `MODE` is `first`, `end` or
`random` and `N` is either a positive record count (`first:1000`) or a percentage of the
file's records (`random:25%`, `end:12.5%`). A percentage is rounded down but picks at least one
record. A count larger than the file takes the whole file (and logs a warning).
"""

from __future__ import annotations

import logging
import math
import random
import re
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SAMPLING_MODES = ("first", "end", "random")
VALID_FORMS = "first:N, end:N or random:N, where N is a positive integer or a percentage P% with 0 < P <= 100"

_COUNT_RE = re.compile(r"^[0-9]+$")
_PERCENT_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)%$")


@dataclass(frozen=True)
class SamplingStrategy:
    """A parsed `sampling_strategy` value.

    Attributes:
        mode (`str`): `"first"`, `"end"` or `"random"`.
        count (`int | None`): Number of records, when written as a count; else `None`.
        percent (`float | None`): Percentage of records in `(0, 100]`, when written as `P%`; else `None`.
        text (`str`): The value as written in the config, for messages.
    """

    mode: str
    count: int | None = None
    percent: float | None = None
    text: str = ""

    def resolve_count(self, num_records: int) -> int:
        """Number of records this strategy picks out of `num_records`.

        Args:
            num_records (`int`): Number of records in the data file.

        Returns:
            `int`: `min(count, num_records)` for a count; `floor(num_records * P / 100)` but at least 1
            (and 0 for an empty file) for a percentage.
        """
        if self.count is not None:
            return min(self.count, num_records)
        assert self.percent is not None
        if num_records == 0:
            return 0
        return max(1, math.floor(num_records * self.percent / 100))

    def select(self, num_records: int, seed: int, entry_index: int, file: str = "") -> list[int]:
        """Indices of the records this strategy keeps, in file order.

        Args:
            num_records (`int`): Number of records in the data file.
            seed (`int`): Base seed; `random` picks are a function of `(seed, entry_index)` only, so they
                are the same across calls and processes.
            entry_index (`int`): Position of the entry in the config's `datasets` list.
            file (`str`, *optional*, defaults to `""`): Data file name, used in the warning about short files.

        Returns:
            `list[int]`: Sorted record indices.
        """
        if self.count is not None and self.count > num_records:
            logger.warning(
                "sampling_strategy %s asks for %d records but %s has only %d; taking all of them",
                self.text,
                self.count,
                file or "the data file",
                num_records,
            )
        k = self.resolve_count(num_records)
        if self.mode == "first":
            return list(range(k))
        if self.mode == "end":
            return list(range(num_records - k, num_records))
        rng = random.Random(f"vlm_grpo.data:{seed}:{entry_index}")
        return sorted(rng.sample(range(num_records), k))


def parse_sampling_strategy(value: object) -> SamplingStrategy:
    """Parse a `sampling_strategy` value.

    Args:
        value (`object`): The value from the YAML config, expected to be a string such as `"first:1000"`,
            `"end:10%"` or `"random:500"`.

    Returns:
        `SamplingStrategy`: The parsed strategy.

    Raises:
        ValueError: With a message naming the bad value and listing the valid forms.
    """
    if not isinstance(value, str):
        raise ValueError(
            f"expected a string, got {type(value).__name__} ({value!r}); valid forms: {VALID_FORMS}"
        )
    mode, sep, amount = value.partition(":")
    mode, amount = mode.strip(), amount.strip()
    if not sep or mode not in SAMPLING_MODES:
        raise ValueError(f"unknown sampling strategy {value!r}; valid forms: {VALID_FORMS}")
    if _COUNT_RE.match(amount):
        count = int(amount)
        if count < 1:
            raise ValueError(f"sampling strategy {value!r} picks no records; valid forms: {VALID_FORMS}")
        return SamplingStrategy(mode=mode, count=count, text=value)
    match = _PERCENT_RE.match(amount)
    if match:
        percent = float(match.group(1))
        if not 0 < percent <= 100:
            raise ValueError(f"percentage out of range in {value!r}; valid forms: {VALID_FORMS}")
        return SamplingStrategy(mode=mode, percent=percent, text=value)
    raise ValueError(f"bad amount {amount!r} in sampling strategy {value!r}; valid forms: {VALID_FORMS}")
