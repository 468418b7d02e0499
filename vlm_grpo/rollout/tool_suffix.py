"""The ids the chat template writes between a tool-calling assistant turn and the next turn.

TRL renders them for every row that called a tool (`GRPOTrainer._get_tool_suffix_ids`): a minimal conversation, a
user turn and an assistant turn calling the real tool, is rendered with and without the tool messages and the
generation prompt, and the ids after the shorter are the suffix. `ToolSuffix` returns the same ids and renders less:

- the calling turn's ids depend on the tool's name only, and are rendered once per name;
- the suffix depends on the tool messages' text and, for an image, on its size only (a processor writes one
  placeholder run per image whose length its resize and patch grid fix), so messages that differ only in their
  images' pixels share one rendering. A row whose tools answer with an image of the same size as another's (a crop
  of a fixed size, G completions calling the same tool) no longer runs the processor on it. Messages holding
  anything else (a video, an object the template might render) are rendered every time.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import PIL.Image
from transformers import ProcessorMixin
from trl.data_utils import prepare_multimodal_messages

MAX_RENDERINGS = 4096
"""Renderings kept; past it the store starts again (text results, unlike images of a fixed size, rarely repeat)."""


class ToolSuffix:
    """`suffix(tool_messages) -> ids`: the tool results and the next assistant turn's header, as the chat template
    writes them after an assistant turn that called a tool.

    Args:
        processor (`ProcessorMixin`): the family's processor (it renders and tokenizes the template).
        chat_template (`str`, *optional*): the chat template to render with (None: the processor's).
        chat_template_kwargs (`dict`): TRL's `chat_template_kwargs`.
    """

    def __init__(
        self, processor: ProcessorMixin, chat_template: str | None, chat_template_kwargs: dict[str, Any]
    ):
        self.processor, self.eos_token_id = processor, processor.tokenizer.eos_token_id
        self.template = {"tokenize": True, "chat_template": chat_template, "return_dict": False}
        self.chat_template_kwargs = chat_template_kwargs
        self._call_prefixes: dict[str, list[int]] = {}  # tool name -> the rendered calling turn
        self._rendered: dict[Hashable, list[int]] = {}  # `rendering_key` -> suffix ids
        self.renderings = 0  # full renderings run (for tests)

    def __call__(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The suffix ids of one row's trailing tool messages (`{"role": "tool", "name", "content"}`)."""
        key = rendering_key(tool_messages)
        if key is not None and key in self._rendered:
            return list(self._rendered[key])
        suffix = self._render(tool_messages)
        if key is not None:
            if len(self._rendered) >= MAX_RENDERINGS:
                self._rendered.clear()
            self._rendered[key] = suffix
        return list(suffix)

    def _render(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The suffix rendered from a minimal conversation with the real tool name, as TRL renders it."""
        name = tool_messages[0]["name"]
        call = {"type": "function", "function": {"name": name, "arguments": {}}}
        # "content" is required: VLM processors fail to tokenize an assistant turn without it
        head = prepare_multimodal_messages(
            [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        )
        if name not in self._call_prefixes:  # the same ids for every call of the tool
            prefix = self.processor.apply_chat_template(
                head, add_generation_prompt=False, **self.template, **self.chat_template_kwargs
            )[0]
            # templates that write a newline after the end of a turn are cut at its end-of-sequence token
            ends = [k for k, token in enumerate(prefix) if token == self.eos_token_id]
            self._call_prefixes[name] = prefix[: ends[-1] + 1] if ends else prefix
        prefix = self._call_prefixes[name]
        full = self.processor.apply_chat_template(
            head + prepare_multimodal_messages(tool_messages), add_generation_prompt=True, **self.template,
            **self.chat_template_kwargs,
        )[0]  # fmt: skip
        self.renderings += 1
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "Unexpected tokenization: the EOS-trimmed prefix IDs are not a prefix of the full IDs."
            )
        return full[len(prefix) :]


def rendering_key(tool_messages: list[dict[str, Any]]) -> Hashable | None:
    """What the suffix of these tool messages depends on: each message's role, name and content, an image standing
    for its size; None when a content part holds anything but text, numbers and PIL images."""
    key = []
    for message in tool_messages:
        content = message["content"]
        if isinstance(content, str):
            key.append((message["role"], message["name"], content))
            continue
        parts = []
        for part in content:
            if not isinstance(part, dict):
                return None
            items = []
            for field, value in sorted(part.items()):
                if isinstance(value, PIL.Image.Image):
                    value = ("image of size", value.size)
                elif not isinstance(value, str | int | float | bool | None):
                    return None
                items.append((field, value))
            parts.append(tuple(items))
        key.append((message["role"], message["name"], tuple(parts)))
    return tuple(key)
