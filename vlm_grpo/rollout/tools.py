"""The tool loop: TRL 1.16's multi-turn rollout with tools, with every process in step and every call bounded.

After the first turn, each completion's tool calls run (sync tools in order, a row's async tools together on TRL's
event loop); their results join the row as tool messages, with the chat template's own tokens between turns
(`ToolSuffix`); a result that would push the row past `max_completion_length` or the model's context is
rolled back; the rows that called a tool sample their next turn; and so on, up to `max_tool_calling_iterations`. A
failed call (an unknown tool, an exception, a call that ran past `tool_timeout`) is reported to the model as
`{"error": ...}`. The rows' `tool_mask` is 0 on tool results (left out of the loss) and 1 on the model's tokens; the
images tools return join the row's images in order. All of this is TRL's `GRPOTrainer._tool_call_loop`, which the
parity tests compare turn by turn (`tests/test_tools.py`).

Two differences, both beyond TRL:
- Every process runs the same number of turns: the loop goes on while a row on any process still calls a tool
  (`agree_max`), and a process with no row to continue still takes part in the turn's generation (which gathers
  the ZeRO-3 model and runs collectives in every forward, or collects every process's prompts in vLLM server mode)
  with a filler row, its first row's history, whose next turn is dropped. In TRL a process whose rows stopped
  calling leaves the loop, and the others wait for it in their next gather.
- `tool_timeout` bounds each call, sync or async: a call still running after it is reported as failed and counted
  in `tools/timeout_frequency` (TRL waits forever). A sync tool then runs in a daemon thread, which is left to end
  on its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import ProcessorMixin
from trl.chat_template_utils import parse_response

from ..models import EncodedPrompt
from .tool_suffix import ToolSuffix

Generate = Callable[
    [list[list[int]], list[list | None], bool, int], tuple[list[list[int]], list[list[float]] | None]
]
"""`(histories, images, has_tool_images, most_rows) -> (next turn ids, their log-probs or None)`, one per row."""


class ToolTimeout(Exception):
    """A tool call ran past `tool_timeout`."""


@dataclass
class ToolBox:
    """What each row of a batch may call.

    Attributes:
        sync (`list[dict[str, Callable]]`): each row's sync tools by name.
        asynchronous (`list[dict[str, Callable]]`): each row's async tools by name.
        schemas (`list[list[Callable]]`): the tools each row's prompt renders (they type the calls' arguments).
    """

    sync: list[dict[str, Callable]]
    asynchronous: list[dict[str, Callable]]
    schemas: list[list[Callable]]


@dataclass
class ToolTurns:
    """What the tool loop made of a batch, per row.

    Attributes:
        completion_ids (`list[list[int]]`): every turn's ids (the model's and the tool results between them).
        completions (`list[list[dict]]`): every message (assistant turns and tool results).
        tool_mask (`list[list[int]]`): 1 on the model's tokens, 0 on tool results.
        logprobs (`list[list[float]] | None`): with vLLM, the sampled tokens' log-probs (0 on tool results).
        tool_images (`list[list]`): the images each row's tools returned, in order.
        calls (`list[int]`): tool calls each row made.
        failures (`list[int]`): calls of each row that failed (timeouts included).
        timeouts (`list[int]`): calls of each row that ran past `tool_timeout`.
    """

    completion_ids: list[list[int]]
    completions: list[list[dict[str, Any]]]
    tool_mask: list[list[int]]
    logprobs: list[list[float]] | None
    tool_images: list[list[Any]]
    calls: list[int]
    failures: list[int]
    timeouts: list[int]


def call_with_timeout(tool: Callable, arguments: dict[str, Any], timeout: float | None) -> Any:
    """`tool(**arguments)`, or `ToolTimeout` when it runs past `timeout` seconds (None: no bound, in this thread)."""
    if timeout is None:
        return tool(**arguments)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = tool(**arguments)
        except Exception as error:  # handed to the caller, which reports it to the model as TRL does
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"tool-{tool.__name__}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ToolTimeout(f"{tool.__name__} did not answer within tool_timeout ({timeout:g} s)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class ToolLoop:
    """Runs a batch's tool calls and samples the turns after them (see the module doc).

    Args:
        processor (`ProcessorMixin`): the family's processor (the chat template renders the turns between calls).
        chat_template (`str`, *optional*): TRL's training chat template (prefix-preserving where needed).
        chat_template_kwargs (`dict`): TRL's `chat_template_kwargs`.
        max_iterations (`int`): TRL's `max_tool_calling_iterations`.
        max_completion_length (`int`): the completion budget, tool results included.
        max_model_len (`int`): the generation engine's context (TRL's ceiling for a row).
        async_loop (`asyncio.AbstractEventLoop`, *optional*): TRL's event loop for async tools.
        timeout (`float`, *optional*): `tool_timeout`, seconds per call; None waits as long as a call takes.
    """

    def __init__(
        self,
        processor: ProcessorMixin,
        chat_template: str | None,
        chat_template_kwargs: dict[str, Any],
        max_iterations: int,
        max_completion_length: int,
        max_model_len: int,
        async_loop: asyncio.AbstractEventLoop | None,
        timeout: float | None,
    ):
        self.tokenizer = processor.tokenizer
        self.max_iterations, self.max_completion_length = max_iterations, max_completion_length
        self.max_model_len, self.async_loop, self.timeout = max_model_len, async_loop, timeout
        # the ids the chat template writes after a calling turn (`ToolSuffix`: TRL's `_get_tool_suffix_ids`)
        self.suffix_ids = ToolSuffix(processor, chat_template, chat_template_kwargs)

    def run(
        self,
        prompts: list[list[dict[str, Any]]],
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        completions: list[list[dict[str, Any]]],
        logprobs: list[list[float]] | None,
        images: list[list | None],
        tools: ToolBox,
        generate: Generate,
        agree_max: Callable[[int], int],
    ) -> ToolTurns:
        """Call the tools of every completion that calls one and sample the next turns, until no row calls one.

        Args:
            prompts (`list[list[dict]]`): the rows' conversational prompts (multimodal messages); extended in place
                with each turn, as in TRL.
            prompt_ids (`list[list[int]]`): the rows' prompt ids.
            completion_ids (`list[list[int]]`): the first turn's ids of each row.
            completions (`list[list[dict]]`): the first turn of each row, decoded (its tool calls parsed).
            logprobs (`list[list[float]]`, *optional*): with vLLM, the first turn's sampled log-probs.
            images (`list`): each row's images (None for none).
            tools (`ToolBox`): what each row may call.
            generate (`Generate`): samples the next turn of the given rows (every process calls it each turn, with
                at least one row).
            agree_max (`Callable[[int], int]`): the largest of a count over every process (a collective).
        """
        completion_ids = [list(c) for c in completion_ids]
        logprobs = None if logprobs is None else [list(x) for x in logprobs]
        rows = len(completion_ids)
        turns = ToolTurns(
            completion_ids, completions, [[1] * len(ids) for ids in completion_ids], logprobs,
            [[] for _ in range(rows)], [0] * rows, [0] * rows, [0] * rows,
        )  # fmt: skip
        calling = [i for i, c in enumerate(completions) if c[0].get("tool_calls")]
        iteration = 0
        while iteration < self.max_iterations and agree_max(len(calling)) > 0:
            calling, histories = self._answer(prompts, prompt_ids, calling, turns, tools)
            most_rows = agree_max(len(calling))
            if most_rows == 0:
                break  # every result was rolled back, on every process
            has_tool_images = any(turns.tool_images)
            if not calling:  # other processes continue: take part with a filler row, its turn dropped
                generate([prompt_ids[0] + turns.completion_ids[0]], [images[0]], has_tool_images, most_rows)
            else:
                merged = [((images[i] or []) + turns.tool_images[i]) or None for i in calling]
                next_ids, next_logps = generate(histories, merged, has_tool_images, most_rows)
                calling = self._extend(prompt_ids, calling, histories, next_ids, next_logps, turns, tools)
            iteration += 1
        return turns

    def _answer(
        self,
        prompts: list[list[dict[str, Any]]],
        prompt_ids: list[list[int]],
        calling: list[int],
        turns: ToolTurns,
        tools: ToolBox,
    ) -> tuple[list[int], list[list[int]]]:
        """Run the calls of the `calling` rows and append their results; `(rows kept, their histories)`: a row whose
        results would pass the completion budget or the context has them rolled back and leaves the loop."""
        before = [(len(turns.completions[i]), len(turns.tool_images[i]), len(prompts[i])) for i in calling]
        for i in calling:
            prompts[i].append(turns.completions[i][-1])  # the assistant turn that called
            for name, result in self._call(turns.completions[i][-1]["tool_calls"], i, tools, turns):
                content = result if isinstance(result, list) else str(result)
                message = {"role": "tool", "name": name, "content": content}
                if isinstance(content, list):
                    turns.tool_images[i] += [
                        part["image"]
                        for part in content
                        if isinstance(part, dict) and part.get("type") == "image"
                    ]
                prompts[i].append(message)
                turns.completions[i].append(message)
        kept, histories = [], []
        for i, (completions_len, images_len, prompt_len) in zip(calling, before, strict=True):
            results = []
            for message in reversed(turns.completions[i]):  # the trailing tool messages
                if message["role"] != "tool":
                    break
                results.insert(0, message)
            history = prompt_ids[i] + turns.completion_ids[i] + self.suffix_ids(results)
            if (
                len(history) - len(prompt_ids[i]) > self.max_completion_length
                or len(history) >= self.max_model_len
            ):
                del turns.completions[i][completions_len:]
                del turns.tool_images[i][images_len:]
                del prompts[i][prompt_len:]
                continue
            kept.append(i)
            histories.append(history)
        return kept, histories

    def _call(
        self, calls: list[dict[str, Any]], row: int, tools: ToolBox, turns: ToolTurns
    ) -> list[tuple[str, Any]]:
        """`(name, result)` of each call of one turn: the sync ones in order, then the async ones, run together."""
        results, pending = [], []
        sync, asynchronous = tools.sync[row], tools.asynchronous[row]
        for call in calls:
            turns.calls[row] += 1
            if call["type"] != "function":
                turns.failures[row] += 1
                results.append(
                    (call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call['type']}"})
                )
                continue
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            try:
                if name in sync:
                    results.append((name, call_with_timeout(sync[name], arguments, self.timeout)))
                elif name in asynchronous:
                    pending.append((name, asynchronous[name](**arguments)))
                else:
                    raise ValueError(f"Tool {name} not found.")
            except Exception as error:  # a failed call is reported to the model, as in TRL
                turns.failures[row] += 1
                turns.timeouts[row] += isinstance(error, ToolTimeout)
                results.append((name, {"error": str(error)}))
        if pending:
            for name, result in self._await(pending):
                if isinstance(result, BaseException):
                    turns.failures[row] += 1
                    turns.timeouts[row] += isinstance(result, ToolTimeout)
                    result = {"error": str(result)}
                results.append((name, result))
        return results

    def _await(self, pending: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Run a turn's async calls together on TRL's event loop; each result, or the exception it raised."""
        timeout = self.timeout

        async def bounded(name: str, coroutine: Any) -> Any:
            if timeout is None:
                return await coroutine
            try:
                return await asyncio.wait_for(coroutine, timeout)
            except TimeoutError as error:
                raise ToolTimeout(f"{name} did not answer within tool_timeout ({timeout:g} s)") from error

        async def run_all() -> list[Any]:
            return await asyncio.gather(*(bounded(n, c) for n, c in pending), return_exceptions=True)

        results = asyncio.run_coroutine_threadsafe(run_all(), self.async_loop).result()
        return [(name, result) for (name, _), result in zip(pending, results, strict=True)]

    def _extend(
        self,
        prompt_ids: list[list[int]],
        calling: list[int],
        histories: list[list[int]],
        next_ids: list[list[int]],
        next_logps: list[list[float]] | None,
        turns: ToolTurns,
        tools: ToolBox,
    ) -> list[int]:
        """Append each row's tool results and next turn (cut to the completion budget); the rows that call again."""
        again = []
        for k, i in enumerate(calling):
            history, ids = histories[k], next_ids[k]
            tool_length = len(history) - len(prompt_ids[i]) - len(turns.completion_ids[i])
            room = self.max_completion_length - (len(history) - len(prompt_ids[i]))
            ids = ids[: max(room, 0)] if len(ids) > room else ids
            turns.tool_mask[i] += [0] * tool_length + [1] * len(ids)
            if turns.logprobs is not None:
                turns.logprobs[i] += [0.0] * tool_length + list(next_logps[k][: len(ids)])
            turns.completion_ids[i] = history[len(prompt_ids[i]) :] + ids
            parsed = (
                parse_response(self.tokenizer, ids, prefix=history, tools=tools.schemas[i]) if ids else {}
            )
            if parsed:  # {} when the next turn was cut away entirely
                turns.completions[i].append(parsed)
            if parsed.get("tool_calls"):
                again.append(i)
        return again


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
