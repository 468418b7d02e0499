"""The per-family checks that other test files run on a few core families, run on every other family.

Tests that run over `FAMILIES` (training, shared prefix, frozen-vision reuse, vLLM payloads) cover the new families
by themselves; these are the ones written for a chosen subset: several images per prompt, image and text-only
prompts in one batch, placeholder tokens never sampled, text-only vLLM rows, and LoRA on the language model only.
"""

from __future__ import annotations

import json

import pytest
import test_multimodal_batches
import test_vllm_payload
import torch
from conftest import color_dataset, grpo_args, length_reward
from peft import LoraConfig
from test_vllm_payload import family_setup  # noqa: F401  (fixture)

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.policy.adapters import language_linear_names
from vlm_grpo.testing import families_with

COVERED = families_with(core=False)
"""Families the spot checks of other files do not pick (`TinyFamily.core`)."""


@pytest.mark.parametrize("family", COVERED)
def test_two_images_per_prompt(family, tiny_model, tmp_path):
    test_multimodal_batches.test_two_images_per_prompt(family, tiny_model, tmp_path)


@pytest.mark.parametrize("family", COVERED)
def test_batch_mixing_image_and_text_only_prompts(family, tiny_model, tmp_path):
    test_multimodal_batches.test_batch_mixing_image_and_text_only_prompts(family, tiny_model, tmp_path)


@pytest.mark.parametrize("family", COVERED)
def test_completions_never_contain_placeholder_tokens(family, tiny_model, tmp_path):
    test_multimodal_batches.test_completions_never_contain_placeholder_tokens(family, tiny_model, tmp_path)


@pytest.mark.parametrize("family", COVERED)
def test_text_only_rows_get_no_images(family, family_setup):  # noqa: F811
    test_vllm_payload.test_text_only_rows_get_no_images(family, family_setup)


@pytest.mark.parametrize("family", COVERED)
def test_lora_trains_only_language_adapters(family, tiny_model, tmp_path):
    """Every linear layer of the language model carries an adapter, none of the vision tower; only adapters move.

    Expert weights of MoE layers are packed tensors, not linear layers: LoRA adapts attention (and dense or shared
    expert MLPs where the family has them), as PEFT's default linear targeting does. Where PEFT maps a model's MLP
    projection names onto its fused expert parameters (`target_parameters`, PEFT's transformers-v5 conversion), the
    experts carry adapters instead of those projections.
    """
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, learning_rate=5e-2),
        train_dataset=color_dataset(8),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0),
    )
    base = trainer.model.get_base_model()
    adapted = {n.removesuffix(".lora_A") for n, _ in base.named_modules() if n.endswith(".lora_A")}
    assert adapted and not any(trainer.family.is_vision_module(n) for n in adapted)
    linear = set(language_linear_names(trainer.family.load_model(tiny_model(family)), trainer.family))
    attention = {n for n in linear if n.rpartition(".")[2] in ("q_proj", "k_proj", "v_proj", "o_proj")}
    assert attention and attention <= adapted
    if trainer.model.peft_config["default"].target_parameters:  # PEFT moved MLP targets onto the experts
        experts = {n.rpartition(".")[0] for n in trainer.model.peft_config["default"].target_parameters}
        assert adapted - linear and all(any(n.startswith(e) for e in experts) for n in adapted - linear)
    else:  # the adapted set is exactly the language model's linear layers
        assert adapted == linear
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = {n for n, p in before.items() if not torch.equal(p, after[n].detach())}
    assert {n for n in before if "lora_B" in n} <= moved  # lora_B starts at zero: only a real update moves it
    assert all("lora_" in n for n in moved)


def test_remote_code_internvl_names_the_hf_checkpoints(tmp_path):
    """An original InternVL checkpoint (its own model code) is refused, pointing at the transformers-native ones."""
    from vlm_grpo import get_model_family
    from vlm_grpo.errors import VLMGRPOError

    folder = tmp_path / "InternVL3_5-8B"
    folder.mkdir()
    config = {
        "model_type": "internvl_chat",
        "auto_map": {"AutoModel": "modeling_internvl_chat.InternVLChatModel"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(VLMGRPOError, match=r"named -hf or -HF .*OpenGVLab/InternVL3_5-8B-HF") as info:
        get_model_family(str(folder))
    assert "\n" not in str(info.value)
