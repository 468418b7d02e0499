"""`accuracy`: per-record dispatch to the accuracy reward named by the `accu_reward_method` column."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import VLMGRPOError
from .choice import choice_accuracy
from .columns import batch_size, require_column
from .grounding import iou
from .mathematics import geo3k, math_accuracy

ACCURACY_METHODS: dict[str, Callable[..., list[float | None]]] = {
    "iou": iou,
    "choice_accuracy": choice_accuracy,
    "math_accuracy": math_accuracy,
    "geo3k": geo3k,
}
"""Accuracy rewards `accuracy` can dispatch to, by name."""

METHOD_ALIASES: dict[str, str] = {
    "rec": "iou",
    "mcq": "choice_accuracy",
    "choice": "choice_accuracy",
    "math": "math_accuracy",
}
"""Other method names found in VLM-R1 style data, and the accuracy reward each stands for."""

DEFAULT_METHOD = "math_accuracy"
"""What the method name `default` means when no `default` option is set (VLM-R1 grades it with math-verify)."""


def resolve_method(method: str | None, default: str | None = None) -> str:
    """Return the accuracy reward name for one record's `accu_reward_method` value.

    Args:
        method (`str | None`): the record's value: a name of `ACCURACY_METHODS`, an alias of
            `METHOD_ALIASES`, `"default"` or `None` (no value for this record).
        default (`str | None`, *optional*, defaults to `None`): the `default` option of `accuracy`: the method for
            records with no value and for the value `"default"`.

    Returns:
        `str`: a key of `ACCURACY_METHODS`.

    Raises:
        VLMGRPOError: `method` is `None` and no `default` is set, or a name is unknown.
    """
    if method is None:
        if default is None:
            raise VLMGRPOError(
                "Reward 'accuracy' needs the dataset column 'accu_reward_method' naming the accuracy reward of each "
                f"record ({_known()}), or the option 'default' (e.g. {{name: accuracy, default: iou}}) for records "
                "without it."
            )
        method = default
    method = str(method).strip()
    if method == "default":
        method = default if default not in (None, "default") else DEFAULT_METHOD
    name = METHOD_ALIASES.get(method, method)
    if name not in ACCURACY_METHODS:
        raise VLMGRPOError(f"Reward 'accuracy': unknown accu_reward_method {method!r}; known: {_known()}.")
    return name


def _known() -> str:
    return ", ".join([*ACCURACY_METHODS, *METHOD_ALIASES, "default"])


def accuracy(
    completions: Sequence[Any],
    solution: Sequence[Any] | None = None,
    accu_reward_method: Sequence[str | None] | None = None,
    default: str | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Grade each record with the accuracy reward its `accu_reward_method` column names.

    Records are grouped by method and each group is passed to that reward (`ACCURACY_METHODS`:
    `iou`, `choice_accuracy`, `math_accuracy`, `geo3k`) with the columns sliced to the group, so the
    group's reward sees the columns it needs (`options`, `image_size`, ...). Aliases
    (`METHOD_ALIASES`): `rec` -> `iou`, `mcq` and `choice` -> `choice_accuracy`, `math` ->
    `math_accuracy`. The name `default` means the `default` option when set, else `math_accuracy`.
    Options bound to `accuracy` (e.g. `coords`, `labels`) reach every method, which ignores the ones
    that are not its own. A reward's `None` (record without a solution) is passed through.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        solution (`Sequence[Any] | None`, *optional*, defaults to `None`): the `solution` column.
        accu_reward_method (`Sequence[str | None] | None`, *optional*, defaults to `None`): per record, the method
            name; the column may be absent (`None`) or hold `None` for some records, which then use `default`.
        default (`str | None`, *optional*, defaults to `None`): the method for records without
            `accu_reward_method` and for the name `default`; when `None`, such records raise, except the name
            `default`.
        **kwargs (`Any`): the other columns and arguments TRL passes, and bound options; handed to each method.

    Returns:
        `list[float | None]`: the reward per completion.

    Raises:
        VLMGRPOError: a record has no method and no `default` is set, or a method name is unknown.
    """
    size = batch_size(completions, solution)
    if default is not None:
        resolve_method(default)  # fail early on a misspelled option
    methods = (
        [None] * size
        if accu_reward_method is None
        else require_column(
            {"accu_reward_method": accu_reward_method}, "accu_reward_method", size, "accuracy"
        )
    )
    groups: dict[str, list[int]] = {}
    for i, method in enumerate(methods):
        groups.setdefault(resolve_method(method, default), []).append(i)

    columns = {k: v for k, v in kwargs.items() if isinstance(v, (list, tuple)) and len(v) == size}
    rewards: list[float | None] = [None] * size
    for name, indices in groups.items():
        sub_kwargs = dict(kwargs)
        sub_kwargs.update({k: [v[i] for i in indices] for k, v in columns.items()})
        sub_solution = None if solution is None else [solution[i] for i in indices]
        sub_rewards = ACCURACY_METHODS[name]([completions[i] for i in indices], sub_solution, **sub_kwargs)
        for i, reward in zip(indices, sub_rewards):
            rewards[i] = reward
    return rewards
