"""Qwen-VL family: Qwen2-VL, Qwen2.5-VL and Qwen3-VL.

Images become a flat sequence of patches (`pixel_values` `[N_patches, C*T*P*P]`) described by `image_grid_thw`
`[N_images, 3]`; the language model places them with 3-D M-RoPE, which needs `mm_token_type_ids` `[B, L]`
(0 text, 1 image, 2 video) over the whole sequence. Image size is bounded by `min_pixels` / `max_pixels`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from transformers import (
    ProcessorMixin,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
)

from .base import VLMModule


class Qwen2VLModule(VLMModule):
    """Module for `qwen2_vl`, `qwen2_5_vl` and `qwen3_vl` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
    vision_module_names: ClassVar[tuple[str, ...]] = ("visual",)
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "image_grid_thw")
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = (
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    )
    _classes: ClassVar[dict[str, type]] = {
        "qwen2_vl": Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
        "qwen3_vl": Qwen3VLForConditionalGeneration,
    }

    def model_class(self) -> type:
        """`Qwen2VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration` or `Qwen3VL...`."""
        return self._classes[self.model_type]

    def configure_image_size(
        self,
        processor: ProcessorMixin,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> None:
        """Bound pixels per image: images are resized (aspect kept) so that min_pixels <= H*W <= max_pixels."""
        if max_tiles is not None:
            raise ValueError("Qwen-VL models do not tile images: remove max_tiles, use max_pixels instead.")
        image_processor = processor.image_processor
        if min_pixels is not None:
            image_processor.size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            image_processor.size["longest_edge"] = max_pixels
        if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
            raise ValueError(f"min_pixels ({min_pixels}) must not exceed max_pixels ({max_pixels}).")

    def token_type_inputs(self, input_ids: torch.Tensor, model_config: Any) -> dict[str, torch.Tensor]:
        """`mm_token_type_ids` `[B, L]`: 1 on image tokens, 2 on video tokens, 0 elsewhere (M-RoPE needs it)."""
        types = (input_ids == model_config.image_token_id).long()
        types = types + 2 * (input_ids == model_config.video_token_id).long()
        return {"mm_token_type_ids": types}
