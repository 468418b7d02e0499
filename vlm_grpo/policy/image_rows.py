"""Multi-turn rollouts with tools (TRL's `tools` and `environment_factory`) for vision-language models.

TRL 1.16 runs the tool loop itself (`GRPOTrainer._tool_call_loop`): it parses each completion's tool calls, runs the
sync and async tools (a failure is reported to the model as `{"error": ...}`), appends the tool messages with the
chat template's own tokens (tool results that are content lists may hold images), rolls back a result that would
push the row past `max_completion_length` or the model's context, generates the next turn of every row that called
a tool, and repeats up to `max_tool_calling_iterations`. It returns the rows' `tool_mask` (0 on tool-result tokens,
which the loss leaves out) and the images the tools returned.

`VLMGRPOTrainer` keeps that loop, so the semantics are TRL's, and supplies what is model-specific around it: the
first turn is sampled as any rollout (each group's prompt encoded and prefilled once), the next turns go through the
family's module (`VLMGRPOTrainer._generate_single_turn`), and a row whose tools returned images gets its own image
inputs, the prompt's images followed by the tools', in the order their placeholders appear (`row_image_inputs`,
`ToolImageRow`). Each group's prompt still runs once after the first turn: the next turns find the prompt each row
starts with (`history_prompts`) and continue it from one prefill, and the log-prob passes feed the tools' images to
the completions' forward over the prompt's cache (see `shared_prefix`).

This module holds those pieces and the per-batch setup TRL does in its own `_generate_and_score_completions`:
the environments drawn from their pool and reset (`reset_environments`), and each row's tools (`tool_dicts`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from typing import Any

import PIL.Image
import torch

from ..models import EncodedPrompt, ModelFamily


class ToolImageRow(dict):
    """The image inputs of a row whose tools returned images: the prompt's images followed by the tools', in the order
    their placeholders appear, as one dict (what a full-row forward takes), which also keeps its two parts.

    `prompt` is the group's own dict (the same object in every row of the group, which is how groups are found) and
    `tools` the tools' images of this row, which a shared-prefix pass feeds to the completion's forward.

    Args:
        images (`dict[str, torch.Tensor]`): the row's image inputs, `ModelFamily.collate([prompt, tools])`.
        prompt (`dict[str, torch.Tensor]`): the prompt's image inputs (`EncodedPrompt.image_inputs`).
        tools (`dict[str, torch.Tensor]`): the image inputs of the images the row's tools returned.
    """

    def __init__(
        self, images: dict[str, torch.Tensor], prompt: dict[str, torch.Tensor], tools: dict[str, torch.Tensor]
    ):
        super().__init__(images)
        self.prompt = prompt
        self.tools = tools


def prompt_images(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image inputs of a row's prompt: the row's own, or the prompt part of a `ToolImageRow`."""
    return row.prompt if isinstance(row, ToolImageRow) else row


def completion_images(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image inputs of the images inside a row's completion: those of its tools (`ToolImageRow`), or none."""
    return row.tools if isinstance(row, ToolImageRow) else {}


def image_parts(rows: Sequence[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """The rows' image dicts split into their parts, in placeholder order (a `ToolImageRow` gives its prompt's and
    its tools'): concatenated, they hold exactly the tensors of the rows."""
    return [
        part
        for row in rows
        for part in ((row.prompt, row.tools) if isinstance(row, ToolImageRow) else (row,))
    ]


class ToolImageInputs:
    """The image inputs of the images rows' tools returned, each distinct list encoded once per generation batch: the
    turn that continues after the tools and the training passes read the same tensors (and, with frozen vision, the
    same stored features).

    Lists are told apart by their images' pixels (`pixel_key`), so rows whose tools returned the same pixels (G
    completions cropping the same region) share one encoding, as they share the same tensors.

    Args:
        family (`ModelFamily`): the family's module (`encode_images`).
        processor (`ProcessorMixin`): the family's processor.
        device (`torch.device`): where the tensors go.
    """

    def __init__(self, family: ModelFamily, processor: Any, device: torch.device):
        self.family, self.processor, self.device = family, processor, device
        self._encoded: dict[tuple[Hashable, ...], tuple[list[Any], dict[str, torch.Tensor]]] = {}

    def __call__(self, images: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The image inputs of `images` (a row's tool images, in order), encoded at their first request."""
        key = tuple(pixel_key(image) for image in images)
        if key not in self._encoded:  # the images stay with their inputs: an object's id stays unique
            inputs = self.family.encode_images(self.processor, images)
            self._encoded[key] = (list(images), {k: v.to(self.device) for k, v in inputs.items()})
        return self._encoded[key][1]


def pixel_key(image: Any) -> Hashable:
    """What a processor reads of an image: a PIL image's mode, size, palette and a digest of its pixels (equal
    pixels, equal key); any other object stands for itself (its id)."""
    if not isinstance(image, PIL.Image.Image):
        return ("object", id(image))
    digest = hashlib.blake2b(image.tobytes(), digest_size=16)
    palette = image.getpalette()
    if palette is not None:
        digest.update(bytes(palette))
    return (image.mode, image.size, repr(image.info.get("transparency")), digest.digest())


def row_image_inputs(
    family: ModelFamily,
    encoded: Sequence[EncodedPrompt],
    tool_images: Sequence[Sequence[Any]],
    tool_inputs: ToolImageInputs,
) -> list[dict[str, torch.Tensor]]:
    """Each row's image inputs: its prompt's (shared by its group), or for a row whose tools returned images, a
    `ToolImageRow` holding the prompt's images followed by the tools'.

    Args:
        family (`ModelFamily`): the family's module (`collate`).
        encoded (`Sequence[EncodedPrompt]`): the rows' encoded prompts.
        tool_images (`Sequence[Sequence[PIL.Image.Image]]`): the images each row's tools returned, in order.
        tool_inputs (`ToolImageInputs`): the batch's encoded tool images.
    """
    rows = []
    for prompt, images in zip(encoded, tool_images, strict=True):
        if not images:
            rows.append(prompt.image_inputs)
            continue
        tools = tool_inputs(images)
        rows.append(ToolImageRow(family.collate([prompt.image_inputs, tools]), prompt.image_inputs, tools))
    return rows
