"""InternVL, transformers-native (`InternVLForConditionalGeneration`, the `-hf` checkpoints).

Each image is cut into tiles (`pixel_values` `[N_tiles, C, H, W]`, up to `max_tiles` per image plus a
thumbnail); each tile becomes a fixed number of `<IMG_CONTEXT>` tokens between `<img>` and `</img>`. The tile
count per image is already encoded in the prompt's tokens, so per-sample tiles concatenate without bookkeeping.

A video is its sampled frames, each resized to one tile (no thumbnail) and written `Frame{i}: <img>...</img>`; the
processor merges the frames into `pixel_values` in the prompt's order of images and videos, so the model, and every
pass here, takes them as images. InternVL's video processor samples `fps` frames per second, or a fixed
`num_frames`; it has no cap on the count, so `video_max_frames` is refused. vLLM writes each frame's tokens with the
video token where transformers' processor writes the image token, so its prompts would not be the trainer's: videos
with `use_vllm` are refused.

InternVL3.5 also comes with a mixture-of-experts language model (`InternVL3_5-30B-A3B-HF`: a `qwen3_moe` text
config). `InternVLModel` drops the router logits its language model returns, so TRL could not add the router
load-balancing loss; `load_model` passes them through (see `pass_router_logits_through`). As for every MoE model,
the pass that needs that loss runs full rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from transformers import InternVLForConditionalGeneration, PreTrainedModel, ProcessorMixin
from transformers.video_utils import VideoMetadata

from ..errors import VLMGRPOError
from .base import ModelFamily


class InternVLFamily(ModelFamily):
    """Module for `internvl` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("internvl",)
    vision_module_names: ClassVar[tuple[str, ...]] = ("vision_tower", "multi_modal_projector")
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values",)
    reads_video: ClassVar[bool] = True  # as images: see the module docstring
    # each frame is resized to the tile size: no pixel bounds either
    video_frames_uncapped: ClassVar[bool] = True
    vllm_video_refusal: ClassVar[str] = (
        "vLLM fills each frame with the video token, where InternVL's processor writes the image token, so the prompt "
        "ids differ"
    )
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

    def load_model(self, path: str, **init_kwargs: Any) -> PreTrainedModel:
        """Load the model; with a mixture-of-experts language model, its router logits reach the output."""
        model = super().load_model(path, **init_kwargs)
        if hasattr(model.config.get_text_config(), "output_router_logits"):
            pass_router_logits_through(model)
        return model

    def video_sampler(self, processor: ProcessorMixin) -> Callable[..., Any]:
        """InternVL's video processor samples `int(duration * fps)` frames of a file, none of a clip shorter than one
        sampling interval (`1 / video_fps` seconds), where it would divide by zero. Such a clip gets one frame, picked
        by the same processor's rule for a count of one (its middle frame, with `initial_shift`), as InternVL's own
        video loader samples a fixed number of frames from any clip; longer clips are sampled as the processor does.

        Args:
            processor (`ProcessorMixin`): the family's processor, its video processor configured.
        """
        video_processor = processor.video_processor
        fps = video_processor.fps

        def sample(metadata: VideoMetadata) -> Any:
            if int(metadata.total_num_frames / metadata.fps * fps) < 1:
                return video_processor.sample_frames(metadata, num_frames=1)
            return video_processor.sample_frames(metadata, fps=fps)

        return sample

    def image_tokens(
        self,
        model_config: Any,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> int:
        """InternVL cuts an image into up to `max_tiles` (12) square tiles of the vision tower's size on the grid
        closest to its aspect ratio, plus a thumbnail when there is more than one; each tile is `(image_size /
        patch_size)^2 * downsample_ratio^2` tokens."""
        from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

        vision = model_config.vision_config
        tile = vision.image_size[0]
        columns, rows = get_optimal_tiled_canvas((height, width), (tile, tile), 1, max_tiles or 12)
        tiles = columns * rows + (1 if columns * rows > 1 else 0)
        per_tile = int((tile // vision.patch_size[0]) ** 2 * model_config.downsample_ratio**2)
        return tiles * per_tile

    def video_tokens(
        self,
        model_config: Any,
        frames: int,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> int:
        """One tile per frame, whatever its size: `frames * (image_size / patch_size)^2 * downsample_ratio^2`."""
        vision = model_config.vision_config
        return frames * int(
            (vision.image_size[0] // vision.patch_size[0]) ** 2 * model_config.downsample_ratio**2
        )

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


def pass_router_logits_through(model: PreTrainedModel) -> None:
    """Make `model.model` (an `InternVLModel`) return its language model's `router_logits` when asked for them.

    TRL computes the load-balancing loss from `model.model(..., output_router_logits=True).router_logits` (one
    `[tokens, num_experts]` tensor per MoE layer); `InternVLModel` returns only the hidden states. Two forward hooks
    carry the language model's field over. Copies of the model (`copy.deepcopy`, the reference model) keep them.
    """
    inner = model.model
    seen: dict[str, Any] = {}

    def keep(module: torch.nn.Module, args: Any, output: Any) -> Any:
        seen["router_logits"] = getattr(output, "router_logits", None)
        if seen["router_logits"] is None:
            return None
        # from transformers 5.24 `InternVLModel` builds its output from every field of this one: without the field
        # it does not declare, it can; `attach` adds the field to that output
        return type(output)(**{key: value for key, value in output.items() if key != "router_logits"})

    def attach(module: torch.nn.Module, args: Any, output: Any) -> None:
        router_logits = seen.pop("router_logits", None)
        if router_logits is not None:
            output["router_logits"] = router_logits  # a new `ModelOutput` field, readable as an attribute

    inner.language_model.register_forward_hook(keep)
    inner.register_forward_hook(attach)
