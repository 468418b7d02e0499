"""Dataset rows as a rollout reads them: read and decoded once per group (`GroupRows`, `repeat_row`), their images,
their videos, the same-prompt rule."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from typing import Any

import datasets
import torch
from PIL import Image
from transformers.image_utils import load_image

from ..errors import VLMGRPOError


def row_images(row: dict[str, Any]) -> list[Any]:
    """The images of one dataset row as the user gave them: an `images` list, a single `image`, or none."""
    if row.get("images") is not None:
        return list(row["images"])
    return [row["image"]] if row.get("image") is not None else []


def repeat_row(row: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """`row` and `count - 1` copies of it that share its PIL images (decoded once) and copy everything else, so that
    nothing done to one row's messages or columns reaches another.

    Args:
        row (`dict`): a dataset row.
        count (`int`): the rows wanted (a group's `num_generations`).
    """
    shared = {id(image): image for image in row_images(row) if isinstance(image, Image.Image)}
    return [row] + [copy.deepcopy(row, dict(shared)) for _ in range(count - 1)]


class GroupRows(torch.utils.data.Dataset):
    """A map-style dataset whose batches read each index once: TRL's `RepeatSampler` puts every prompt
    `num_generations` times in a batch, and `datasets` would decode its images again at each repeat. The rows are the
    same, in the same order; the repeats are `repeat_row` copies.

    Args:
        dataset (`datasets.Dataset`): the rows.
    """

    def __init__(self, dataset: datasets.Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        counts = Counter(indices)  # distinct indices, in their first order
        rows = self.dataset.__getitems__(list(counts))
        repeats = {i: iter(repeat_row(row, counts[i])) for i, row in zip(counts, rows, strict=True)}
        return [next(repeats[i]) for i in indices]


def load_row_images(row: dict[str, Any]) -> list[Image.Image]:
    """The row's images as PIL images: paths (and URLs) are opened, as TRL's processor call would open them.

    Raises:
        `VLMGRPOError`: an image path cannot be opened; the message names it.
    """
    images = []
    for image in row_images(row):
        if isinstance(image, str):
            try:
                image = load_image(image)
            except (OSError, ValueError) as error:
                raise VLMGRPOError(f"Cannot open image {image!r} of a training row: {error}") from error
        images.append(image)
    return images


def load_rows(inputs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`{"prompt", "images", "videos"}` per dataset row, images loaded; a row repeating the previous row's images reuses
    them. Videos stay as the dataset stores them (`{"path", "frames"}`): the family decodes them when it encodes the
    prompt, once per group.

    The G copies of a prompt in a generation batch hold the same image values, so each image is opened once.
    """
    rows: list[dict[str, Any]] = []
    for i, x in enumerate(inputs):
        raw = row_images(x)
        if i > 0 and raw == row_images(inputs[i - 1]):
            images = rows[-1]["images"]
        else:
            images = load_row_images(x)
        rows.append({"prompt": x["prompt"], "images": images, "videos": list(x.get("videos") or [])})
    return rows


def image_names(row: dict[str, Any]) -> list[str]:
    """File names of a row's images: the paths given, or the files PIL images were read from ("" for none)."""
    return [
        image if isinstance(image, str) else getattr(image, "filename", "") or "" for image in row_images(row)
    ]


def same_prompt(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The one rule for "same prompt": equal messages, the same images (the same objects, or equal pixels) and the
    same videos (the same files).

    Consecutive rows of a GRPO group satisfy it; the trainer encodes such rows once and lets them share one
    `EncodedPrompt`, which is how the shared-prefix passes and the vLLM payload find groups.

    Args:
        a (`dict`): a row with `prompt` and its images already loaded under `images` (see `load_row_images`).
        b (`dict`): another such row.
    """
    if a["prompt"] != b["prompt"] or a.get("videos", []) != b.get("videos", []):
        return False
    images_a, images_b = a["images"], b["images"]
    return len(images_a) == len(images_b) and all(
        x is y or (x.size == y.size and x.mode == y.mode and x.tobytes() == y.tobytes())
        for x, y in zip(images_a, images_b, strict=True)
    )


def reward_prompts(inputs: Sequence[dict[str, Any]]) -> list[Any]:
    """The prompts reward functions receive, as TRL hands them: its multimodal messages (images inside) when the batch
    has images, else the rows' prompts."""
    from trl.data_utils import prepare_multimodal_messages

    prompts = [x["prompt"] for x in inputs]
    images = [row_images(x) for x in inputs]
    if not any(images):
        return prompts
    return [prepare_multimodal_messages(p, images=i) for p, i in zip(prompts, images, strict=True)]
