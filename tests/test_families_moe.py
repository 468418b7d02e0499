"""Mixture-of-experts language models: the router auxiliary loss trains, on full rows, while other passes share.

The policy forward that returns the router load-balancing loss (`router_aux_loss_coef > 0`) runs full rows: the loss
is a mean over every token the router saw, and a shared prompt is routed once instead of G times. Generation and the
old and reference log-prob passes, which need no aux loss, still run each group's prompt once.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import color_rows, grpo_args, length_reward
from datasets import Dataset
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

import vlm_grpo.trainer.logps
from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.testing import families_with

MOE_FAMILIES = families_with(moe=True, indexable_cache=True)


def spy_on_passes(trainer: VLMGRPOTrainer, monkeypatch) -> list[tuple[bool, int]]:
    """Record `(compute_aux_loss, shared-prefix calls)` of every log-prob pass of `trainer`."""
    passes: list[tuple[bool, int]] = []
    calls = {"shared": 0}
    original_shared = vlm_grpo.trainer.logps.shared_prefix_logps

    def shared(*args, **kwargs):
        calls["shared"] += 1
        return original_shared(*args, **kwargs)

    monkeypatch.setattr(vlm_grpo.trainer.logps, "shared_prefix_logps", shared)
    original_pass = trainer._get_per_token_logps_and_entropies

    def logps_pass(*args, compute_aux_loss=False, **kwargs):
        calls["shared"] = 0
        out = original_pass(*args, compute_aux_loss=compute_aux_loss, **kwargs)
        passes.append((compute_aux_loss, calls["shared"]))
        return out

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", logps_pass)
    return passes


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_router_aux_loss_trains_on_full_rows_and_other_passes_share(
    family, tiny_model, tmp_path, monkeypatch
):
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(
            tmp_path, share_prompt_prefix=True, router_aux_loss_coef=0.01, beta=0.04, num_generations=4,
            per_device_train_batch_size=8, steps_per_generation=2,
        ),
        train_dataset=Dataset.from_list(color_rows(8)),
    )  # fmt: skip
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.01
    passes = spy_on_passes(trainer, monkeypatch)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    aux = [entry["aux_loss"] for entry in trainer.state.log_history if "aux_loss" in entry]
    assert len(aux) == 2 and all(math.isfinite(a) and a > 0 for a in aux)
    with_aux = [shared for needs_aux, shared in passes if needs_aux]
    without_aux = [shared for needs_aux, shared in passes if not needs_aux]
    assert with_aux and all(shared == 0 for shared in with_aux)  # the aux-loss pass runs full rows
    assert without_aux and all(shared > 0 for shared in without_aux)  # old and reference log-probs share
    routers = [n for n in before if ".mlp.gate." in n]  # the load-balancing loss reaches every router
    assert routers and all(not torch.equal(before[n], trainer.model.get_parameter(n)) for n in routers)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_aux_loss_of_the_training_pass_is_the_models_own(family, tiny_model, tmp_path):
    """The aux loss the trainer adds is the load-balancing loss of the routers over every token of the full rows."""
    trainer = VLMGRPOTrainer(
        model=tiny_model(family),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, share_prompt_prefix=True, router_aux_loss_coef=0.01),
        train_dataset=Dataset.from_list(color_rows(4)),
    )
    from test_shared_prefix import rollout_batch

    batch = rollout_batch(trainer, color_rows(2))
    ids, mask, images = batch["input_ids"], batch["attention_mask"], batch["image_inputs"]
    with torch.no_grad():
        _, _, aux = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, batch["completion_mask"].size(1), ids.size(0),
            compute_aux_loss=True, image_inputs=images,
        )  # fmt: skip
        inputs = trainer.family.model_inputs(trainer.model.config, ids, mask, images)
        router_logits = trainer.model.model(**inputs, output_router_logits=True).router_logits
    text_config = trainer.model.config.get_text_config()
    routers = [n for n, _ in trainer.model.named_modules() if n.endswith(".mlp.gate")]
    assert len(router_logits) == len(routers) > 0  # one [tokens, experts] tensor per MoE layer
    assert all(
        r.shape == (mask.numel(), text_config.num_experts) for r in router_logits
    )  # every token of full rows
    expected = load_balancing_loss_func(
        router_logits, text_config.num_experts, text_config.num_experts_per_tok, mask
    )
    assert torch.isfinite(aux) and aux > 0
    torch.testing.assert_close(aux, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("family", MOE_FAMILIES[:1])
def test_loaded_config_declares_router_logits(family, tiny_model, tmp_path):
    """A config.json without `output_router_logits` (transformers 5.17 writes none) still gets the aux loss."""
    folder = tmp_path / family
    shutil.copytree(tiny_model(family), folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"].pop("output_router_logits", None)
    (folder / "config.json").write_text(json.dumps(config))
    trainer = VLMGRPOTrainer(
        model=str(folder),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path / "run", router_aux_loss_coef=0.01),
        train_dataset=Dataset.from_list(color_rows(4)),
    )
    assert trainer.model.config.get_text_config().output_router_logits is False
    assert trainer.aux_loss_enabled
