"""Qwen3.5 (`Qwen3_5ForConditionalGeneration`) and Qwen3.5 MoE (`Qwen3_5MoeForConditionalGeneration`).

Images and M-RoPE positions are those of Qwen3-VL without deepstack (see `qwen2_vl`). The language model is
hybrid: three of every four layers are Gated DeltaNet linear attention, whose cache holds a convolution state and a
recurrent state per row instead of keys and values, and the fourth is full attention (rotating a quarter of each
head). Those states are not indexed from groups to rows here, so the family runs full rows in every pass
(`indexable_cache = False`; the trainer says so in one log line). Qwen3.5 MoE adds expert MLPs with a shared expert
and a router load-balancing loss (`router_aux_loss_coef`), trained as for Qwen3-VL MoE.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import (
    PreTrainedModel,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
)

from .qwen2_vl import Qwen2VLFamily
from .qwen3_vl_moe import declare_router_logits


class Qwen3_5Family(Qwen2VLFamily):
    """Module for `qwen3_5` and `qwen3_5_moe` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("qwen3_5", "qwen3_5_moe")
    qwen_vl_utils_model_types: ClassVar[tuple[str, ...]] = model_types
    """Its videos may be sampled by qwen-vl-utils, as Qwen3-VL's (`video_sampler: qwen_vl_utils`)."""
    indexable_cache: ClassVar[bool] = False
    _classes: ClassVar[dict[str, type]] = {
        "qwen3_5": Qwen3_5ForConditionalGeneration,
        "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration,
    }

    def model_class(self) -> type:
        """`Qwen3_5ForConditionalGeneration` or `Qwen3_5MoeForConditionalGeneration`."""
        return self._classes[self.model_type]

    def attention_head_dims(self, model_config: Any) -> dict[str, int]:
        """The full-attention layers' head dim and the Gated DeltaNet layers' key and value head dims."""
        text = model_config.get_text_config()
        return {
            **super().attention_head_dims(model_config),
            "linear-attention key": text.linear_key_head_dim,
            "linear-attention value": text.linear_value_head_dim,
        }

    def load_model(self, path: str, **init_kwargs: Any) -> PreTrainedModel:
        """Load the model; a MoE text config always declares `output_router_logits` (see `qwen3_vl_moe`)."""
        model = super().load_model(path, **init_kwargs)
        if self.model_type == "qwen3_5_moe":
            declare_router_logits(model)
        return model
