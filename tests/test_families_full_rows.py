"""Families whose cache the shared prefix does not index (`indexable_cache = False`), such as Qwen3.5 and its MoE.

Their Gated DeltaNet layers keep a convolution state and a recurrent state per row instead of keys and values. The
trainer then runs full rows in every pass, whatever `share_prompt_prefix` says, with one log line. Here the tests
that run over `FAMILIES` run on them through the trainer (which honours the fallback), and the fallback itself is
checked: no pass takes the shared path, and results equal those with sharing off.
"""

from __future__ import annotations

import logging
import math

import pytest
import test_image_features
import test_shared_prefix
import test_trainer
import test_vllm_payload
import torch
from conftest import FULL_ROW_FAMILIES, color_rows, grpo_args, length_reward
from datasets import Dataset
from test_vllm_payload import family_setup  # noqa: F401  (fixture)

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.models import get_model_family
from vlm_grpo.rollout import generation
from vlm_grpo.testing import a_family_with
from vlm_grpo.trainer import logps


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
def test_two_steps_change_every_trainable_parameter(family, tiny_model, tmp_path):
    test_trainer.test_two_steps_change_every_trainable_parameter(family, tiny_model, tmp_path)


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
def test_logps_entropies_and_gradients_with_sharing_requested(family, tiny_model, tmp_path):
    test_shared_prefix.test_logps_entropies_and_gradients_match_full_forward(family, tiny_model, tmp_path)


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
def test_two_training_steps_match_unshared(family, tiny_model, tmp_path):
    test_shared_prefix.test_two_training_steps_match_unshared(family, tiny_model, tmp_path)


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
@pytest.mark.parametrize("share", [True, False])
def test_reused_features_give_the_same_logps(family, share, tiny_model, tmp_path):
    test_image_features.test_reused_features_give_the_same_logps(family, share, tiny_model, tmp_path)


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
@pytest.mark.parametrize("images_per_prompt", [1, 2])
def test_one_placeholder_per_image(family, images_per_prompt, family_setup):  # noqa: F811
    test_vllm_payload.test_one_placeholder_per_image(family, images_per_prompt, family_setup)


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
def test_vllm_payload_rows(family, family_setup):  # noqa: F811
    test_vllm_payload.test_images_are_the_rows_own_objects_in_order(family, family_setup)
    test_vllm_payload.test_image_entries_must_match_images(family, family_setup)
    test_vllm_payload.test_expanded_placeholders_are_rejected(family, family_setup)


@pytest.mark.parametrize("family", FULL_ROW_FAMILIES)
def test_every_pass_runs_full_rows_with_one_log_line(family, tiny_model, tmp_path, monkeypatch, caplog):
    """With `share_prompt_prefix: true`, generation and every log-prob pass still run full rows."""
    assert get_model_family(tiny_model(family)).indexable_cache is False
    shared_calls = []
    for module, name in ((logps, "shared_prefix_logps"), (generation, "shared_prefix_generate")):
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: shared_calls.append(_n))
    with caplog.at_level(logging.INFO, logger="vlm_grpo.trainer.trainer"):
        trainer = VLMGRPOTrainer(
            model=tiny_model(family),
            reward_funcs=length_reward,
            args=grpo_args(tmp_path, share_prompt_prefix=True, beta=0.04, steps_per_generation=2),
            train_dataset=Dataset.from_list(color_rows(8)),
        )
    lines = [r.getMessage() for r in caplog.records if "share_prompt_prefix: full rows" in r.getMessage()]
    assert len(lines) == 1 and f"{family}'s cache cannot be indexed" in lines[0]
    plan = trainer._generate_and_score_completions([r for r in color_rows(2) for _ in range(2)])["sharing"]
    assert not (plan.generation or plan.scoring or plan.training)
    assert all(family in why[0] for why in plan.reasons.values())
    trainer.train()
    assert shared_calls == []
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_full_row_moe_trains_with_its_router_loss(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(a_family_with(moe=True, indexable_cache=False)),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, router_aux_loss_coef=0.01),
        train_dataset=Dataset.from_list(color_rows(8)),
    )
    assert trainer.aux_loss_enabled
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".mlp.gate." in n}
    trainer.train()
    aux = [entry["aux_loss"] for entry in trainer.state.log_history if "aux_loss" in entry]
    assert len(aux) == 2 and all(math.isfinite(a) and a > 0 for a in aux)
    assert before and all(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in before.items())
