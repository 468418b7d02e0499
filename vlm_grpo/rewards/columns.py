"""Access to the dataset columns that TRL passes to reward functions as keyword arguments.

TRL calls a reward as `fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)`
where every dataset column is a list aligned with `completions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import VLMGRPOError


def require_column(kwargs: Mapping[str, Any], name: str, size: int, reward: str, hint: str = "") -> list[Any]:
    """Return the column `name` from the reward's keyword arguments, checked against the batch size.

    Args:
        kwargs (`Mapping[str, Any]`): the keyword arguments the reward received.
        name (`str`): the column name.
        size (`int`): the number of completions; the column must have as many values.
        reward (`str`): the reward's name, for the error message.
        hint (`str`, *optional*, defaults to `""`): what the column should hold, appended to the error message.

    Returns:
        `list[Any]`: the column values.

    Raises:
        VLMGRPOError: when the column is absent or its length differs from `size`.
    """
    values = kwargs.get(name)
    if values is None:
        raise VLMGRPOError(
            f"Reward '{reward}' needs the dataset column '{name}', which is missing. "
            f"Add a '{name}' column to the dataset{': ' + hint if hint else ''}."
        )
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise VLMGRPOError(
            f"Reward '{reward}' expected the column '{name}' as a list with one value per completion, "
            f"got {type(values).__name__}."
        )
    values = list(values)
    if len(values) != size:
        raise VLMGRPOError(
            f"Reward '{reward}': column '{name}' has {len(values)} values for {size} completions; "
            "every column must hold one value per completion."
        )
    return values


def require_value(value: Any, name: str, index: int, reward: str, hint: str = "") -> Any:
    """Return one record's value of a column, raising when it is `None`.

    Args:
        value (`Any`): the record's value.
        name (`str`): the column name, for the error message.
        index (`int`): the record's position in the batch, for the error message.
        reward (`str`): the reward's name, for the error message.
        hint (`str`, *optional*, defaults to `""`): what the column should hold, appended to the error message.

    Returns:
        `Any`: `value` itself.

    Raises:
        VLMGRPOError: when `value` is `None`.
    """
    if value is None:
        raise VLMGRPOError(
            f"Reward '{reward}' needs the dataset column '{name}', but it is missing (None) for the record at "
            f"batch position {index}. Fill '{name}' for every record{': ' + hint if hint else ''}."
        )
    return value


def batch_size(completions: Any, solution: Any = None) -> int:
    """Number of completions, checking that `solution` (when given) is aligned with them.

    Args:
        completions (`Sequence`): the completions.
        solution (`Sequence | None`, *optional*, defaults to `None`): the `solution` column, or `None`.

    Returns:
        `int`: `len(completions)`.

    Raises:
        VLMGRPOError: when `solution` has a different length.
    """
    size = len(completions)
    if solution is not None and (isinstance(solution, str) or len(solution) != size):
        raise VLMGRPOError(
            f"The 'solution' column must be a list with one value per completion ({size}), "
            f"got {type(solution).__name__}"
            + ("" if isinstance(solution, str) else f" of length {len(solution)}")
            + "."
        )
    return size
