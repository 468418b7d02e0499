"""Whole conversations with a tool: a supervised warm start on them, which gives a model that never calls a tool its
first calls before GRPO (`warm_start_with_tools`), and a greedy evaluation that runs the tool.

Both render conversations with the model's own chat template and tools, as the trainer does: the warm start trains
on every assistant turn (tool calls included) of a conversation with its images, the prompt's and the tool's; the
evaluation generates greedily, runs the first call it finds (the JSON between `<tool_call>` tags that the Qwen3-VL
template writes), and generates the answer after the tool's result.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_call(text: str) -> dict[str, Any] | None:
    """The first tool call written in `text` (`{"name": ..., "arguments": {...}}`), or None."""
    match = _CALL.search(text)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return None
    return call


def call_turns(call: dict[str, Any], result: list[dict[str, Any]] | str) -> list[dict[str, Any]]:
    """The assistant turn that makes `call` and the tool turn that answers it with `result` (content parts, or text)."""
    function = {"name": call["name"], "arguments": call["arguments"]}
    if isinstance(result, str):
        content: list[dict[str, Any]] | str = result
    else:
        content = [{"type": "image"} if part["type"] == "image" else part for part in result]
    return [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]},
        {"role": "tool", "name": call["name"], "content": content},
    ]


def _count_images(messages: Sequence[dict[str, Any]]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image"
    )


def _encode(processor: Any, messages: list, images: list, tools: list, generation_prompt: bool) -> list[int]:
    text = processor.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False
    )
    images = images[: _count_images(messages)] or None
    return list(processor(text=[text], images=images)["input_ids"][0])


def supervised_row(
    processor: Any, messages: list[dict[str, Any]], images: list[Any], tools: list[Callable]
) -> tuple[list[int], list[int]]:
    """`(input_ids, labels)` of one conversation: the labels are the assistant turns' tokens (through their end of
    turn token), -100 elsewhere.

    Args:
        processor (`ProcessorMixin`): the model's processor (its chat template renders the tools).
        messages (`list[dict]`): the conversation, with `{"type": "image"}` parts in the user and tool turns.
        images (`list[PIL.Image.Image]`): its images, in order.
        tools (`list[Callable]`): the tools the template describes (none: an empty list).
    """
    ids = _encode(processor, messages, images, tools, generation_prompt=False)
    labels = [-100] * len(ids)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = _encode(processor, messages[:k], images, tools, generation_prompt=True)
        start = len(prefix)
        end = len(_encode(processor, messages[: k + 1], images, tools, generation_prompt=False))
        if ids[:start] != prefix:
            raise ValueError("the chat template does not render a conversation's turns as its prefixes")
        while end > start and not processor.tokenizer.decode(ids[end - 1 : end]).strip():
            end -= 1  # the newline after the end of turn (Gemma 4 ends a call with `<|tool_response>`, kept)
        labels[start:end] = ids[start:end]
    return ids, labels


def tool_conversations(
    rows: Iterable[dict[str, Any]],
    calls: Sequence[dict[str, Any] | None],
    answers: Sequence[str],
    tools: Sequence[Callable] = (),
    environment_factory: Callable[[], Any] | None = None,
) -> list[tuple[list[dict[str, Any]], list[Any]]]:
    """Conversations in which the assistant calls a tool and answers after its result, one per row.

    Each is the row's prompt (with its environment's `reset` observation, as GRPO gives it), an assistant turn that
    makes the row's call, the tool's real result (run on the row: its environment is reset with it), and an
    assistant turn with the row's answer. A tool's result joins as in GRPO: a list of content parts as it is (its
    images after the prompt's), anything else as text.

    Args:
        rows (`Iterable[dict]`): dataset rows (`prompt`, `images`, and the columns the environment's `reset` reads),
            e.g. those of `vlm_grpo.data.load_data_config`.
        calls (`Sequence[dict | None]`): per row, the call the assistant makes, `{"name": ..., "arguments": {...}}`;
            None answers without a call.
        answers (`Sequence[str]`): per row, the text of the final answer.
        tools (`Sequence[Callable]`, *optional*, defaults to `()`): tools, as the trainer's `tools`.
        environment_factory (`Callable`, *optional*, defaults to `None`): an environment class, as the trainer's
            `environment_factory`: one instance, reset with each row (`reset(**row)`); its public methods are tools.

    Returns:
        `list[tuple[list[dict], list[PIL.Image.Image]]]`: `(messages, images)` per row, the messages with
        `{"type": "image"}` parts standing for the images, in order.

    Raises:
        `ValueError`: `calls` or `answers` do not have one entry per row, a call names no tool, or a tool or the
            environment's `reset` raised (the message names the row).
    """
    from ..rollout.environments import environment_methods, reset_environments

    rows = list(rows)
    if not len(rows) == len(calls) == len(answers):
        raise ValueError(
            f"{len(rows)} rows, {len(calls)} calls and {len(answers)} answers: give one of each per row"
        )
    environment = environment_factory() if environment_factory is not None else None
    conversations = []
    for i, (row, call, answer) in enumerate(zip(rows, calls, answers, strict=True)):
        messages, images = list(row["prompt"]), list(row.get("images") or [])
        if environment is not None:
            prompts, failures = reset_environments([messages], [environment], [row], multi_environment=False)
            if failures[0]:
                raise ValueError(f"row {i}: {failures[0]}")
            messages = prompts[0]
        if call is not None:
            available = {
                t.__name__: t for t in [*tools, *(environment_methods(environment) if environment else [])]
            }
            if call["name"] not in available:
                raise ValueError(f"row {i}: no tool {call['name']!r} among {sorted(available)}")
            try:
                result = available[call["name"]](**call["arguments"])
            except Exception as error:  # the user's tool: say which row's call failed
                raise ValueError(f"row {i}: {call['name']}({call['arguments']}) raised {error!r}") from error
            result = result if isinstance(result, list) else str(result)
            messages += call_turns(call, result)
            if isinstance(result, list):
                images += [part["image"] for part in result if part.get("type") == "image"]
        conversations.append(([*messages, {"role": "assistant", "content": answer}], images))
    return conversations


def warm_start_with_tools(
    model: str | Path,
    rows: Iterable[dict[str, Any]],
    calls: Sequence[dict[str, Any] | None],
    answers: Sequence[str],
    output_dir: str | Path,
    tools: Sequence[Callable] = (),
    environment_factory: Callable[[], Any] | None = None,
    epochs: int = 2,
    learning_rate: float = 1e-5,
    batch_size: int = 8,
    seed: int = 0,
    device: str | None = None,
) -> float:
    """Warm-start a model that never calls a tool: fine-tune it on conversations that call the tool, then run GRPO
    from `output_dir`.

    The conversations are `tool_conversations(rows, calls, answers, tools, environment_factory)`, rendered with the
    model's chat template and the same tools as GRPO renders them; the loss is on the assistant turns (the call and
    the answer), not on the prompt or the tool's result. The fine-tune is a full one in float32 with AdamW.

    Args:
        model (`str | Path`): the model to start from (a folder or a Hub id).
        rows (`Iterable[dict]`): dataset rows, e.g. those of `vlm_grpo.data.load_data_config`.
        calls (`Sequence[dict | None]`): per row, the call the assistant makes, `{"name": ..., "arguments": {...}}`.
        answers (`Sequence[str]`): per row, the text of the final answer.
        output_dir (`str | Path`): where the warmed model and its processor are saved.
        tools (`Sequence[Callable]`, *optional*, defaults to `()`): tools, as the trainer's `tools`.
        environment_factory (`Callable`, *optional*, defaults to `None`): an environment class, as the trainer's
            `environment_factory`.
        epochs (`int`, *optional*, defaults to `2`): passes over the conversations.
        learning_rate (`float`, *optional*, defaults to `1e-5`): AdamW's constant learning rate. A randomly
            initialised model learns the call with far more (the zoom demo's tiny model: `3e-3`, 32 epochs).
        batch_size (`int`, *optional*, defaults to `8`): conversations per step.
        seed (`int`, *optional*, defaults to `0`): seed of the order.
        device (`str`, *optional*, defaults to `None`): where the model trains (a torch device name); `None` is
            the first GPU when there is one, else the CPU.

    Returns:
        `float`: seconds spent training.
    """
    from ..rollout.environments import environment_methods

    rendered = [
        *tools,
        *(environment_methods(environment_factory()) if environment_factory is not None else []),
    ]
    conversations = tool_conversations(rows, calls, answers, tools, environment_factory)
    return warm_start_conversations(
        model, conversations, rendered, Path(output_dir), epochs=epochs, learning_rate=learning_rate,
        batch_size=batch_size, seed=seed, device=device,
    )  # fmt: skip


def warm_start_conversations(
    model_dir: str | Path,
    conversations: Sequence[tuple[list[dict[str, Any]], list[Any]]],
    tools: list[Callable],
    output_dir: Path,
    epochs: int = 4,
    learning_rate: float = 3e-3,
    batch_size: int = 16,
    seed: int = 0,
    device: str | None = None,
) -> float:
    """Supervised warm start on whole conversations (every assistant turn), saved to `output_dir`; returns seconds.

    Args:
        model_dir (`str | Path`): the model to start from.
        conversations (`Sequence[tuple[list, list]]`): `(messages, images)` per record.
        tools (`list[Callable]`): the tools the chat template describes (as GRPO will render them).
        output_dir (`Path`): where the warmed model and its processor are saved.
        epochs (`int`, *optional*, defaults to `4`): passes over the conversations.
        learning_rate (`float`, *optional*, defaults to `3e-3`): AdamW's constant learning rate.
        batch_size (`int`, *optional*, defaults to `16`): conversations per step.
        seed (`int`, *optional*, defaults to `0`): seed of the order.
        device (`str`, *optional*, defaults to `None`): where the model trains; `None` is the first GPU when there is
            one (or NPU), else the CPU.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..device import default_device

    device = device or default_device()
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype="float32").to(device)
    rows = [supervised_row(processor, m, images, tools) for m, images in conversations]
    texts_of = [
        processor.apply_chat_template(m, tools=tools or None, tokenize=False) for m, _ in conversations
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(rows), generator=generator).tolist()
        for first in range(0, len(order), batch_size):
            batch = order[first : first + batch_size]
            texts = [texts_of[i] for i in batch]
            images = [image for i in batch for image in conversations[i][1]]
            inputs = processor(
                text=texts, images=images or None, padding=True, padding_side="right", return_tensors="pt"
            ).to(device)
            width = inputs["input_ids"].shape[1]
            labels = [rows[i][1] + [-100] * (width - len(rows[i][1])) for i in batch]
            labels = torch.tensor(labels, device=device)  # [b, L]
            loss = model(**inputs, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    seconds = time.perf_counter() - start
    model.save_pretrained(str(output_dir))
    processor.save_pretrained(str(output_dir))
    print(f"warm start: {len(rows)} conversations x {epochs} epochs in {seconds:.0f} s", flush=True)
    return seconds


def _generate(
    model: Any, processor: Any, texts: list[str], images: list[list[Any]], tokens: int
) -> list[str]:
    """Greedy completions of rendered prompts `texts` (with their images), decoded without special tokens."""
    inputs = processor(
        text=texts, images=[i for row in images for i in row], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)  # [n, L + tokens]
    return processor.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def answer_with_tool(
    model_dir: str | Path,
    rows: Sequence[dict[str, Any]],
    make_tool: Callable[[dict[str, Any]], Callable] | None,
    call_tokens: int = 32,
    answer_tokens: int = 8,
    batch_size: int = 64,
) -> list[dict[str, Any]]:
    """Greedy answers of the model to `rows`, with one tool call allowed: `{"call": dict | None, "answer": str}`.

    Args:
        model_dir (`str | Path`): the model.
        rows (`Sequence[dict]`): dataset rows (`prompt`, `images` and the columns `make_tool` reads).
        make_tool (`Callable[[dict], Callable]`): the row's tool (reset for the row); None offers no tool (the prompt
            renders none, and the first turn is the answer).
        call_tokens (`int`, *optional*, defaults to `32`): budget of the first turn.
        answer_tokens (`int`, *optional*, defaults to `8`): budget of the turn after the tool's result.
        batch_size (`int`, *optional*, defaults to `64`): rows per `generate`.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype="float32").eval()
    results = []
    for first in range(0, len(rows), batch_size):
        batch = list(rows[first : first + batch_size])
        tools = [make_tool(row) if make_tool else None for row in batch]
        render = processor.apply_chat_template
        texts = [
            render(r["prompt"], tools=[t] if t else None, add_generation_prompt=True, tokenize=False)
            for r, t in zip(batch, tools, strict=True)
        ]
        replies = _generate(model, processor, texts, [r["images"] for r in batch], call_tokens)
        followed, conversations = [], []
        for row, tool, reply in zip(batch, tools, replies, strict=True):
            call = parse_call(reply)
            results.append({"call": call, "answer": reply.strip()})
            if tool is None or call is None or call.get("name") != tool.__name__:
                continue
            try:
                result = tool(**call["arguments"])
            except (TypeError, ValueError) as error:  # what TRL reports to the model as an error
                result = [{"type": "text", "text": json.dumps({"error": str(error)})}]
            images = [*row["images"], *(part["image"] for part in result if part["type"] == "image")]
            messages = [*row["prompt"], *call_turns(call, result)]
            followed.append(len(results) - 1)
            text = render(messages, tools=[tool], add_generation_prompt=True, tokenize=False)
            conversations.append((text, images))
        if followed:
            texts, images = [c[0] for c in conversations], [c[1] for c in conversations]
            for index, answer in zip(followed, _generate(model, processor, texts, images, answer_tokens)):
                results[index]["answer"] = answer.strip()
    return results
