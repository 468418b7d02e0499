"""A logged step's samples, written by every process together: each group's prompt, completions (every turn, tool
calls and results), rewards and advantages, with the images tools returned saved beside them (see `sample_log`)."""

from __future__ import annotations

import json
from typing import Any, Protocol

import torch
from accelerate.utils import gather_object

from ..data.rows import image_names
from .monitoring import sample_records
from .sample_log import samples_path, write_samples

_SAMPLE_KEYS = ("prompt", "image_paths", "videos", "solution", "id")


def _gathered_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fields of each row a sample record keeps, from every process (a collective call)."""
    kept = [{k: x[k] for k in _SAMPLE_KEYS if k in x} | {"image_paths": x.get("image_paths") or image_names(x)}
            for x in rows]  # fmt: skip
    return gather_object(kept)


def completion_text(messages: list[dict[str, Any]]) -> str:
    """A completion's messages as one text: each turn's text, its tool calls (`name(arguments)`) and the tool results
    (text, and `[image]` where a tool returned an image), in order.

    Args:
        messages (`list[dict]`): the completion's messages (one without tools).
    """
    parts = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(
                p["text"] if p.get("type") == "text" else f"[{p.get('type')}]" for p in content
            )
        if message["role"] == "tool":
            parts.append(f"[{message.get('name', 'tool')} -> {content}]")
            continue
        calls = [c.get("function", c) for c in message.get("tool_calls") or ()]
        parts += [content] if content else []
        parts += [f"{c['name']}({json.dumps(c.get('arguments', {}), sort_keys=True)})" for c in calls]
    return "\n".join(parts)


def tool_images_of(messages: list[dict[str, Any]]) -> list[Any]:
    """The images a completion's tools returned (the `image` of each image part of its tool messages), in order."""
    return [
        part["image"]
        for message in messages
        if message.get("role") == "tool" and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None
    ]


def save_tool_images(output_dir: str, name: str, images: list[list[Any]]) -> list[list[str]] | None:
    """Save each row's tool images as `samples/images/{name}_{row}_{k}.png`; their paths relative to `output_dir`,
    one list per row, or None when no row has any.

    Args:
        output_dir (`str`): the run's output folder.
        name (`str`): the files' prefix (`"step_000010"`, `"step_000010_dropped"`).
        images (`list[list[PIL.Image.Image]]`): each row's tool images.
    """
    if not any(images):
        return None
    folder = samples_path(output_dir, 0).parent / "images"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for row, row_images in enumerate(images):
        paths.append([])
        for k, image in enumerate(row_images):
            file = folder / f"{name}_{row:04d}_{k}.png"
            image.save(file)
            paths[-1].append(f"{folder.parent.name}/{folder.name}/{file.name}")
    return paths


class SampledRows(Protocol):
    """What a step's sample records are written from: the dataset rows and their completions (`rollout.Sampled`)."""

    inputs: list[dict[str, Any]]
    completions: list[list[dict[str, Any]]]


def write_step_samples(
    output_dir: str,
    global_step: int,
    names: list[str],
    sampled: SampledRows,
    rewards_per_func: torch.Tensor,
    advantages: torch.Tensor,
    num_generations: int,
    is_main_process: bool,
    dropped: tuple[SampledRows, torch.Tensor] | None = None,
    logged: dict[str, list] | None = None,
) -> None:
    """Write one rollout's groups to `output_dir/samples/` (main process); every process must call it.

    The records and the file are numbered by the step the rollout trains as, `global_step + 1`: the first rollout is
    step 1, as on the console, in `trainer_state.json` and on the curves (see `vlm_grpo.runtime.sample_log`).

    Args:
        output_dir (`str`): the run's output folder.
        global_step (`int`): the trainer's `state.global_step` when the rollout was generated (optimizer steps done).
        names (`list[str]`): the reward functions' names.
        sampled (`SampledRows`): this process's rows and completions.
        rewards_per_func (`torch.Tensor`): `[N, F]` rewards of every process's rows.
        advantages (`torch.Tensor`): `[N]` advantages of every process's rows.
        num_generations (`int`): completions per prompt.
        is_main_process (`bool`): whether this process writes.
        dropped (`tuple[SampledRows, torch.Tensor]`, *optional*, defaults to `None`): with dynamic sampling, this
            process's dropped rows and their rewards `[m, F]`, written too and marked `"dropped": true`.
        logged (`dict[str, list]`, *optional*, defaults to `None`): the rewards' `log_extra` columns, one value per row
            of every process (a judge's replies), written with the rows trained on as `logged`.
    """

    def by_name(values: torch.Tensor) -> dict[str, list[float]]:
        return {name: values[:, i].tolist() for i, name in enumerate(names)}

    def texts(part: SampledRows) -> list[str]:
        return gather_object([completion_text(c) for c in part.completions])

    def images(part: SampledRows, name: str) -> list[list[str]] | None:
        gathered = gather_object([tool_images_of(c) for c in part.completions])  # every process calls it
        return save_tool_images(output_dir, name, gathered) if is_main_process else None

    step = global_step + 1
    rows, all_texts = _gathered_rows(sampled.inputs), texts(sampled)
    tool_images = images(sampled, f"step_{step:06d}")
    extra = []
    if dropped is not None:
        part, local = dropped
        dropped_rows, dropped_texts = _gathered_rows(part.inputs), texts(part)
        dropped_images = images(part, f"step_{step:06d}_dropped")
        dropped_rewards = torch.tensor(gather_object(local.tolist())).view(-1, len(names))  # [M, F]
        nan = [float("nan")] * len(dropped_rows)
        extra = sample_records(
            step, dropped_rows, dropped_texts, by_name(dropped_rewards), nan, num_generations, dropped_images
        )
    if not is_main_process:
        return
    records = sample_records(
        step, rows, all_texts, by_name(rewards_per_func), advantages.tolist(), num_generations, tool_images, logged,
    )  # fmt: skip
    records += [{**record, "dropped": True} for record in extra]
    write_samples(samples_path(output_dir, step), records)
