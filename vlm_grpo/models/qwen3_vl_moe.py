"""Qwen3-VL MoE (`Qwen3VLMoeForConditionalGeneration`, e.g. Qwen3-VL-30B-A3B): Qwen3-VL with expert MLPs.

Images, M-RoPE positions and deepstack features are those of Qwen3-VL (see `qwen2_vl`). The language model routes
each token to `num_experts_per_tok` of `num_experts` expert MLPs and adds a router load-balancing loss weighted by
`router_aux_loss_coef` (0.001 in the released configs). The pass that needs that loss (the policy forward of the
training step) runs full rows: the loss is a mean over every token the router saw, which a shared prompt would see
once instead of G times. Every other pass (generation, old and reference log-probs) shares the prompt.

TRL knows a model has a router loss by `output_router_logits` on its text config; transformers 5.17 reads that flag
from the forward's arguments only and leaves it out of the config, so `load_model` puts it back (False: the trainer
asks for router logits in the pass that needs them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel, Qwen3VLMoeForConditionalGeneration

from .qwen2_vl import Qwen2VLFamily


class Qwen3VLMoeFamily(Qwen2VLFamily):
    """Module for `qwen3_vl_moe` checkpoints."""

    model_types: ClassVar[tuple[str, ...]] = ("qwen3_vl_moe",)
    qwen_vl_utils_model_types: ClassVar[tuple[str, ...]] = model_types
    """Its videos may be sampled by qwen-vl-utils, as Qwen3-VL's (`video_sampler: qwen_vl_utils`)."""
    _classes: ClassVar[dict[str, type]] = {"qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration}

    def model_class(self) -> type:
        """`Qwen3VLMoeForConditionalGeneration`."""
        return Qwen3VLMoeForConditionalGeneration

    def vllm_weights(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The fused expert weights, `[E, out, in]` in transformers, are `[E, in, out]` in the hub layout and vLLM."""
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            tensor = tensor.transpose(1, 2)
        yield name, tensor

    def load_model(self, path: str, **init_kwargs: Any) -> PreTrainedModel:
        """Load the model; its text config always declares `output_router_logits` (see the module doc)."""
        model = super().load_model(path, **init_kwargs)
        declare_router_logits(model)
        return model


def declare_router_logits(model: PreTrainedModel) -> None:
    """Set `output_router_logits = False` on the text config where the config leaves it out (transformers 5.17)."""
    text_config = model.config.get_text_config()
    if not hasattr(text_config, "output_router_logits"):
        text_config.output_router_logits = False
