"""Qwen-VL family: Qwen2-VL, Qwen2.5-VL and Qwen3-VL.

Images become a flat sequence of patches (`pixel_values` `[N_patches, C*T*P*P]`) described by `image_grid_thw`
`[N_images, 3]`; the language model places them with 3-D M-RoPE, which needs `mm_token_type_ids` `[B, L]`
(0 text, 1 image, 2 video) over the whole sequence. Image size is bounded by `min_pixels` / `max_pixels`.

Videos likewise: `pixel_values_videos` `[N_patches, C*T*P*P]` described by `video_grid_thw` `[N_videos, 3]`, plus
Qwen2.5-VL's `second_per_grid_ts` `[N_videos]` (seconds per temporal patch, which its M-RoPE spaces frames by);
Qwen3-VL writes each frame's timestamp as text before it instead. With `video_sampler: qwen_vl_utils`, a video's
frames are those the model cards' `qwen_vl_utils.process_vision_info` picks and sizes
(`vlm_grpo.data.video_frames.decode_video_qwen_vl_utils`), which the processor takes as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from transformers import (
    ProcessorMixin,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
)

from ..data.video_frames import decode_video_qwen_vl_utils, qwen_vl_utils, qwen_vl_utils_processor_kwargs
from ..errors import VLMGRPOError
from .base import ModelFamily


class Qwen2VLFamily(ModelFamily):
    """Module for `qwen2_vl`, `qwen2_5_vl` and `qwen3_vl` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
    vision_module_names: ClassVar[tuple[str, ...]] = ("visual",)
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "image_grid_thw")
    reads_video: ClassVar[bool] = True
    video_input_keys: ClassVar[tuple[str, ...]] = (
        "pixel_values_videos",
        "video_grid_thw",
        "second_per_grid_ts",
    )
    video_feature_keys: ClassVar[tuple[str, ...]] = ("pixel_values_videos", "video_grid_thw")
    grid_keys: ClassVar[tuple[str, ...]] = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
    """The per-image and per-video inputs M-RoPE reads (`get_rope_index`)."""
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = (
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    )
    qwen_vl_utils_model_types: ClassVar[tuple[str, ...]] = model_types
    """The model types whose videos qwen-vl-utils, the Qwen model cards' pipeline, may sample (`video_sampler:
    qwen_vl_utils`); a subclass names its own (one that inherits these serves none of them)."""
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
            raise VLMGRPOError("Qwen-VL models do not tile images: remove max_tiles, use max_pixels instead.")
        image_processor = processor.image_processor
        if min_pixels is not None:
            image_processor.size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            image_processor.size["longest_edge"] = max_pixels
        if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
            raise VLMGRPOError(f"min_pixels ({min_pixels}) must not exceed max_pixels ({max_pixels}).")

    def configure_video(
        self,
        processor: ProcessorMixin,
        fps: float,
        max_frames: int | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        sampler: str = "processor",
    ) -> None:
        """As `ModelFamily.configure_video`; `min_pixels` / `max_pixels` set the video processor's `size`
        (`shortest_edge` / `longest_edge`), which bounds the pixels of each sampled frame in Qwen2-VL and Qwen2.5-VL
        (`Qwen2VLVideoProcessor`), and of all the sampled frames together (frames x height x width) in Qwen3-VL,
        Qwen3-VL MoE and Qwen3.5 (`Qwen3VLVideoProcessor`); `tests/test_video_files.py` pins both.

        With `sampler="qwen_vl_utils"`, qwen-vl-utils samples and sizes each video instead, with `fps`, `max_frames`
        and `min_pixels` / `max_pixels` as its per-frame `min_pixels` / `max_pixels` (see `video_inputs`); the video
        processor's `size` is left as it is (it does not resize those frames)."""
        super().configure_video(processor, fps, max_frames, sampler=sampler)
        if sampler == "qwen_vl_utils":
            self._qwen_vl_utils_options = {
                "fps": fps,
                "max_frames": max_frames,
                "min_pixels": min_pixels,
                "max_pixels": max_pixels,
            }
            self._check_qwen_vl_utils_bounds(processor, min_pixels, max_pixels)
            return
        size = processor.video_processor.size
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        if size["shortest_edge"] > size["longest_edge"]:
            raise VLMGRPOError(
                f"video_min_pixels ({size['shortest_edge']}) must not exceed video_max_pixels ({size['longest_edge']})."
            )

    def video_samplers(self) -> tuple[str, ...]:
        """`"processor"`, and `"qwen_vl_utils"` for the model types whose model cards sample videos with qwen-vl-utils
        (`qwen_vl_utils_model_types`)."""
        if self.model_type in self.qwen_vl_utils_model_types:
            return ("processor", "qwen_vl_utils")
        return ("processor",)

    def _check_qwen_vl_utils_bounds(
        self, processor: ProcessorMixin, min_pixels: int | None, max_pixels: int | None
    ) -> None:
        """Refuse a `max_pixels` below the per-frame minimum qwen-vl-utils would apply (`min_pixels`, else its default
        of `VIDEO_MIN_TOKEN_NUM` tokens' worth), which it would fail on for every video (qwen-vl-utils is imported
        here, so that a missing install is reported when the trainer is built)."""
        vision_process = qwen_vl_utils()
        factor = processor.video_processor.patch_size * vision_process.SPATIAL_MERGE_SIZE
        floor = min_pixels if min_pixels is not None else vision_process.VIDEO_MIN_TOKEN_NUM * factor**2
        if max_pixels is not None and max_pixels < floor:
            raise VLMGRPOError(
                f"video_max_pixels ({max_pixels}) is below the pixels qwen-vl-utils gives each frame at least "
                f"({floor}: video_min_pixels, else its {vision_process.VIDEO_MIN_TOKEN_NUM} tokens of "
                f"{factor}x{factor} pixels); with video_sampler: qwen_vl_utils, raise video_max_pixels or set "
                "video_min_pixels below it."
            )

    def video_inputs(self, processor: ProcessorMixin, videos: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """As `ModelFamily.video_inputs`; with `video_sampler: qwen_vl_utils`, each video's frames, their size and
        metadata are those `qwen_vl_utils.process_vision_info` gives for the video's entry (`fps`, `max_frames`,
        `min_pixels`, `max_pixels`, the vision tower's `image_patch_size`), and the processor neither samples nor
        resizes them again, as in the model cards' pipeline."""
        if self.video_sampling != "qwen_vl_utils":
            return super().video_inputs(processor, videos)
        patch_size = processor.video_processor.patch_size
        decoded = [
            decode_video_qwen_vl_utils(video, image_patch_size=patch_size, **self._qwen_vl_utils_options)
            for video in videos
        ]
        return qwen_vl_utils_processor_kwargs(decoded)

    def image_tokens(
        self,
        model_config: Any,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> int:
        """Qwen-VL resizes to multiples of `patch_size * spatial_merge_size` within the pixel bounds; one token per
        merged patch."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        vision = model_config.vision_config
        factor = vision.patch_size * vision.spatial_merge_size
        bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
        resized_height, resized_width = smart_resize(height, width, factor=factor, **bounds)
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
        """Counted by the published video processor class (Qwen2-VL's, or Qwen3-VL's for Qwen3-VL and Qwen3.5) with
        the model's patch layout and its `size` bounds (`min_pixels` / `max_pixels` replace them): its
        `get_num_of_video_patches`, one token per merged patch."""
        from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

        cls = Qwen3VLVideoProcessor if self.model_type.startswith("qwen3") else Qwen2VLVideoProcessor
        vision = model_config.vision_config
        size = dict(cls.size)
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        processor = cls(
            size=size,
            patch_size=vision.patch_size,
            merge_size=vision.spatial_merge_size,
            temporal_patch_size=vision.temporal_patch_size,
        )
        return processor.get_num_of_video_patches(frames, height, width, {}) // vision.spatial_merge_size**2

    def join_image_features(self, outputs: Sequence[Any]) -> Any:
        """Per-image `pooler_output` tuples chained; Qwen3-VL's `deepstack_features` joined layer by layer."""
        joined = super().join_image_features(outputs)
        if outputs[0].get("deepstack_features") is not None:
            layers = zip(
                *(o["deepstack_features"] for o in outputs), strict=True
            )  # per layer: one entry per output
            joined["deepstack_features"] = [
                torch.cat(per_layer, dim=0)  # a [tokens, D] tensor per output
                if isinstance(per_layer[0], torch.Tensor)
                else tuple(t for entry in per_layer for t in entry)  # per-image tuples, as they come split
                for per_layer in layers
            ]
        return joined

    def token_type_inputs(self, input_ids: torch.Tensor, model_config: Any) -> dict[str, torch.Tensor]:
        """`mm_token_type_ids` `[B, L]`: 1 on image tokens, 2 on video tokens, 0 elsewhere (M-RoPE needs it)."""
        types = (input_ids == model_config.image_token_id).long()
        types = types + 2 * (input_ids == model_config.video_token_id).long()
        return {"mm_token_type_ids": types}

    def _rope_index(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_inputs: Sequence[dict]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(position_ids [3, B, L], rope_deltas [B, 1])` by the model's own M-RoPE rule; None without images or videos.

        The model's rule walks every row in Python. Here it runs once per distinct row head (the columns up to the
        last vision token of the batch: the prompt, identical across a group's rows), and the text after it, where
        M-RoPE counts like 1-D RoPE shifted by the row's delta, is filled in one tensor operation. Padding gets
        position 0, as the model gives it.

        The delta is where the model's forward places a text token after the head (one text column appended to each
        head when the rule runs), less that token's index. The model's own `rope_deltas` (the head's largest position
        + 1, less its length) says the same after images, but not after a video whose frames span more positions than
        its width or height: transformers' forward then continues at the spatial extent while its `generate` would
        continue after the largest position. Here every pass, generation included, places tokens as the forward does.
        """
        if not any(key in row for row in image_inputs for key in self.grid_keys):
            return None
        types = self.token_type_inputs(input_ids, model.config)["mm_token_type_ids"]  # [B, L]
        cut = int(types.ne(0).any(0).nonzero().max()) + 1  # columns >= cut are text in every row
        heads = torch.cat([input_ids[:, :cut], attention_mask[:, :cut].to(input_ids.dtype)], 1).cpu().numpy()
        distinct: dict[bytes, int] = {}
        inverse = []  # row -> its distinct head
        for row, head in enumerate(heads):
            own = [
                image_inputs[row][k].cpu().numpy().tobytes() for k in self.grid_keys if k in image_inputs[row]
            ]
            inverse.append(distinct.setdefault(head.tobytes() + b"|".join(own), row))
        firsts = sorted(set(inverse))
        # image_grid_thw [N_images, 3], video_grid_thw [N_videos, 3], second_per_grid_ts [N_videos]
        grids = {
            key: torch.cat([image_inputs[row][key] for row in firsts if key in image_inputs[row]])
            for key in self.grid_keys
            if any(key in image_inputs[row] for row in firsts)
        }
        grids = {key: value.to(input_ids.device) for key, value in grids.items()}
        # one text token after each head: where the model places it is where the text after the head goes on
        text_column = input_ids.new_zeros(len(firsts), 1)
        probe_mask = torch.cat([attention_mask[firsts, :cut], text_column + 1], 1)  # [U, cut+1]
        probe_positions, _ = model.model.get_rope_index(
            torch.cat([input_ids[firsts, :cut], text_column], 1),
            mm_token_type_ids=torch.cat([types[firsts, :cut], text_column], 1),
            attention_mask=probe_mask,
            **grids,
        )  # [3, U, cut+1]
        head_positions = probe_positions[:, :, :cut].to(input_ids.device)  # [3, U, cut]
        head_deltas = probe_positions[0, :, cut:].to(input_ids.device) - (probe_mask.sum(1, keepdim=True) - 1)
        slot = {row: i for i, row in enumerate(firsts)}
        index = torch.tensor([slot[row] for row in inverse], device=input_ids.device)  # [B]
        deltas = head_deltas[index]  # [B, 1]
        text = (attention_mask.long().cumsum(-1) - 1)[:, cut:] + deltas  # [B, L-cut]
        text = text.masked_fill(attention_mask[:, cut:] == 0, 0)
        positions = torch.cat([head_positions[:, index], text.expand(3, -1, -1)], 2)
        return positions, deltas

    def position_ids(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_inputs: Sequence[dict],
        generation: bool = False,
    ) -> torch.Tensor | None:
        """M-RoPE positions `[3, B, L]` of full rows, as the model computes them (see `ModelFamily.position_ids`).

        Always explicit: with a KV cache and no positions, the model would reuse `rope_deltas` left over from an
        earlier `generate`. Text-only batches count tokens (`generate`: unpadded tokens), as the model does.
        """
        rope = self._rope_index(model, input_ids, attention_mask, image_inputs)
        if rope is not None:
            return rope[0]
        positions = super().position_ids(model, input_ids, attention_mask, image_inputs, generation)
        if positions is None:
            positions = torch.arange(input_ids.size(1), device=input_ids.device).expand_as(input_ids)
        return positions.unsqueeze(0).expand(3, -1, -1)

    def prepare_generation_from_cache(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_inputs: Sequence[dict]
    ) -> None:
        """`generate` places new tokens at text position + `model.model.rope_deltas` `[B, 1]`: set them for these rows."""
        rope = self._rope_index(model, input_ids, attention_mask, image_inputs)
        deltas = None if rope is None else rope[1]
        if deltas is None:
            deltas = torch.zeros(input_ids.size(0), 1, dtype=torch.long, device=input_ids.device)
        model.model.rope_deltas = deltas.to(input_ids.device)
