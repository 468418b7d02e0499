"""GLM-4.1V, GLM-4.6V and GLM-4.5V (`Glm4vForConditionalGeneration`, `Glm46VForConditionalGeneration`,
`Glm4vMoeForConditionalGeneration`): images as in Qwen2-VL, GLM's own tokens around them.

Images become 14-pixel patches merged 2x2 (`pixel_values` `[N_patches, C*T*P*P]`, `image_grid_thw` `[N_images, 3]`),
each merged block one `<|image|>` between `<|begin_of_image|>` and `<|end_of_image|>`; the language model places
them with 3-D M-RoPE from `mm_token_type_ids`, like Qwen2-VL (see `qwen2_vl`), whose positions and generation
hooks serve here unchanged. GLM-4.5V's language model routes tokens to expert MLPs, with a router load-balancing
loss trained as for Qwen3-VL MoE (see `qwen3_vl_moe`).

Videos are stored as the images of their frames. GLM writes a video as `<|begin_of_video|>`, then per temporal patch
(two sampled frames) `<|begin_of_image|>`, its `<|image|>` run, `<|end_of_image|>` and its timestamp as text, then
`<|end_of_video|>`. To the model such a video of grid `(t, h, w)` is exactly `t` images of grid `(1, h, w)`: its
`get_video_features` runs the vision tower on them as such, and its M-RoPE places each frame's run as an image's. But
its forward takes every `<|image|>` of a batch as both the image and the video placeholders, so a batch holding images
and videos fails there. `encode_prompt` therefore hands each video's `pixel_values_videos` on as `pixel_values`, one
`image_grid_thw` row per temporal patch, in the prompt's order of images and videos: every batch then holds images only,
to the model the same features and positions (`tests/test_video.py` compares with transformers' own video path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from transformers import (
    Glm4vForConditionalGeneration,
    Glm4vMoeForConditionalGeneration,
    Glm46VForConditionalGeneration,
    PreTrainedModel,
    ProcessorMixin,
)

from .base import EncodedPrompt
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
    video_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values_videos", "video_grid_thw")
    """What the processor returns for videos; a row stores them as images (see the module docstring)."""
    video_feature_keys: ClassVar[tuple[str, ...]] = ()  # the model never receives a video as such
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

    def video_tokens(
        self,
        model_config: Any,
        frames: int,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> int:
        """Counted as GLM's published video processor counts them (`get_num_of_video_patches`, which older
        transformers lack): the frames resized together to multiples of `patch_size * spatial_merge_size` within its
        `size` bounds (`min_pixels` / `max_pixels` replace them), an odd frame count padded to pairs; one token per
        merged patch."""
        from transformers import Glm4vVideoProcessor
        from transformers.models.glm4v.image_processing_glm4v import smart_resize

        vision = model_config.vision_config
        factor = vision.patch_size * vision.spatial_merge_size
        pairs = vision.temporal_patch_size
        size = dict(Glm4vVideoProcessor.size)
        resized_height, resized_width = smart_resize(
            frames,
            height,
            width,
            temporal_factor=pairs,
            factor=factor,
            min_pixels=size["shortest_edge"] if min_pixels is None else min_pixels,
            max_pixels=size["longest_edge"] if max_pixels is None else max_pixels,
        )
        return -(-frames // pairs) * (resized_height // factor) * (resized_width // factor)

    def configure_video(
        self,
        processor: ProcessorMixin,
        fps: float,
        max_frames: int | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        sampler: str = "processor",
    ) -> None:
        """As Qwen3-VL's (`min_pixels` / `max_pixels` bound all the sampled frames' pixels together; GLM offers only
        the processor's `sampler`). GLM's video
        processor caps a file by its duration instead of a frame count: a video longer than `max_duration` seconds gets
        `max_duration * fps` frames spread over it. `max_frames` sets that duration, so that no file yields more than
        `max_frames` frames (one more where it is odd: GLM pairs frames, repeating the last)."""
        super().configure_video(processor, fps, None, min_pixels, max_pixels, sampler)
        if max_frames is not None:
            processor.video_processor.max_duration = (max_frames + 0.5) / fps

    def encode_prompt(
        self,
        processor: ProcessorMixin,
        messages: list[dict],
        images: Sequence[Any] | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        videos: Sequence[dict[str, Any]] | None = None,
    ) -> EncodedPrompt:
        """As `ModelFamily.encode_prompt`, each video then stored as the images of its temporal patches (see the module
        docstring)."""
        encoded = super().encode_prompt(processor, messages, images, chat_template_kwargs, videos)
        if encoded.num_videos:
            encoded.image_inputs = self._videos_as_images(processor, encoded)
        return encoded

    def _videos_as_images(self, processor: ProcessorMixin, encoded: EncodedPrompt) -> dict[str, torch.Tensor]:
        """`pixel_values` and `image_grid_thw` of a prompt's images and videos, in the order the prompt holds them: a
        video's patches as they are, its grid `(t, h, w)` as `t` rows `(1, h, w)`."""
        tokenizer = processor.tokenizer
        image_start, video_start, video_end = (
            tokenizer.convert_tokens_to_ids(token)
            for token in ("<|begin_of_image|>", "<|begin_of_video|>", "<|end_of_video|>")
        )
        ids = torch.tensor(encoded.input_ids)  # [L]
        in_video = (ids == video_start).cumsum(0) > (ids == video_end).cumsum(0)  # [L]
        starts = [(int(p), "image") for p in ((ids == image_start) & ~in_video).nonzero().flatten()]
        starts += [(int(p), "video") for p in (ids == video_start).nonzero().flatten()]
        inputs = encoded.image_inputs
        parts = {}  # kind -> [(patches [N, D], grid rows [n, 3])], in the prompt's order
        for kind, pixels, grid in (
            ("image", "pixel_values", "image_grid_thw"),
            ("video", "pixel_values_videos", "video_grid_thw"),
        ):
            if grid not in inputs:
                continue
            grids = inputs[grid]  # [N_kind, 3]
            chunks = torch.split(inputs[pixels], grids.prod(-1).tolist())
            rows = [g.repeat(int(g[0]), 1).index_fill(1, torch.tensor([0]), 1) for g in grids]  # [t, 3] each
            parts[kind] = list(zip(chunks, rows, strict=True))
        ordered = [parts[kind].pop(0) for _, kind in sorted(starts)]
        return {
            "pixel_values": torch.cat([chunk for chunk, _ in ordered]),  # [N_patches, C*T*P*P]
            "image_grid_thw": torch.cat([rows for _, rows in ordered]),  # [N_images + N_temporal_patches, 3]
        }

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
