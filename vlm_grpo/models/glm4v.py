"""GLM-4.1V and GLM-4.6V (`Glm4vForConditionalGeneration`, `Glm46VForConditionalGeneration`): images as in
Qwen2-VL, GLM's own tokens around them.

Images become 14-pixel patches merged 2x2 (`pixel_values` `[N_patches, C*T*P*P]`, `image_grid_thw` `[N_images, 3]`),
each merged block one `<|image|>` between `<|begin_of_image|>` and `<|end_of_image|>`; the language model places
them with 3-D M-RoPE from `mm_token_type_ids`, like Qwen2-VL (see `qwen2_vl`), whose positions and generation
hooks serve here unchanged.
"""

from __future__ import annotations

from typing import ClassVar

from transformers import Glm4vForConditionalGeneration, Glm46VForConditionalGeneration

from .qwen2_vl import Qwen2VLFamily


class Glm4vFamily(Qwen2VLFamily):
    """Module for `glm4v` and `glm46v` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("glm4v", "glm46v")
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = (
        "image_token_id",
        "video_token_id",
        "image_start_token_id",
        "image_end_token_id",
        "video_start_token_id",
        "video_end_token_id",
    )
    _classes: ClassVar[dict[str, type]] = {
        "glm4v": Glm4vForConditionalGeneration,
        "glm46v": Glm46VForConditionalGeneration,
    }

    def model_class(self) -> type:
        """`Glm4vForConditionalGeneration` or `Glm46VForConditionalGeneration`."""
        return self._classes[self.model_type]
