"""Environments and tools of a batch's rows, drawn and reset as TRL 1.16 does."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import MethodType
from typing import Any


def draw_environments(
    inputs: Sequence[dict[str, Any]],
    factories: dict[Any, Callable[[], Any]],
    pool: dict[Any, list[Any]],
    multi_environment: bool,
) -> tuple[list[Any], list[Any]]:
    """`(names, instances)`: each row's environment and one instance of it per row, drawn from the pool (as TRL 1.16).

    Args:
        inputs (`Sequence[dict]`): the batch's dataset rows.
        factories (`dict`): `{name: factory}` (TRL's `environment_factories`; one unnamed environment is `None`).
        pool (`dict`): `{name: [instances]}`, reused across batches and grown when a batch needs more instances.
        multi_environment (`bool`): a row names its environment in its `environment` field.

    Raises:
        `ValueError`: a row names an environment that no factory builds (TRL's message).
    """
    names = [x.get("environment") if multi_environment else None for x in inputs]
    unknown = sorted({str(n) for n in names if n not in factories})
    if unknown:
        raise ValueError(
            f"Example has `environment={unknown[0]!r}`, which is not among the environments passed to "
            f"`environment_factory`. Expected one of: {list(factories)}."
        )
    cursor: dict[Any, int] = {}
    instances = []
    for name in names:
        index = cursor.get(name, 0)
        if index == len(pool[name]):
            pool[name].append(factories[name]())
        cursor[name] = index + 1
        instances.append(pool[name][index])
    return names, instances


def reset_environments(
    prompts: list[list[dict[str, Any]]],
    environments: Sequence[Any],
    inputs: Sequence[dict[str, Any]],
    multi_environment: bool,
) -> tuple[list[list[dict[str, Any]]], list[str | None]]:
    """Each row's prompt with its environment's `reset()` observation appended to the last message (as TRL 1.16), and
    for each row the error its `reset()` raised (None where it did not).

    A `reset()` that raises fails its row only (TRL stops the run): the row keeps its prompt, and the trainer gives it
    no reward, so that it does not train (see `VLMGRPOTrainer._score`).

    Args:
        prompts (`list[list[dict]]`): the rows' conversational prompts (not modified).
        environments (`Sequence`): one environment instance per row.
        inputs (`Sequence[dict]`): the dataset rows, passed to `reset` as keyword arguments (without `environment`
            when rows name their environment).
        multi_environment (`bool`): rows name their environment.
    """
    out, failures = [], []
    for prompt, environment, x in zip(prompts, environments, inputs, strict=True):
        kwargs = {k: v for k, v in x.items() if k != "environment"} if multi_environment else x
        try:
            observation = environment.reset(**kwargs)
        except Exception as error:  # the user's environment: its row fails, not the run
            observation = None
            failures.append(f"{type(environment).__name__}.reset raised {type(error).__name__}: {error}")
        else:
            failures.append(None)
        if observation is None:
            out.append(prompt)
            continue
        content = prompt[-1]["content"]
        if isinstance(observation, list) and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if isinstance(observation, str) and isinstance(content, list):
            observation = [{"type": "text", "text": observation}]
        out.append(prompt[:-1] + [{**prompt[-1], "content": content + observation}])
    return out, failures


def environment_methods(environment: Any) -> list[Callable]:
    """The public methods of an environment that are tools (all but `reset` and `get_reward`), as TRL lists them."""
    return [
        MethodType(function, environment)
        for name, function in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def tool_dicts(
    standalone: Sequence[Callable], environments: Sequence[Any] | None, rows: int
) -> tuple[list[dict[str, Callable]], list[dict[str, Callable]]]:
    """`(sync, async)` tools of each row by name: the standalone tools plus the row's environment's methods.

    Args:
        standalone (`Sequence[Callable]`): tools given as `tools=`.
        environments (`Sequence`, *optional*): the rows' environment instances, or None.
        rows (`int`): rows of the batch.
    """
    sync, asynchronous = [], []
    for i in range(rows):
        methods = environment_methods(environments[i]) if environments else []
        sync.append({t.__name__: t for t in [*standalone, *methods] if not inspect.iscoroutinefunction(t)})
        asynchronous.append(
            {t.__name__: t for t in [*standalone, *methods] if inspect.iscoroutinefunction(t)}
        )
    return sync, asynchronous


def tool_metrics(calls: float, failures: float, timeouts: float, rows: float) -> dict[str, float]:
    """The `tools/*` metrics from the counts summed over processes: TRL's calls per row and failures per call, and
    the calls that ran past `tool_timeout`, per call.

    Args:
        calls (`float`): tool calls made.
        failures (`float`): calls that failed (unknown tool, an exception, an unsupported call type, a timeout).
        timeouts (`float`): calls that ran past `tool_timeout`.
        rows (`float`): rows sampled.
    """
    return {
        "tools/call_frequency": calls / rows,
        "tools/failure_frequency": failures / calls if calls > 0 else 0.0,
        "tools/timeout_frequency": timeouts / calls if calls > 0 else 0.0,
    }
