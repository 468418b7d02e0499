"""VLMGRPOTrainer end to end on every family: parameters that must change do, frozen ones do not."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, FULL_ROW_FAMILIES, color_dataset, grpo_args, length_reward
from transformers import AutoModelForImageTextToText

from vlm_grpo import VLMGRPOTrainer, get_model_family
from vlm_grpo.models import SUPPORTED_MODEL_TYPES
from vlm_grpo.testing import DEFAULT_FAMILY, one_family_per_image_rule, tiny_family


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, bool]:
    return {n: not torch.equal(before[n], p.detach()) for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
def test_two_steps_change_every_trainable_parameter(family, tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path),
        train_dataset=color_dataset(8),
    )
    before = snapshot(trainer.model)
    trainer.train()
    skip = tiny_family(family).unused_parameters  # the forward never uses them: they can get no gradient
    unchanged = [
        n
        for n, did in changed(before, trainer.model).items()
        if not did and trainer.model.get_parameter(n).requires_grad and not any(s in n for s in skip)
    ]
    assert unchanged == []
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs and all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logs)


@pytest.mark.parametrize("family", FAMILIES + FULL_ROW_FAMILIES)
def test_freeze_vision_modules_keeps_vision_bit_identical(family, tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, freeze_vision_modules=True),
        train_dataset=color_dataset(8),
    )
    module = trainer.family
    before = snapshot(trainer.model)
    trainer.train()
    did = changed(before, trainer.model)
    vision = [n for n in did if module.is_vision_module(n)]
    language = [n for n in did if not module.is_vision_module(n)]
    assert vision and language
    assert not any(did[n] for n in vision)
    assert all(not trainer.model.get_parameter(n).requires_grad for n in vision)
    assert all(did[n] for n in language)


@pytest.mark.parametrize("family", one_family_per_image_rule(besides=[DEFAULT_FAMILY]))
def test_lora_trains_only_language_adapters(family, tiny_model, tmp_path):
    from peft import LoraConfig

    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, learning_rate=5e-2),
        train_dataset=color_dataset(8),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0),
    )
    module = trainer.family
    lora_modules = [n for n, _ in trainer.model.named_modules() if n.endswith(".lora_A")]
    assert lora_modules
    assert not any(module.is_vision_module(n) for n in lora_modules)
    # Every linear layer of the language model (attention and MLP) carries an adapter.
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert any(f".{proj}.lora_A" in n for n in lora_modules), proj
    before = snapshot(trainer.model)
    trainer.train()
    did = changed(before, trainer.model)
    adapters = [n for n in did if "lora_B" in n]
    assert adapters and all(did[n] for n in adapters)  # lora_B starts at zero, so only a real update moves it
    assert not any(v for n, v in did.items() if "lora_" not in n)


def test_qlora_trains_4bit_model_on_cpu(tiny_model, tmp_path):
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig

    from vlm_grpo.policy.adapters import qlora_quantization_config

    args = grpo_args(tmp_path, model_init_kwargs={"quantization_config": qlora_quantization_config()})
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=args,
        train_dataset=color_dataset(8),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0),
    )
    kinds = {type(m).__name__ for m in trainer.model.modules()}
    assert "Linear4bit" in kinds
    before = snapshot(trainer.model)
    trainer.train()
    did = changed(before, trainer.model)
    assert all(did[n] for n in did if "lora_B" in n)
    assert not any(v for n, v in did.items() if "lora_" not in n)


@pytest.mark.parametrize("source", ["memory", "path"])
def test_reference_model_with_beta(source, tiny_model, tmp_path):
    path = tiny_model(DEFAULT_FAMILY)
    model = AutoModelForImageTextToText.from_pretrained(path) if source == "memory" else path
    trainer = VLMGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, beta=0.5),
        train_dataset=color_dataset(8),
    )
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    assert type(trainer.ref_model) is type(trainer.model)  # the VLM class, not a text-only one
    initial = snapshot(trainer.ref_model)
    policy_initial = snapshot(trainer.model)
    assert all(torch.equal(initial[n], policy_initial[n]) for n in initial)
    trainer.train()
    assert all(torch.equal(initial[n], p) for n, p in trainer.ref_model.named_parameters())
    kls = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
    assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 0.0


def test_unknown_model_type_lists_supported(tmp_path):
    from transformers import LlamaConfig

    with pytest.raises(ValueError, match="Supported: ") as error:
        get_model_family(LlamaConfig())
    assert all(model_type in str(error.value) for model_type in SUPPORTED_MODEL_TYPES)


def test_generation_leaves_the_input_embeddings_hooks_as_they_were(tiny_model, tmp_path):
    """LoRA with gradient checkpointing: TRL turns checkpointing off for each generation and on after it, and
    transformers then registers its input-gradient hook anew; the trainer keeps one, so steps add no hooks."""
    from peft import LoraConfig
    from transformers import TrainerCallback

    counts = []

    class CountHooks(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            counts.append(len(model.get_input_embeddings()._forward_hooks))

    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY), reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=3, gradient_checkpointing=True), train_dataset=color_dataset(8),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0), callbacks=[CountHooks()],
    )  # fmt: skip
    trainer.train()
    assert counts[0] >= 1 and counts == [counts[0]] * 3  # without the trainer's care: one more every step
