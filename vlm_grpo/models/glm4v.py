"""GLM-4.1V, GLM-4.6V and GLM-4.5V (`Glm4vForConditionalGeneration`, `Glm46VForConditionalGeneration`,
`Glm4vMoeForConditionalGeneration`): images as in Qwen2-VL, GLM's own tokens around them.

Images become 14-pixel patches merged 2x2 (`pixel_values` `[N_patches, C*T*P*P]`, `image_grid_thw` `[N_images, 3]`),
each merged block one `<|image|>` between `<|begin_of_image|>` and `<|end_of_image|>`; the language model places
them with 3-D M-RoPE from `mm_token_type_ids`, like Qwen2-VL (see `qwen2_vl`), whose positions and generation
hooks serve here unchanged. Video is refused for now: GLM writes a video's frames as `<|image|>` runs too, and
transformers' forward takes every `<|image|>` of a batch as both the image and the video placeholders, so a batch
that mixes images and videos fails there. GLM-4.5V's language model routes tokens to expert MLPs, with a router load-balancing
loss trained as for Qwen3-VL MoE (see `qwen3_vl_moe`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import (
    Glm4vForConditionalGeneration,
    Glm4vMoeForConditionalGeneration,
    Glm46VForConditionalGeneration,
    PreTrainedModel,
)

from .qwen2_vl import Qwen2VLFamily
from .qwen3_vl_moe import declare_router_logits


class Glm4vFamily(Qwen2VLFamily):
    """Module for `glm4v`, `glm46v` and `glm4v_moe` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("glm4v", "glm46v", "glm4v_moe")
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = (
        "image_token_id",
        "video_token_id",
        "image_start_token_id",
        "image_end_token_id",
        "video_start_token_id",
        "video_end_token_id",
    )
    video_input_keys: ClassVar[tuple[str, ...]] = ()  # see the module docstring
    video_feature_keys: ClassVar[tuple[str, ...]] = ()
    _classes: ClassVar[dict[str, type]] = {
        "glm4v": Glm4vForConditionalGeneration,
        "glm46v": Glm46VForConditionalGeneration,
        "glm4v_moe": Glm4vMoeForConditionalGeneration,
    }

    def image_tokens(
        self,
        model_config: Any,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> int:
        """GLM-4.xV resizes an image as a clip of `temporal_patch_size` frames, to multiples of `patch_size *
        spatial_merge_size`; one token per merged patch."""
        from transformers.models.glm4v.image_processing_glm4v import smart_resize

        vision = model_config.vision_config
        factor = vision.patch_size * vision.spatial_merge_size
        bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
        frames = vision.temporal_patch_size
        resized_height, resized_width = smart_resize(
            frames, height, width, temporal_factor=frames, factor=factor, **bounds
        )
        return (resized_height // factor) * (resized_width // factor)

    def model_class(self) -> type:
        """`Glm4vForConditionalGeneration`, `Glm46VForConditionalGeneration` or `Glm4vMoeForConditionalGeneration`."""
        return self._classes[self.model_type]

    def load_model(self, path: str, **init_kwargs: Any) -> PreTrainedModel:
        """Load the model. GLM-4.5V's text config always declares `output_router_logits` (see `qwen3_vl_moe`), and
        names its routed experts `n_routed_experts` where TRL's router loss reads `num_experts`."""
        model = super().load_model(path, **init_kwargs)
        if self.model_type == "glm4v_moe":
            declare_router_logits(model)
            text_config = model.config.get_text_config()
            text_config.num_experts = text_config.n_routed_experts
        return model
