"""The judge's request for one completion: the template filled in with the row, and the row's images.

The template is a Python format string (`str.format`). Its fields:

- `{question}`: the text of the prompt's last user message (the prompt itself when it is a string);
- `{completion}`: the completion as TRL passes it; a conversational one with several messages (a tool rollout) is
  written turn by turn, `role: text`, with each tool call as `[call name({"argument": ...})]`;
- `{solution}`: the row's reference answer (its `<answer>` tags removed);
- `{COLUMN}`: any other dataset column by name (`{options}`, `{problem}`, ...).

Literal braces are doubled (`{{` and `}}`), as in `str.format`. The row's images (its `images` column, else the image
parts of its prompt) go before the text of the user message as base64 data URLs, as the OpenAI API takes them.
"""

from __future__ import annotations

import base64
import io
import json
import mimetypes
import os
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import VLMGRPOError, did_you_mean
from .text import strip_answer_tag

ROW_FIELDS = ("question", "completion", "solution")
"""The fields the judge fills in itself; any other field names a dataset column."""

NOT_COLUMNS = (
    "completion_ids",
    "environments",
    "trainer_state",
    "log_metric",
    "log_extra",
    "reasoning_opened",
)
"""Keyword arguments TRL (or the trainer) passes to rewards that are no dataset columns."""


def template_fields(template: str) -> list[str]:
    """The names of the template's fields (`{name}`, `{name[0]}`, `{name.attr}` all name `name`).

    Raises:
        VLMGRPOError: the template is no valid format string, or has a positional field (`{}`, `{0}`).
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise VLMGRPOError(
            f"reward 'judge': template is not a valid format string ({error}); double literal braces: {{{{ }}}}."
        ) from error
    names = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        name = field.split(".")[0].split("[")[0]
        if not name or name.isdigit():
            raise VLMGRPOError(
                f"reward 'judge': template field {{{field}}} has no name; use {{question}}, {{completion}}, "
                "{solution} or a column name."
            )
        names.append(name)
    return names


def content_text(content: Any) -> str:
    """The text parts of a message's content (a string, or a list of typed parts), joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text") or "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
    )


def question_text(prompt: Any) -> str:
    """The prompt's question: its last user message's text, or the prompt when it is a string."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"] or list(prompt)
    return content_text(users[-1].get("content")) if users else ""


def _tool_calls(message: Mapping[str, Any]) -> str:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append(f"[call {function.get('name')}({arguments})]")
    return " ".join(calls)


def completion_text(completion: Any) -> str:
    """The completion as the judge reads it: the string, the one message's text, or every turn of a tool rollout."""
    if isinstance(completion, str):
        return completion
    messages = list(completion)
    if len(messages) == 1 and not messages[0].get("tool_calls"):
        return content_text(messages[0].get("content"))
    turns = []
    for message in messages:
        text = " ".join(t for t in (content_text(message.get("content")), _tool_calls(message)) if t)
        turns.append(f"{message.get('role')}: {text}")
    return "\n\n".join(turns)


def prompt_images(prompt: Any) -> list[Any]:
    """The images of a conversational prompt's image parts (`{"type": "image", "image": ...}`)."""
    if isinstance(prompt, str):
        return []
    return [
        part["image"]
        for message in prompt
        if not isinstance(message.get("content"), str)
        for part in message.get("content") or []
        if isinstance(part, Mapping) and part.get("type") == "image" and part.get("image") is not None
    ]


def image_url(image: Any) -> str:
    """The image as a URL the OpenAI API takes: a `data:` URL of the file's bytes or of a PIL image as PNG; an
    `http(s)://` or `data:` string is kept as it is.

    Raises:
        VLMGRPOError: the image is neither a path nor a PIL image, or its file cannot be read.
    """
    from PIL import Image

    if isinstance(image, str) and image.startswith(("http://", "https://", "data:")):
        return image
    if isinstance(image, (str, os.PathLike)):
        try:
            data = Path(image).read_bytes()
        except OSError as error:
            raise VLMGRPOError(
                f"reward 'judge': cannot read the image {image} ({error}); fix the path."
            ) from error
        mime = mimetypes.guess_type(str(image))[0] or "image/png"
    elif isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data, mime = buffer.getvalue(), "image/png"
    else:
        raise VLMGRPOError(
            f"reward 'judge': an image is a {type(image).__name__}; give images as file paths or PIL images."
        )
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def row_values(
    index: int, prompt: Any, completion: Any, columns: Mapping[str, Sequence[Any]]
) -> dict[str, Any]:
    """The template's values for row `index`: every column's value, then `question`, `completion` and `solution`."""
    values = {name: column[index] for name, column in columns.items()}
    values["question"] = question_text(prompt)
    values["completion"] = completion_text(completion)
    if "solution" in columns:
        values["solution"] = strip_answer_tag(columns["solution"][index])
    return values


def fill(template: str, values: Mapping[str, Any]) -> str:
    """`template.format(**values)`.

    Raises:
        VLMGRPOError: a field names no column of the data.
    """
    try:
        return template.format(**values)
    except KeyError as error:
        field = str(error.args[0])
        raise VLMGRPOError(
            f"reward 'judge': template field {{{field}}} is not a column of the data{did_you_mean(field, values)}; "
            f"fields: {', '.join(sorted(values))}."
        ) from error


def messages_for(text: str, image_urls: Sequence[str], system: str | None) -> list[dict[str, Any]]:
    """The OpenAI chat messages of one request: the system prompt, then the images and the text as the user turn."""
    content: str | list[dict[str, Any]] = text
    if image_urls:
        content = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]
        content.append({"type": "text", "text": text})
    return [
        *([{"role": "system", "content": system}] if system else []),
        {"role": "user", "content": content},
    ]
