"""Multi-turn rollouts with tools (TRL's `tools` and `environment_factory`) for vision-language models.

TRL 1.16 runs the tool loop itself (`GRPOTrainer._tool_call_loop`): it parses each completion's tool calls, runs the
sync and async tools (a failure is reported to the model as `{"error": ...}`), appends the tool messages with the
chat template's own tokens (tool results that are content lists may hold images), rolls back a result that would
push the row past `max_completion_length` or the model's context, generates the next turn of every row that called
a tool, and repeats up to `max_tool_calling_iterations`. It returns the rows' `tool_mask` (0 on tool-result tokens,
which the loss leaves out) and the images the tools returned.

`VLMGRPOTrainer` keeps that loop, so the semantics are TRL's, and supplies what is model-specific around it: the
first turn is sampled as any rollout (each group's prompt encoded and prefilled once), the next turns go through the
family's module (`VLMGRPOTrainer._generate_single_turn`), and a row whose tools returned images gets its own image
inputs, the prompt's images followed by the tools', in the order their placeholders appear (`row_image_inputs`,
`ToolImageRow`). Each group's prompt still runs once after the first turn: the next turns find the prompt each row
starts with (`history_prompts`) and continue it from one prefill, and the log-prob passes feed the tools' images to
the completions' forward over the prompt's cache (see `shared_prefix`).

This module holds those pieces and the per-batch setup TRL does in its own `_generate_and_score_completions`:
the environments drawn from their pool and reset (`reset_environments`), and each row's tools (`tool_dicts`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import MethodType
from typing import Any

import torch

from .models import EncodedPrompt, ModelFamily


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
) -> list[list[dict[str, Any]]]:
    """Each row's prompt with its environment's `reset()` observation appended to the last message (as TRL 1.16).

    Args:
        prompts (`list[list[dict]]`): the rows' conversational prompts (not modified).
        environments (`Sequence`): one environment instance per row.
        inputs (`Sequence[dict]`): the dataset rows, passed to `reset` as keyword arguments (without `environment`
            when rows name their environment).
        multi_environment (`bool`): rows name their environment.
    """
    out = []
    for prompt, environment, x in zip(prompts, environments, inputs, strict=True):
        kwargs = {k: v for k, v in x.items() if k != "environment"} if multi_environment else x
        observation = environment.reset(**kwargs)
        if observation is None:
            out.append(prompt)
            continue
        content = prompt[-1]["content"]
        if isinstance(observation, list) and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if isinstance(observation, str) and isinstance(content, list):
            observation = [{"type": "text", "text": observation}]
        out.append(prompt[:-1] + [{**prompt[-1], "content": content + observation}])
    return out


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


class ToolImageRow(dict):
    """The image inputs of a row whose tools returned images: the prompt's images followed by the tools', in the order
    their placeholders appear, as one dict (what a full-row forward takes), which also keeps its two parts.

    `prompt` is the group's own dict (the same object in every row of the group, which is how groups are found) and
    `tools` the tools' images of this row, which a shared-prefix pass feeds to the completion's forward.

    Args:
        images (`dict[str, torch.Tensor]`): the row's image inputs, `ModelFamily.collate([prompt, tools])`.
        prompt (`dict[str, torch.Tensor]`): the prompt's image inputs (`EncodedPrompt.image_inputs`).
        tools (`dict[str, torch.Tensor]`): the image inputs of the images the row's tools returned.
    """

    def __init__(
        self, images: dict[str, torch.Tensor], prompt: dict[str, torch.Tensor], tools: dict[str, torch.Tensor]
    ):
        super().__init__(images)
        self.prompt = prompt
        self.tools = tools


def prompt_images(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image inputs of a row's prompt: the row's own, or the prompt part of a `ToolImageRow`."""
    return row.prompt if isinstance(row, ToolImageRow) else row


def completion_images(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image inputs of the images inside a row's completion: those of its tools (`ToolImageRow`), or none."""
    return row.tools if isinstance(row, ToolImageRow) else {}


def image_parts(rows: Sequence[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """The rows' image dicts split into their parts, in placeholder order (a `ToolImageRow` gives its prompt's and
    its tools'): concatenated, they hold exactly the tensors of the rows."""
    return [
        part
        for row in rows
        for part in ((row.prompt, row.tools) if isinstance(row, ToolImageRow) else (row,))
    ]


def history_prompts(
    histories: Sequence[Sequence[int]],
    images: Sequence[Sequence[Any] | None] | None,
    prompts: Sequence[tuple[EncodedPrompt, Sequence[Any]]],
) -> list[EncodedPrompt] | None:
    """The encoded prompt each multi-turn row starts with, found among the batch's prompts; None if a row starts with
    none of them.

    A row starts with a prompt when its ids begin with the prompt's ids and its images with the prompt's very image
    objects (TRL's tool loop keeps them, and appends the tools' images after them).

    Args:
        histories (`Sequence[Sequence[int]]`): the rows' ids: prompt, turns so far and tool results.
        images (`Sequence`, *optional*): each row's images (the prompt's, then the tools'), or None for none at all.
        prompts (`Sequence[tuple[EncodedPrompt, Sequence[PIL.Image.Image]]]`): the batch's distinct prompts, each
            with the images of its rows.
    """
    found = []
    for ids, pictures in zip(histories, images or [None] * len(histories), strict=True):
        pictures = pictures or []
        match = next(
            (
                prompt
                for prompt, shown in prompts
                if len(shown) <= len(pictures)
                and all(a is b for a, b in zip(shown, pictures, strict=False))
                and list(ids[: len(prompt.input_ids)]) == prompt.input_ids
            ),
            None,
        )
        if match is None:
            return None
        found.append(match)
    return found


def row_image_inputs(
    family: ModelFamily,
    processor: Any,
    encoded: Sequence[EncodedPrompt],
    tool_images: Sequence[Sequence[Any]],
    device: torch.device,
) -> list[dict[str, torch.Tensor]]:
    """Each row's image inputs: its prompt's (shared by its group), or for a row whose tools returned images, a
    `ToolImageRow` holding the prompt's images followed by the tools'.

    Args:
        family (`ModelFamily`): the family's module (`encode_images`, `collate`).
        processor (`ProcessorMixin`): the family's processor.
        encoded (`Sequence[EncodedPrompt]`): the rows' encoded prompts.
        tool_images (`Sequence[Sequence[PIL.Image.Image]]`): the images each row's tools returned, in order.
        device (`torch.device`): where the tensors go.
    """
    rows = []
    for prompt, images in zip(encoded, tool_images, strict=True):
        if not images:
            rows.append(prompt.image_inputs)
            continue
        tools = {k: v.to(device) for k, v in family.encode_images(processor, images).items()}
        rows.append(ToolImageRow(family.collate([prompt.image_inputs, tools]), prompt.image_inputs, tools))
    return rows


def tool_metrics(calls: float, failures: float, rows: float) -> dict[str, float]:
    """TRL's `tools/*` metrics from the counts summed over processes: calls per row, and failures per call.

    Args:
        calls (`float`): tool calls made.
        failures (`float`): calls that failed (unknown tool, an exception, an unsupported call type).
        rows (`float`): rows sampled.
    """
    return {
        "tools/call_frequency": calls / rows,
        "tools/failure_frequency": failures / calls if calls > 0 else 0.0,
    }
