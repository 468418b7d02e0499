"""Reward functions that fail loudly and precisely.

A reward that raises or returns the wrong number of values would otherwise surface as a bare traceback from deep
inside the trainer. `guard_reward` wraps a reward so that these cases raise a `RewardError` naming the reward and
the record. What TRL accepts as a reward value is accepted unchanged: Python or NumPy numbers, booleans, None and
NaN (both mean "does not apply to this completion").
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import VLMGRPOError

_RECORD_KEYS = ("id", "image_paths", "problem", "solution")


class RewardError(VLMGRPOError):
    """A reward function failed or returned invalid values; the message names the reward and the record."""


def _describe(kwargs: dict[str, Any], index: int) -> str:
    """A short description of record `index` from the reward's column kwargs (id, images, problem, solution)."""
    parts = []
    for key in _RECORD_KEYS:
        values = kwargs.get(key)
        if isinstance(values, Sequence) and not isinstance(values, str) and index < len(values):
            text = repr(values[index])
            parts.append(f"{key}={text[:80] + '...' if len(text) > 80 else text}")
    return f"record {index}" + (f" ({', '.join(parts)})" if parts else "")


def _single(kwargs: dict[str, Any], index: int, size: int) -> dict[str, Any]:
    """The kwargs of one record: every per-completion list sliced to `[index]`, other values kept."""
    return {k: [v[index]] if isinstance(v, list) and len(v) == size else v for k, v in kwargs.items()}


def guard_reward(
    func: Callable[..., list], name: str, failures: list[RewardError] | None = None
) -> Callable[..., list]:
    """Wrap `func` so that failures and invalid outputs raise `RewardError` naming `name` and the record.

    Args:
        func (`Callable`): a reward `fn(prompts=..., completions=..., **columns) -> list[float | None]`.
        name (`str`): the name used in messages and metrics (`__name__` of the wrapper).
        failures (`list[RewardError] | None`, *optional*, defaults to `None`): when given, a failure is appended
            here and the call returns None for every completion instead of raising, so that a distributed caller
            can first finish its collectives and then stop every process together (see
            `VLMGRPOTrainer._calculate_rewards`).

    Returns:
        `Callable`: same signature; returns the same values when they are valid (one number, bool or None per
        completion).
    """

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> list:
        if failures is None:
            return checked(*args, **kwargs)
        try:
            return checked(*args, **kwargs)
        except RewardError as error:
            failures.append(error)
            return [None] * len(kwargs.get("completions", args[1] if len(args) > 1 else []))

    def checked(*args: Any, **kwargs: Any) -> list:
        completions = kwargs.get("completions", args[1] if len(args) > 1 else [])
        size = len(completions)
        try:
            values = func(*args, **kwargs)
        except Exception as error:  # re-raised with the failing record; the original is chained
            index = _first_failing_record(func, kwargs, size) if not args else None
            where = _describe(kwargs, index) if index is not None else f"a batch of {size} completions"
            raise RewardError(f"reward '{name}' raised {type(error).__name__} on {where}: {error}") from error
        values = list(values) if values is not None else None
        if values is None or len(values) != size:
            got = "None" if values is None else f"{len(values)} values"
            raise RewardError(
                f"reward '{name}' returned {got} for {size} completions; return one per completion."
            )
        for index, value in enumerate(values):
            if value is None:
                continue
            if not isinstance(value, (numbers.Real, bool, np.bool_)):  # np.bool_ is no numbers.Real
                raise RewardError(
                    f"reward '{name}' returned {value!r} for {_describe(kwargs, index)}; return a number "
                    "or None (None = the reward does not apply to this completion)."
                )
        return values

    guarded.__name__ = name
    return guarded


def _first_failing_record(func: Callable[..., list], kwargs: dict[str, Any], size: int) -> int | None:
    """Re-run `func` record by record (only after a failure) to find the first record it fails on."""
    for index in range(size):
        try:
            func(**_single(kwargs, index, size))
        except Exception:  # the record that fails is what we are looking for
            return index
    return None
