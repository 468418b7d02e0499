"""Frozen vision, computed once per generation batch: exact, and one vision pass per image (see `image_features`)."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, color_dataset, color_rows, grpo_args, length_reward
from datasets import Dataset
from peft import LoraConfig
from test_shared_prefix import G, rollout_batch

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.data.rows import load_rows
from vlm_grpo.testing import DEFAULT_FAMILY, a_family_with


def frozen_trainer(path, tmp_path, **overrides) -> VLMGRPOTrainer:
    rows = color_rows(6, text_only_every=3)
    args = grpo_args(tmp_path, freeze_vision_modules=True, **overrides)
    return VLMGRPOTrainer(
        model=path, reward_funcs=length_reward, args=args, train_dataset=Dataset.from_list(rows)
    )


def logps(trainer: VLMGRPOTrainer, batch: dict, share: bool) -> tuple[torch.Tensor, torch.Tensor]:
    trainer.args.share_prompt_prefix = share
    with torch.no_grad():
        values, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"].size(1), 4,
            compute_entropy=True, image_inputs=batch["image_inputs"],
        )  # fmt: skip
    return values, entropies


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("share", [True, False])
def test_reused_features_give_the_same_logps(family, share, tiny_model, tmp_path):
    trainer = frozen_trainer(tiny_model(family), tmp_path)
    cache = trainer.image_features
    assert cache is not None
    batch = rollout_batch(trainer, color_rows(6, images_per_prompt=2, text_only_every=3))
    cache.clear()
    first = logps(trainer, batch, share)  # fills the cache
    encoded = cache.encoded_rows
    again = logps(trainer, batch, share)  # answered from the cache
    assert cache.encoded_rows == encoded == 4  # 4 distinct image prompts, each encoded once
    trainer.image_features = None
    recomputed = logps(trainer, batch, share)  # the vision tower runs in this pass
    for reused, fresh in zip(again, recomputed, strict=True):
        torch.testing.assert_close(reused, fresh, rtol=0, atol=1e-6)
    for reused, fresh in zip(first, recomputed, strict=True):
        torch.testing.assert_close(reused, fresh, rtol=0, atol=1e-6)


def test_one_vision_pass_per_image_per_generation_batch(tiny_model, tmp_path):
    """A whole step (generation, old and reference log-probs, two policy micro-batches) encodes each image once."""
    trainer = frozen_trainer(
        tiny_model(DEFAULT_FAMILY), tmp_path, beta=0.04, max_steps=2, steps_per_generation=2, num_generations=G,
        per_device_train_batch_size=6,
    )  # fmt: skip
    patches = []
    for model in (trainer.model, trainer.ref_model):
        model.model.visual.register_forward_hook(lambda m, i, o: patches.append(i[0].size(0)))
    rollouts = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: rollouts.append(inputs) or original(inputs)
    trainer.train()
    assert len(rollouts) == 1  # 2 optimizer steps from one generation batch of 4 prompts x G
    distinct = load_rows(rollouts[0][::G])  # the G copies of a prompt are consecutive
    encoded = trainer.rollout.encode_prompts(distinct)
    image_patches = sum(e.image_inputs["pixel_values"].size(0) for e in encoded if e.image_inputs)
    assert image_patches > 0
    assert sum(patches) == image_patches


def test_training_with_reuse_equals_training_without(tiny_model, tmp_path):
    runs = {}
    for reuse in (True, False):
        torch.manual_seed(0)
        trainer = frozen_trainer(
            tiny_model(a_family_with(image_rule="fixed")), tmp_path / str(reuse), optim="sgd", beta=0.04
        )
        if not reuse:
            trainer.image_features = None
        trainer.train()
        runs[reuse] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    for name, param in runs[True].items():
        torch.testing.assert_close(param, runs[False][name], rtol=0, atol=1e-6, msg=name)


def test_reuse_only_while_no_vision_parameter_trains(tiny_model, tmp_path):
    path = tiny_model(DEFAULT_FAMILY)
    full = VLMGRPOTrainer(path, length_reward, args=grpo_args(tmp_path), train_dataset=color_dataset(4))
    assert full.image_features is None  # the vision tower trains: its features change every step
    lora = VLMGRPOTrainer(
        path,
        length_reward,
        args=grpo_args(tmp_path),
        train_dataset=color_dataset(4),
        peft_config=LoraConfig(r=4),
    )
    assert lora.image_features is not None  # LoRA never targets the vision tower
