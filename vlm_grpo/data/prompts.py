"""Building the conversational prompt of a row from its problem text and its numbers of images and videos."""

from __future__ import annotations

import re

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
PLACEHOLDERS = {"image": IMAGE_PLACEHOLDER, "video": VIDEO_PLACEHOLDER}
"""The text that places each kind of media in a prompt."""


class TemplateFieldError(KeyError):
    """A prompt template names a field the record lacks."""


class PlaceholderCountError(ValueError):
    """A prompt's placeholders of one kind of media do not match the record's number of that kind.

    Attributes:
        kind (`str`): `"image"` or `"video"`.
    """

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def apply_template(template: str | None, fields: dict) -> str:
    """Fill a prompt template with a record's fields.

    Args:
        template (`str | None`): A `str.format_map` template such as `"{problem} Options: {options}"`;
            `None` returns `fields["problem"]` unchanged. Literal braces are written `{{` and `}}`.
            A list of plain values (e.g. `options`) is written comma-separated: `A, B, C`.
        fields (`dict`): The record's fields, including `problem`.

    Returns:
        `str`: The filled text.

    Raises:
        TemplateFieldError: The template names a field missing from `fields`.
        ValueError: The template is malformed (e.g. an unmatched brace or a positional `{}`).
    """
    if template is None:
        return fields["problem"]
    shown = {
        k: ", ".join(str(x) for x in v)
        if isinstance(v, list) and all(not isinstance(x, (list, dict)) for x in v)
        else v
        for k, v in fields.items()
    }
    try:
        return template.format_map(shown)
    except KeyError as exc:
        raise TemplateFieldError(exc.args[0]) from exc
    except (IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"malformed prompt_template {template!r} ({exc}); escape literal braces as {{{{ and }}}}"
        ) from exc


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def build_user_content(text: str, num_images: int, num_videos: int = 0) -> list[dict]:
    """Interleave image, video and text parts of a user message.

    Each `<image>` (`<video>`) placeholder in `text` becomes an `{"type": "image"}` (`{"type": "video"}`) part at its
    place. A kind without placeholders in `text` puts all its parts first (videos, then images), then the rest. Text
    pieces made only of whitespace are dropped, the first text part is left-stripped and the last one right-stripped;
    other whitespace is kept.

    Args:
        text (`str`): The prompt text, after the template.
        num_images (`int`): Number of images of the record.
        num_videos (`int`, *optional*, defaults to 0): Number of videos of the record.

    Returns:
        `list[dict]`: Content parts, e.g. `[{"type": "image"}, {"type": "text", "text": "What is this?"}]`.

    Raises:
        PlaceholderCountError: `text` has placeholders of a kind and their count differs from the record's number of
            that kind.
    """
    counts = {"video": num_videos, "image": num_images}
    placed = {kind: text.count(PLACEHOLDERS[kind]) for kind in counts}
    for kind, found in placed.items():
        if found and found != counts[kind]:
            raise PlaceholderCountError(
                f"the prompt has {found} {PLACEHOLDERS[kind]} placeholder(s) but the record has {counts[kind]} "
                f"{kind}(s); make the counts equal, or remove the placeholders to put all {kind}s first",
                kind,
            )
    content: list[dict] = [{"type": kind} for kind in counts if not placed[kind] for _ in range(counts[kind])]
    pattern = "(" + "|".join(re.escape(PLACEHOLDERS[kind]) for kind in counts if placed[kind]) + ")"
    pieces = re.split(pattern, text) if any(placed.values()) else [text]
    kinds = {marker: kind for kind, marker in PLACEHOLDERS.items()}
    for piece in pieces:
        if piece in kinds and placed[kinds[piece]]:
            content.append({"type": kinds[piece]})
        elif piece.strip():
            content.append(_text(piece))
    texts = [part for part in content if part["type"] == "text"]
    if texts:
        texts[0]["text"] = texts[0]["text"].lstrip()
        texts[-1]["text"] = texts[-1]["text"].rstrip()
    return content


def build_prompt(
    text: str, num_images: int, system_prompt: str | None = None, num_videos: int = 0
) -> list[dict]:
    """Build a TRL conversational prompt.

    Args:
        text (`str`): The prompt text, after the template; may hold `<image>` and `<video>` placeholders.
        num_images (`int`): Number of images of the record.
        system_prompt (`str | None`, *optional*, defaults to `None`): Text of a leading system message; `None` or
            `""` adds none.
        num_videos (`int`, *optional*, defaults to 0): Number of videos of the record.

    Returns:
        `list[dict]`: `[{"role": "system", "content": [text part]}]` (optional) followed by
        `{"role": "user", "content": build_user_content(text, num_images, num_videos)}`.

    Raises:
        PlaceholderCountError: See `build_user_content`.
    """
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": [_text(system_prompt)]})
    messages.append({"role": "user", "content": build_user_content(text, num_images, num_videos)})
    return messages
