"""`vlm-grpo plan`: the dtypes TRL leaves the weights in, and each optimizer's states as transformers builds it.

The adapters and the LM head are compared with a real `VLMGRPOTrainer` (TRL's own set-up: PEFT, its bfloat16 cast
of a quantized model's adapters, `cast_lm_head_to_fp32`); the optimizer states with the optimizer transformers'
`Trainer.create_optimizer` builds for each `optim`, after one real step.
"""

from __future__ import annotations

import pytest
import torch
from conftest import color_dataset, grpo_args, length_reward
from test_plan import planned

from vlm_grpo.testing import DEFAULT_FAMILY


def trainer_for(path: str, tmp_path, lora: bool, quantized: bool = False, **options):
    """A real trainer of the model loaded in bfloat16 (4-bit with `quantized`), with LoRA r=8 or not."""
    from peft import LoraConfig

    from vlm_grpo import VLMGRPOTrainer
    from vlm_grpo.policy.adapters import qlora_quantization_config

    args = grpo_args(tmp_path, model_init_kwargs={"dtype": "bfloat16"}, **options)
    extra = {"quantization_config": qlora_quantization_config(torch.bfloat16)} if quantized else {}
    if lora:
        extra["peft_config"] = LoraConfig(r=8)
    return VLMGRPOTrainer(path, length_reward, args=args, train_dataset=color_dataset(4), **extra)


@pytest.mark.parametrize("quantized", [False, True])
def test_lora_adapters_take_the_dtype_trl_leaves_them_in(quantized, tiny_model, tmp_path):
    """PEFT upcasts LoRA adapters of a bfloat16 model to float32; on a 4-bit model TRL casts them to bfloat16."""
    path = tiny_model(DEFAULT_FAMILY)
    trainer = trainer_for(path, tmp_path, lora=True, quantized=quantized)
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    result = planned(path, dtype="bfloat16", use_peft=True, lora_r=8, load_in_4bit=quantized)
    adapters = next(t for t in result.plan.held if t.name == "LoRA adapters")
    assert adapters.gpu == sum(p.numel() * p.element_size() for p in trained)
    gradients = next(t for t in result.plan.training if t.name == "gradients")
    assert gradients.gpu == adapters.gpu


def test_cast_lm_head_to_fp32_keeps_the_head_in_float32(tiny_model, tmp_path):
    path = tiny_model(DEFAULT_FAMILY)
    trainer = trainer_for(path, tmp_path, lora=False, cast_lm_head_to_fp32=True)
    assert trainer.model.get_output_embeddings().weight.dtype == torch.float32
    result = planned(path, dtype="bfloat16", cast_lm_head_to_fp32=True)
    weights = next(t for t in result.plan.held if t.name == "weights")
    assert weights.gpu == sum(p.numel() * p.element_size() for p in trainer.model.parameters())


OPTIMIZERS = [
    ("adamw_torch", None),
    ("adamw_torch_fused", None),
    ("adafactor", None),
    ("sgd", None),
    ("sgd", "momentum=0.9"),
    ("adagrad", None),
    ("rmsprop", "momentum=0.9,centered=true"),
    ("adamw_bnb_8bit", None),
    ("paged_adamw_8bit", None),
    ("paged_adamw_32bit", None),
    ("lion_8bit", None),
    ("rmsprop_bnb", None),
    ("ademamix_8bit", None),
]


@pytest.mark.parametrize(("optim", "optim_args"), OPTIMIZERS)
def test_optimizer_states_equal_what_the_optimizer_keeps(optim, optim_args, tiny_model, tmp_path):
    from transformers import Trainer, TrainingArguments

    from vlm_grpo.models import get_model_family

    path = tiny_model(DEFAULT_FAMILY)
    family = get_model_family(path)
    model = family.load_model(path, dtype=torch.float32)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(not family.is_vision_module(name))
    args = TrainingArguments(
        str(tmp_path), optim=optim, optim_args=optim_args, use_cpu=True, report_to="none"
    )
    optimizer = Trainer(model=model, args=args).create_optimizer()
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.full_like(p, 0.5)
    optimizer.step()
    kept = sum(s.numel() * s.element_size() for state in optimizer.state.values() for s in state.values()
               if isinstance(s, torch.Tensor) and s.dim() > 0)  # fmt: skip
    result = planned(path, dtype="float32", freeze_vision_modules=True, optim=optim, optim_args=optim_args)
    states = next(t for t in result.plan.held if t.name == "optimizer states")
    assert states.gpu == kept
    assert (kept == 0) == (optim == "sgd" and optim_args is None)  # plain SGD keeps no state


def test_an_optimizer_the_planner_does_not_know_is_named_as_not_counted(tiny_model):
    result = planned(tiny_model(DEFAULT_FAMILY), dtype="float32", optim="lomo")
    assert any("'lomo': its states are not counted" in line for line in result.plan.unpredicted)
    assert next(t for t in result.plan.held if t.name == "optimizer states").gpu == 0
