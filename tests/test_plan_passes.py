"""`vlm-grpo plan`: which passes share each group's prompt, decided as the trainer decides; vLLM beside training.

The planner asks the trainer's own `SharingPolicy` about the planned batch. Here a real `VLMGRPOTrainer` is built
from the same options and asked the same question: both must take the same decision, for the same reasons, and the
planned activations must be those of the path each pass really runs.
"""

from __future__ import annotations

import inspect

import pytest
from conftest import color_dataset, grpo_args, length_reward
from test_plan import planned

from vlm_grpo.testing import DEFAULT_FAMILY, a_family_with

GIB = 2**30


def plan_with(path: str, args):
    from vlm_grpo.config import VLMModelConfig
    from vlm_grpo.planner.report import plan_config

    return plan_config(
        args, VLMModelConfig(model_name_or_path=path, dtype="bfloat16"), 80 * GIB, device="cpu"
    )


REENTRANT = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}


@pytest.mark.parametrize(
    ("family", "options"),
    [
        (a_family_with(moe=True), {"share_prompt_prefix": "true"}),  # the router aux loss
        (DEFAULT_FAMILY, REENTRANT),
        (DEFAULT_FAMILY, {"share_prompt_prefix": "auto", "max_completion_length": 4096}),  # does not pay
        (DEFAULT_FAMILY, {"share_prompt_prefix": "auto"}),
        (DEFAULT_FAMILY, {"share_prompt_prefix": "false"}),
    ],
)  # fmt: skip
def test_planned_passes_share_as_the_trainer_decides(family, options, tiny_model, tmp_path):
    from vlm_grpo import VLMGRPOTrainer
    from vlm_grpo.planner.sharing import group_sizes

    path = tiny_model(family)
    args = grpo_args(tmp_path, beta=0.04, **options)
    planned_config = plan_with(path, args)
    trainer = VLMGRPOTrainer(path, length_reward, args=args, train_dataset=color_dataset(8))
    recipe, sharing = planned_config.recipe, planned_config.plan.sharing
    shape = (
        recipe.prompt_tokens,
        recipe.completion_tokens,
        group_sizes(recipe.generation_rows, recipe.num_generations),
        lambda local: local,
    )
    generation = trainer._sharing.shares_generation(*shape)
    decided = trainer._sharing.plan(*shape, generation=generation)
    planned_passes = (sharing.generation, sharing.scoring, sharing.training)
    assert planned_passes == (decided.generation, decided.scoring, decided.training)
    assert sharing.reasons == decided.reasons
    full_rows = plan_with(path, grpo_args(tmp_path, beta=0.04, **{**options, "share_prompt_prefix": "false"}))
    for phase, shares in (("training pass", sharing.training), ("scoring pass", sharing.scoring)):
        terms = {t.name: t.gpu for t in planned_config.plan.phases[phase]}
        full = {t.name: t.gpu for t in full_rows.plan.phases[phase]}
        assert (terms == full) is not shares  # a pass that runs full rows is planned as full rows


def test_the_reasons_are_printed_for_each_pass(tiny_model):
    from vlm_grpo.planner.report import describe

    path = tiny_model(a_family_with(moe=True))
    result = planned(path, dtype="bfloat16", share_prompt_prefix="true")
    out = describe(result, 80 * GIB, 1, "plan")
    assert "training   full rows: the router aux loss needs every row" in out
    assert "generation shares each group's prompt" in out


def vllm_plan(path: str, **options):
    return planned(path, dtype="bfloat16", use_vllm=True, gradient_accumulation_steps=2, **options).plan


def test_vllm_colocate_holds_its_share_beside_training(tiny_model):
    """Without sleep mode vLLM keeps `vllm_gpu_memory_utilization` of the GPU for the whole run."""
    path = tiny_model(DEFAULT_FAMILY)
    server = vllm_plan(path, vllm_mode="server")
    colocate = vllm_plan(path, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    share = int(0.3 * 80 * GIB)
    assert colocate.peak == server.peak + share


def test_vllm_sleep_mode_releases_weights_and_cache_without_keeping_them_on_the_host(tiny_model):
    """TRL puts the colocated engine to `sleep(level=2)` after each generation: vLLM's level 2 discards its weights
    and KV cache (level 1 would back the weights up in host RAM), so vLLM's share counts during generation only."""
    from trl.generation.vllm_generation import VLLMGeneration

    assert "self.llm.sleep(level=2)" in inspect.getsource(VLLMGeneration)
    path = tiny_model(DEFAULT_FAMILY)
    server = vllm_plan(path, vllm_mode="server")
    sleeping = vllm_plan(
        path, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=True
    )
    share = int(0.3 * 80 * GIB)
    assert sleeping.peak == max(server.peak, sum(t.gpu for t in server.held) + share)
    assert sleeping.host == server.host == 0


def test_async_rollouts_plan_the_training_process_alone(tiny_model):
    """With `async_rollouts` the server samples on devices of its own: the trainer's plan is server mode's, whose
    generation holds nothing here, and whose old log-prob pass (vLLM's sampling correction) runs in every step."""
    path = tiny_model(DEFAULT_FAMILY)
    server = vllm_plan(path, vllm_mode="server")
    asynchronous = vllm_plan(path, vllm_mode="server", async_rollouts=True)
    assert asynchronous.peak == server.peak and asynchronous.host == server.host
    assert "generation" not in [t.name for t in asynchronous.held]
