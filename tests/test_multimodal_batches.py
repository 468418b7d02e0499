"""Multi-image prompts, mixed image/text batches, and placeholder tokens that must never be sampled."""

from __future__ import annotations

import pytest
import torch
from conftest import color_dataset, color_rows, grpo_args, length_reward

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.data.rows import load_rows
from vlm_grpo.testing import DEFAULT_FAMILY, a_family_with, one_family_per_image_rule


@pytest.mark.parametrize("family", one_family_per_image_rule())
def test_two_images_per_prompt(family, tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=1),
        train_dataset=color_dataset(8, images_per_prompt=2),
    )
    rows = color_rows(2, images_per_prompt=2)
    encoded = trainer.rollout.encode_prompts(load_rows(rows))
    assert all(e.num_images == 2 for e in encoded)
    image_token = trainer.model.config.image_token_id
    for e in encoded:
        assert sum(t == image_token for t in e.input_ids) > 0
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    vision = [n for n in before if trainer.family.is_vision_module(n) and "head." not in n]
    assert any(not torch.equal(before[n], trainer.model.get_parameter(n)) for n in vision)


@pytest.mark.parametrize(
    "family", [a_family_with(image_rule="grid", besides=[DEFAULT_FAMILY]), a_family_with(image_rule="fixed")]
)
def test_batch_mixing_image_and_text_only_prompts(family, tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        # per_device_train_batch_size 4 with G=2: two prompts per step, one with an image, one without
        args=grpo_args(tmp_path, shuffle_dataset=False),
        train_dataset=color_dataset(8, text_only_every=2),
    )
    rows = color_rows(2, text_only_every=2)
    encoded = trainer.rollout.encode_prompts(load_rows(rows))
    assert [e.num_images for e in encoded] == [1, 0] and encoded[1].image_inputs == {}
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("family", one_family_per_image_rule())
def test_completions_never_contain_placeholder_tokens(family, tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_completion_length=6),
        train_dataset=color_dataset(8),
    )
    placeholders = trainer.placeholder_token_ids
    assert trainer.model.config.image_token_id in placeholders
    # Make the model prefer placeholder tokens above all others.
    lm_head = trainer.model.get_output_embeddings()

    def favour_placeholders(module, args, output):
        output[..., placeholders] += 100.0
        return output

    hook = lm_head.register_forward_hook(favour_placeholders)
    rows = color_rows(4)
    encoded = trainer.rollout.encode_prompts(load_rows(rows))
    try:
        # Control: unconstrained sampling from this model emits placeholders.
        ids = torch.tensor([encoded[0].input_ids])
        inputs = trainer.family.model_inputs(
            trainer.model.config, ids, torch.ones_like(ids), [encoded[0].image_inputs]
        )
        free = trainer.model.generate(**inputs, max_new_tokens=4, do_sample=True)[0, ids.size(1) :]
        assert any(t in placeholders for t in free.tolist())
        completions = trainer.rollout.transformers.sample(encoded, shared=trainer.family.indexable_cache)
    finally:
        hook.remove()
    assert all(completions)
    assert not any(t in placeholders for c in completions for t in c)
