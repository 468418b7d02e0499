"""InternVL, transformers-native (`InternVLForConditionalGeneration`, the `-hf` checkpoints).

Each image is cut into tiles (`pixel_values` `[N_tiles, C, H, W]`, up to `max_tiles` per image plus a
thumbnail); each tile becomes a fixed number of `<IMG_CONTEXT>` tokens between `<img>` and `</img>`. The tile
count per image is already encoded in the prompt's tokens, so per-sample tiles concatenate without bookkeeping.
"""

from __future__ import annotations

from typing import ClassVar

from transformers import InternVLForConditionalGeneration, ProcessorMixin

from ..errors import VLMGRPOError
from .base import ModelFamily


class InternVLFamily(ModelFamily):
    """Module for `internvl` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("internvl",)
    vision_module_names: ClassVar[tuple[str, ...]] = ("vision_tower", "multi_modal_projector")
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values",)
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = ("image_token_id",)
    placeholder_processor_attrs: ClassVar[tuple[str, ...]] = (
        "image_token",
        "video_token",
        "start_image_token",
        "end_image_token",
    )

    def model_class(self) -> type:
        """`InternVLForConditionalGeneration`."""
        return InternVLForConditionalGeneration

    def configure_image_size(
        self,
        processor: ProcessorMixin,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> None:
        """Bound tiles per image (`max_tiles`); InternVL resizes every tile to a fixed size, so no pixel limits."""
        if min_pixels is not None or max_pixels is not None:
            raise VLMGRPOError(
                "InternVL resizes every tile to a fixed size: remove min_pixels/max_pixels, use max_tiles instead."
            )
        if max_tiles is not None:
            if max_tiles < 1:
                raise VLMGRPOError(f"max_tiles must be >= 1, got {max_tiles}.")
            processor.image_processor.max_patches = max_tiles
            processor.image_processor.min_patches = min(processor.image_processor.min_patches, max_tiles)
