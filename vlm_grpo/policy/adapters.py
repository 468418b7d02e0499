"""LoRA and QLoRA set-up that knows which modules belong to the vision tower.

By default LoRA targets every linear layer of the language model and none of the vision tower, projector or
LM head; a user list is resolved against module names and the vision tower is still left out.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from accelerate.utils import is_peft_model
from peft import LoraConfig
from torch import nn
from transformers import BitsAndBytesConfig, PreTrainedModel

from ..models.base import ModelFamily


def _is_linear(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    # bitsandbytes' Linear4bit / Linear8bitLt subclass nn.Linear; keep the check explicit for other backends.
    return type(module).__name__ in ("Linear4bit", "Linear8bitLt")


def language_linear_names(
    model: PreTrainedModel, family: ModelFamily, patterns: list[str] | None = None
) -> list[str]:
    """Full names of linear layers of the language model, optionally restricted to name patterns.

    Args:
        model (`PreTrainedModel`): the vision-language model (not yet wrapped by PEFT).
        family (`ModelFamily`): its per-model module (knows the vision module names).
        patterns (`list[str] | None`, defaults to None): module-name suffixes such as `["q_proj", "v_proj"]`;
            None selects every linear layer.

    Returns:
        `list[str]`: sorted full module names, never inside the vision tower/projector, never the LM head.
    """
    output_embeddings = model.get_output_embeddings()
    names = []
    for name, sub in model.named_modules():
        if not _is_linear(sub) or sub is output_embeddings or family.is_vision_module(name):
            continue
        if patterns is None or any(name == p or name.endswith("." + p) for p in patterns):
            names.append(name)
    if not names:
        raise ValueError(
            f"No linear layer of the language model matches lora_target_modules={patterns}; "
            "use names such as q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj."
        )
    return sorted(names)


def resolve_lora_config(peft_config: LoraConfig, model: PreTrainedModel, family: ModelFamily) -> LoraConfig:
    """Return `peft_config` with `target_modules` resolved to language-model linear layers (see module doc).

    `target_modules` None or `"all-linear"` means every language linear layer; a list keeps its entries but drops
    vision modules.
    """
    targets = peft_config.target_modules
    patterns = (
        None
        if targets in (None, "all-linear")
        else ([targets] if isinstance(targets, str) else list(targets))
    )
    peft_config.target_modules = language_linear_names(model, family, patterns)
    return peft_config


def qlora_quantization_config(compute_dtype: torch.dtype = torch.bfloat16, double_quant: bool = False):
    """bitsandbytes 4-bit NF4 config for QLoRA.

    Args:
        compute_dtype (`torch.dtype`, defaults to bf16): dtype of the de-quantized matmuls.
        double_quant (`bool`, defaults to False): also quantize the quantization constants.
    """
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_use_double_quant=double_quant,
    )


def drop_repeated_input_grad_hooks(model: nn.Module) -> None:
    """Keep one input-gradient hook (transformers' `enable_input_require_grads`) on each embedding layer of `model`.

    With gradient checkpointing, TRL turns it off for every generation and on again after it, and each time
    transformers registers its `make_inputs_require_grads` hook anew while losing the handle of the previous one: a run
    would add hooks to the input embeddings at every step (each embedding forward running them all, and a compiled
    decoding step recompiling on their count). The hooks are identical no-ops after the first (they set
    `requires_grad` on the output), so the most recent one of each layer is kept.

    Args:
        model (`nn.Module`): the model (PEFT-wrapped or not).
    """
    for module in model.modules():
        repeated = [
            key
            for key, hook in module._forward_hooks.items()
            if isinstance(hook, types.FunctionType) and hook.__code__.co_name == "make_inputs_require_grads"
        ]
        for key in repeated[:-1]:  # in registration order: the last is the one transformers holds a handle to
            del module._forward_hooks[key]


def base_model(accelerator: Any, model: nn.Module) -> PreTrainedModel:
    """The transformers model under any DDP/DeepSpeed wrapper and PEFT adapter.

    Args:
        accelerator (`Accelerator`): the trainer's accelerator, which unwraps DDP and DeepSpeed.
        model (`nn.Module`): the model, wrapped or not.
    """
    unwrapped = accelerator.unwrap_model(model)
    return unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped
