"""Gemma 3 (`Gemma3ForConditionalGeneration`).

Every image is resized to the SigLIP tower's fixed square (`pixel_values` `[N_images, C, S, S]`) and pooled to
`mm_tokens_per_image` soft tokens between `<start_of_image>` and `<end_of_image>`. Image tokens attend to each
other bidirectionally, which the model derives from `token_type_ids` `[B, L]` (1 on image tokens).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from transformers import Gemma3ForConditionalGeneration, ProcessorMixin

from .base import ModelFamily


class Gemma3Family(ModelFamily):
    """Module for `gemma3` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("gemma3",)
    vision_module_names: ClassVar[tuple[str, ...]] = ("vision_tower", "multi_modal_projector")
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values",)
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = (
        "image_token_index",
        "boi_token_index",
        "eoi_token_index",
    )
    placeholder_processor_attrs: ClassVar[tuple[str, ...]] = ("image_token", "boi_token", "eoi_token")
    prompt_image_token_attr: ClassVar[str] = "boi_token"

    def image_tokens(
        self,
        model_config: Any,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> int:
        """Gemma 3 resizes every image to one square: `mm_tokens_per_image` soft tokens, whatever its size."""
        return model_config.mm_tokens_per_image

    def model_class(self) -> type:
        """`Gemma3ForConditionalGeneration`."""
        return Gemma3ForConditionalGeneration

    def vllm_weights(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """transformers (>= 5) drops the SigLIP tower's `vision_model.` level, which the hub layout and vLLM keep."""
        if name.startswith("model.vision_tower.") and not name.startswith("model.vision_tower.vision_model."):
            name = "model.vision_tower.vision_model." + name.removeprefix("model.vision_tower.")
        yield name, tensor

    def configure_image_size(
        self,
        processor: ProcessorMixin,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> None:
        """Gemma 3 resizes every image to one fixed size: no knob applies, and setting one is an error."""
        super().configure_image_size(
            processor, min_pixels=min_pixels, max_pixels=max_pixels, max_tiles=max_tiles
        )

    def token_type_inputs(self, input_ids: torch.Tensor, model_config: Any) -> dict[str, torch.Tensor]:
        """`token_type_ids` `[B, L]`: 1 on image soft tokens (bidirectional attention among them), 0 elsewhere."""
        return {"token_type_ids": (input_ids == model_config.image_token_id).long()}

    def bidirectional_image_attention(self, model_config: Any) -> bool:
        """Gemma 3 attends bidirectionally among each image's soft tokens."""
        return True
