"""`cast_lm_head_to_fp32` for vision-language models: TRL's cast, finding the embedding where a VLM keeps it.

TRL 1.16 casts the LM head to float32 and, when the input embedding shares its weight (`tie_word_embeddings`, as in
the 2B-4B Qwen-VL checkpoints), hooks `model.model.embed_tokens` so that embeddings keep the model's dtype. A VLM
nests its embedding one level deeper (`model.model.language_model.embed_tokens`), so TRL's cast fails there with an
`AttributeError`. The trainer lets TRL cast the policy's head with the tie hidden, then adds the hook itself
(`keep_embedding_dtype`), and casts its own reference model with `cast_lm_head_to_fp32`: the same operations,
reaching the embedding through `get_input_embeddings()`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel


def keep_embedding_dtype(model: PreTrainedModel, dtype: torch.dtype) -> None:
    """Cast the input embedding's outputs to `dtype` (its weight, shared with an fp32 LM head, is fp32 now)."""

    def cast_outputs(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.to(dtype)

    model.get_input_embeddings().register_forward_hook(cast_outputs)


def cast_lm_head_to_fp32(model: PreTrainedModel) -> None:
    """Compute the LM head in float32, as TRL's `cast_lm_head_to_fp32` does; embeddings keep the model's dtype."""
    dtype = model.lm_head.weight.dtype
    lm_head = model.lm_head.float()
    model.lm_head = lm_head

    def forward_in_fp32(hidden_states: torch.Tensor) -> torch.Tensor:
        bias = None if lm_head.bias is None else lm_head.bias.to(torch.float32)
        return nn.functional.linear(hidden_states.to(torch.float32), lm_head.weight.to(torch.float32), bias)

    lm_head.forward = forward_in_fp32
    if model.config.tie_word_embeddings:
        keep_embedding_dtype(model, dtype)
