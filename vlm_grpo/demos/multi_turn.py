"""Whole conversations for a demo whose model calls a tool: a supervised warm start on them and a greedy evaluation
that runs the tool.

Both render conversations with the model's own chat template and tools, as the trainer does: the warm start trains
on every assistant turn (tool calls included) of a conversation with its images, the prompt's and the tool's; the
evaluation generates greedily, runs the first call it finds (the JSON between `<tool_call>` tags that the Qwen3-VL
template writes), and generates the answer after the tool's result.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
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


def call_turns(call: dict[str, Any], result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The assistant turn that makes `call` and the tool turn that answers it with the content parts `result`."""
    function = {"name": call["name"], "arguments": call["arguments"]}
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
        end -= 1  # the newline after the end of turn
        labels[start:end] = ids[start:end]
    return ids, labels


def warm_start_conversations(
    model_dir: str | Path,
    conversations: Sequence[tuple[list[dict[str, Any]], list[Any]]],
    tools: list[Callable],
    output_dir: Path,
    epochs: int = 4,
    learning_rate: float = 3e-3,
    batch_size: int = 16,
    seed: int = 0,
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
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype="float32")
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
                text=texts, images=images, padding=True, padding_side="right", return_tensors="pt"
            )
            width = inputs["input_ids"].shape[1]
            labels = torch.tensor([rows[i][1] + [-100] * (width - len(rows[i][1])) for i in batch])  # [b, L]
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
