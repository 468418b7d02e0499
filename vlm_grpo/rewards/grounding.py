"""Grounding rewards (referring expression comprehension): a box `[x1, y1, x2, y2]` in the answer."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from ..errors import VLMGRPOError
from .columns import batch_size, require_column, require_value
from .text import (
    answer_or_text,
    completion_texts,
    extract_answer,
    find_box,
    has_think_answer_format,
    strip_answer_tag,
)

COORDS = ("absolute", "resized", "norm1000")
"""Accepted values of the `coords` option of `iou`."""


def box_iou(box1: Sequence[float], box2: Sequence[float]) -> float:
    """Intersection over union of two boxes `[x1, y1, x2, y2]` with continuous coordinates.

    `inter = max(0, min(x2) - max(x1)) * max(0, min(y2) - max(y1))` and
    `union = area1 + area2 - inter`. A degenerate box (`x2 <= x1` or `y2 <= y1`) gives 0.0.

    Args:
        box1 (`Sequence[float]`): first box.
        box2 (`Sequence[float]`): second box.

    Returns:
        `float`: the IoU in [0, 1].
    """
    ax1, ay1, ax2, ay2 = (float(v) for v in box1)
    bx1, by1, bx2, by2 = (float(v) for v in box2)
    if ax2 <= ax1 or ay2 <= ay1 or bx2 <= bx1 or by2 <= by1:
        return 0.0
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def rec_format(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 iff the completion passes `format` and its `<answer>` holds a box `[x1, y1, x2, y2]`.

    The box is four numbers (ints or floats, optional spaces, negative allowed) in square brackets; other
    text may surround it inside the answer. Never returns `None`.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        **kwargs (`Any`): every other argument TRL passes; `reasoning_opened` is read (see `completion_texts`).

    Returns:
        `list[float]`: 1.0 or 0.0 per completion.
    """
    rewards = []
    for text in completion_texts(completions, kwargs):
        ok = has_think_answer_format(text) and find_box(extract_answer(text) or "") is not None
        rewards.append(1.0 if ok else 0.0)
    return rewards


def iou(
    completions: Sequence[Any],
    solution: Sequence[Any] | None = None,
    coords: str = "absolute",
    **kwargs: Any,
) -> list[float | None]:
    """IoU between the predicted box and the ground-truth box.

    The predicted box is the first box `[x1, y1, x2, y2]` inside the last complete `<answer>` block when
    the completion contains `<answer>`, otherwise the first box of the text outside `<think>` blocks (see
    `vlm_grpo.rewards.text.answer_or_text`). No box, or a degenerate one, gives 0.0.

    Args:
        completions (`Sequence[str | list[dict]]`): the completions, plain strings or conversational messages.
        solution (`Sequence[list[float] | str | None] | None`, *optional*, defaults to `None`): per record, the
            ground-truth box in pixels of the original image: four numbers, or a string holding one
            (`"[1, 2, 3, 4]"`, possibly wrapped in `<answer>`). A record whose solution is `None` gets `None`
            (reward does not apply). The column is required: `None` raises.
        coords (`str`, *optional*, defaults to `"absolute"`): how the predicted coordinates relate to the original
            image.

            - `"absolute"`: compared as they are.
            - `"resized"`: pixels of the resized image the model saw; scaled by the `image_size` column
              (`[w, h]` of the original) over the `model_image_size` column (`[w, h]` seen by the model).
            - `"norm1000"`: values in [0, 1000] (Qwen3-VL style); scaled by `image_size` / 1000.
        **kwargs (`Any`): dataset columns (`image_size`, `model_image_size` as needed by `coords`),
            `reasoning_opened` (see `completion_texts`), and every other argument TRL passes, which is ignored.

    Returns:
        `list[float | None]`: the IoU per completion.

    Raises:
        VLMGRPOError: unknown `coords`; a missing column needed by `coords` or a missing `solution`
            column; a solution or size that is not what is described above.
    """
    if coords not in COORDS:
        raise VLMGRPOError(f"iou: unknown coords={coords!r}; use one of {', '.join(COORDS)}.")
    if solution is None:
        raise VLMGRPOError(
            "Reward 'iou' needs the dataset column 'solution' with the ground-truth box [x1, y1, x2, y2]."
        )
    size = batch_size(completions, solution)
    image_sizes = model_sizes = None
    if coords in ("resized", "norm1000"):
        image_sizes = require_column(
            kwargs, "image_size", size, "iou", f"[width, height] of the original image (coords={coords})"
        )
    if coords == "resized":
        model_sizes = require_column(
            kwargs, "model_image_size", size, "iou", "[width, height] of the image the model saw"
        )

    rewards: list[float | None] = []
    for i, (text, sol) in enumerate(zip(completion_texts(completions, kwargs), solution)):
        if sol is None:
            rewards.append(None)
            continue
        target = _solution_box(sol, i)
        answer = answer_or_text(text)
        pred = find_box(answer) if answer is not None else None
        if pred is None:
            rewards.append(0.0)
            continue
        if image_sizes is not None:
            width, height = _size(image_sizes[i], "image_size", i)
            if model_sizes is not None:
                model_w, model_h = _size(model_sizes[i], "model_image_size", i)
                sx, sy = width / model_w, height / model_h
            else:
                sx, sy = width / 1000.0, height / 1000.0
            pred = [pred[0] * sx, pred[1] * sy, pred[2] * sx, pred[3] * sy]
        rewards.append(box_iou(pred, target))
    return rewards


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _solution_box(sol: Any, index: int) -> list[float]:
    sol = strip_answer_tag(sol)
    if isinstance(sol, str):
        box = find_box(sol)
        if box is not None:
            return box
    elif isinstance(sol, Sequence) and len(sol) == 4 and all(_is_number(v) for v in sol):
        return [float(v) for v in sol]
    raise VLMGRPOError(
        f"iou: the solution at batch position {index} is {sol!r}; expected a box [x1, y1, x2, y2] "
        "as a list of four numbers or a string holding one."
    )


def _size(value: Any, name: str, index: int) -> tuple[float, float]:
    value = require_value(value, name, index, "iou", "[width, height]")
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        if all(_is_number(v) and v > 0 for v in value):
            return float(value[0]), float(value[1])
    raise VLMGRPOError(
        f"iou: column '{name}' at batch position {index} is {value!r}; expected [width, height] > 0."
    )
