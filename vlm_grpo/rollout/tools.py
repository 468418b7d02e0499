"""The tool loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..models import EncodedPrompt


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
