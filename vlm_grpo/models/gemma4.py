"""Gemma 4 (`Gemma4ForConditionalGeneration`): images and videos; audio inputs are refused.

Each image is resized (aspect kept) to at most `max_soft_tokens * pooling_kernel_size**2` patches, flattened to
`pixel_values` `[N_images, max_patches, 3*P*P]` with `image_position_ids` `[N_images, max_patches, 2]` (-1 on
padding), and pooled to soft tokens between `<|image>` and `<image|>`. Image tokens attend to each other
bidirectionally, which the model derives from `mm_token_type_ids` `[B, L]` (1 image, 2 video, 3 audio).

A video's sampled frames go through the vision tower as images do: `pixel_values_videos` `[N_frames, max_patches,
3*P*P]`, `video_position_ids` `[N_frames, max_patches, 2]` and `num_frames_per_video` `[N_videos]`, each frame written
as its timestamp (`mm:ss`) and `<|image>` + `<|video|>` * soft tokens + `<image|>`, whose tokens attend to each other
bidirectionally like an image's. The frames of every video are concatenated along one axis since transformers 5.19
(earlier releases stack them per video, `[N_videos, N_frames, ...]`, so that videos of different lengths cannot share
a batch): with an older transformers, a video is refused in one line. The audio tower is not wired into the trainer:
a prompt holding an audio entry is an error, and its placeholder tokens (like the image and video ones) are never
sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import transformers
from transformers import Gemma4ForConditionalGeneration, Gemma4VideoProcessor, ProcessorMixin

from ..errors import VLMGRPOError
from .base import EncodedPrompt, ModelFamily

VIDEO_KEYS = ("pixel_values_videos", "video_position_ids", "num_frames_per_video")
"""Gemma 4's video inputs since transformers 5.19, the frames of all videos along one axis."""
READS_VIDEO = "num_frames_per_video" in Gemma4VideoProcessor.model_input_names
"""Whether the installed transformers lays Gemma 4's video frames out along one axis (5.19 and later)."""
UNSUPPORTED_PARTS = ("audio", "input_audio", "audio_url") + (() if READS_VIDEO else ("video", "video_url"))


class Gemma4Family(ModelFamily):
    """Module for `gemma4` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("gemma4",)
    vision_module_names: ClassVar[tuple[str, ...]] = (
        "vision_tower",
        "embed_vision",
        "audio_tower",
        "embed_audio",
    )
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "image_position_ids")
    reads_video: ClassVar[bool] = READS_VIDEO
    video_input_keys: ClassVar[tuple[str, ...]] = VIDEO_KEYS if READS_VIDEO else ()
    video_feature_keys: ClassVar[tuple[str, ...]] = VIDEO_KEYS if READS_VIDEO else ()
    # each frame is sized by max_soft_tokens: no pixel bounds either
    video_frames_uncapped: ClassVar[bool] = True
    vllm_video_refusal: ClassVar[str] = (
        "its Gemma 4 video path is not checked against the processor's ids: the vLLM releases checked run a "
        "transformers older than 5.19"
    )
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = (
        "image_token_id",
        "video_token_id",
        "boi_token_id",
        "eoi_token_id",
        "audio_token_id",
        "boa_token_id",
        "eoa_token_index",
    )
    placeholder_processor_attrs: ClassVar[tuple[str, ...]] = (
        "image_token",
        "video_token",
        "boi_token",
        "eoi_token",
        "audio_token",
        "boa_token",
        "eoa_token",
    )

    def model_class(self) -> type:
        """`Gemma4ForConditionalGeneration`."""
        return Gemma4ForConditionalGeneration

    def attention_head_dims(self, model_config: Any) -> dict[str, int]:
        """The sliding-window layers' head dim, and the global layers' (`global_head_dim`) where it differs."""
        dims = super().attention_head_dims(model_config)
        text = model_config.get_text_config()
        if getattr(text, "global_head_dim", None):
            dims["global attention"] = text.global_head_dim
        return dims

    def configure_image_size(
        self,
        processor: ProcessorMixin,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> None:
        """Gemma 4 sizes images by its processor's `max_soft_tokens`: no knob of ours applies."""
        super().configure_image_size(
            processor, min_pixels=min_pixels, max_pixels=max_pixels, max_tiles=max_tiles
        )

    def no_video_reason(self) -> str:
        """Gemma 4 reads video with transformers 5.19 and later."""
        return (
            f"Gemma 4 reads video only with transformers >= 5.19 ({transformers.__version__} is installed: "
            "upgrade it)"
        )

    def video_tokens(
        self,
        model_config: Any,
        frames: int,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> int | None:
        """Each frame resized (aspect kept) to at most the video processor's `max_soft_tokens` pooled patches, as its
        `_get_num_multimodal_tokens` counts them; one soft token per pooled patch, per frame."""
        if not self.reads_video:
            return None
        from transformers.models.gemma4.video_processing_gemma4 import get_aspect_ratio_preserving_size

        vision = model_config.vision_config
        patch, kernel = vision.patch_size, vision.pooling_kernel_size
        max_patches = Gemma4VideoProcessor.max_soft_tokens * kernel**2
        resized_height, resized_width = get_aspect_ratio_preserving_size(
            height=height, width=width, patch_size=patch, max_patches=max_patches, pooling_kernel_size=kernel
        )
        return frames * (resized_height // patch) * (resized_width // patch) // kernel**2

    def encode_prompt(
        self,
        processor: ProcessorMixin,
        messages: list[dict],
        images: Sequence[Any] | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        videos: Sequence[dict[str, Any]] | None = None,
    ) -> EncodedPrompt:
        """As `ModelFamily.encode_prompt`; a prompt with an audio entry is refused (one-line error), and a video entry
        too with a transformers older than 5.19."""
        for message in messages:
            parts = message["content"] if isinstance(message["content"], list) else []
            kinds = sorted({part.get("type") for part in parts} & set(UNSUPPORTED_PARTS))
            if kinds:
                supported = "images, videos and text" if self.reads_video else "images and text"
                why = "" if self.reads_video else f"; {self.no_video_reason()}"
                raise VLMGRPOError(
                    f"Gemma 4 {'/'.join(kinds)} inputs are not supported (a {message['role']} message holds "
                    f"{kinds[0]!r}); only {supported} are{why}."
                )
        return super().encode_prompt(processor, messages, images, chat_template_kwargs, videos)

    def vllm_history_ids(self, processor: ProcessorMixin, ids: Sequence[int]) -> list[int]:
        """As `ModelFamily.vllm_history_ids`; Gemma 4 expands each `<|image|>` into `<|image>` + soft tokens +
        `<image|>`, so the whole span becomes one `<|image|>` again (vLLM writes the span itself)."""
        collapsed = super().vllm_history_ids(processor, ids)
        image = self.image_token_id(processor)
        boi, eoi = processor.tokenizer.convert_tokens_to_ids([processor.boi_token, processor.eoi_token])
        history: list[int] = []
        for i, token in enumerate(collapsed):
            opens = token == boi and i + 1 < len(collapsed) and collapsed[i + 1] == image
            closes = token == eoi and history and history[-1] == image
            if not (opens or closes):
                history.append(token)
        return history

    def join_image_features(self, outputs: Sequence[Any]) -> Any:
        """As `ModelFamily.join_image_features`, per-image `pooler_output` tuples chained in image order.

        transformers 5.17 sets `pooler_output` on the vision tower's output as a plain attribute, not a field.
        """
        joined = super().join_image_features(outputs)
        if "pooler_output" not in joined:
            joined.pooler_output = tuple(t for o in outputs for t in o.pooler_output)  # [soft tokens, D] each
        return joined

    def token_type_inputs(self, input_ids: torch.Tensor, model_config: Any) -> dict[str, torch.Tensor]:
        """`mm_token_type_ids` `[B, L]`: 1 on image soft tokens, 2 on video soft tokens (bidirectional attention among
        each run of them), 0 elsewhere."""
        images = (input_ids == model_config.image_token_id).long()
        videos = (input_ids == model_config.video_token_id).long()
        return {"mm_token_type_ids": images + 2 * videos}  # [B, L]

    def bidirectional_image_attention(self, model_config: Any) -> bool:
        """Gemma 4 attends bidirectionally among each image's soft tokens where its text config says
        `use_bidirectional_attention: vision` (the published vision checkpoints), on its sliding-window layers."""
        return model_config.get_text_config().use_bidirectional_attention == "vision"
