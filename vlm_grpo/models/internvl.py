"""InternVL, transformers-native (`InternVLForConditionalGeneration`, the `-hf` checkpoints).

Each image is cut into tiles (`pixel_values` `[N_tiles, C, H, W]`, up to `max_tiles` per image plus a
thumbnail); each tile becomes a fixed number of `<IMG_CONTEXT>` tokens between `<img>` and `</img>`. The tile
count per image is already encoded in the prompt's tokens, so per-sample tiles concatenate without bookkeeping.

InternVL3.5 also comes with a mixture-of-experts language model (`InternVL3_5-30B-A3B-HF`: a `qwen3_moe` text
config). `InternVLModel` drops the router logits its language model returns, so TRL could not add the router
load-balancing loss; `load_model` passes them through (see `pass_router_logits_through`). As for every MoE model,
the pass that needs that loss runs full rows.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from transformers import InternVLForConditionalGeneration, PreTrainedModel, ProcessorMixin

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

    def load_model(self, path: str, **init_kwargs: Any) -> PreTrainedModel:
        """Load the model; with a mixture-of-experts language model, its router logits reach the output."""
        model = super().load_model(path, **init_kwargs)
        if hasattr(model.config.get_text_config(), "output_router_logits"):
            pass_router_logits_through(model)
        return model

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

    def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
        seen["router_logits"] = getattr(output, "router_logits", None)

    def attach(module: torch.nn.Module, args: Any, output: Any) -> None:
        router_logits = seen.pop("router_logits", None)
        if router_logits is not None:
            output["router_logits"] = router_logits  # a new `ModelOutput` field, readable as an attribute

    inner.language_model.register_forward_hook(keep)
    inner.register_forward_hook(attach)
