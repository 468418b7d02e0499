"""Building the conversational prompt of a row from its problem text and its number of images."""

from __future__ import annotations

IMAGE_PLACEHOLDER = "<image>"


class TemplateFieldError(KeyError):
    """A prompt template names a field the record lacks."""


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


def build_user_content(text: str, num_images: int) -> list[dict]:
    """Interleave image and text parts of a user message.

    Each `<image>` placeholder in `text` becomes an `{"type": "image"}` part at its place. Without
    placeholders, all images come first, then the text. Text pieces made only of whitespace are dropped,
    the first text part is left-stripped and the last one right-stripped; other whitespace is kept.

    Args:
        text (`str`): The prompt text, after the template.
        num_images (`int`): Number of images of the record.

    Returns:
        `list[dict]`: Content parts, e.g. `[{"type": "image"}, {"type": "text", "text": "What is this?"}]`.

    Raises:
        ValueError: `text` has placeholders and their count differs from `num_images`.
    """
    pieces = text.split(IMAGE_PLACEHOLDER)
    num_placeholders = len(pieces) - 1
    if num_placeholders == 0:
        stripped = text.strip()
        return [{"type": "image"} for _ in range(num_images)] + ([_text(stripped)] if stripped else [])
    if num_placeholders != num_images:
        raise ValueError(
            f"the prompt has {num_placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but the record has "
            f"{num_images} image(s); make the counts equal, or remove the placeholders to put all images first"
        )
    content: list[dict] = []
    for k, piece in enumerate(pieces):
        if k > 0:
            content.append({"type": "image"})
        if piece.strip():
            content.append(_text(piece))
    texts = [part for part in content if part["type"] == "text"]
    if texts:
        texts[0]["text"] = texts[0]["text"].lstrip()
        texts[-1]["text"] = texts[-1]["text"].rstrip()
    return content


def build_prompt(text: str, num_images: int, system_prompt: str | None = None) -> list[dict]:
    """Build a TRL conversational prompt.

    Args:
        text (`str`): The prompt text, after the template; may hold `<image>` placeholders.
        num_images (`int`): Number of images of the record.
        system_prompt (`str | None`, *optional*, defaults to `None`): Text of a leading system message; `None` or
            `""` adds none.

    Returns:
        `list[dict]`: `[{"role": "system", "content": [text part]}]` (optional) followed by
        `{"role": "user", "content": build_user_content(text, num_images)}`.

    Raises:
        ValueError: See `build_user_content`.
    """
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": [_text(system_prompt)]})
    messages.append({"role": "user", "content": build_user_content(text, num_images)})
    return messages
