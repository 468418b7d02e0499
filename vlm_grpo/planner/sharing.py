"""Which passes share each group's prompt: the trainer's own decision, taken for the planned shapes.

The trainer builds a `SharingPolicy` once (`VLMGRPOTrainer._sharing_policy`) and asks it, for every generation
batch, whether sampling prefills each group's prompt once (`shares_generation`) and which log-prob passes share
(`plan`). The planner builds the same policy from the same options and asks it the same questions for the planned
batch: prompts of the planned width, completions at `max_completion_length`, the groups of one process's generation
batch. What the trainer reads off the loaded model is read here from the options that decide it:

- frozen vision: the vision tower trains only in a full fine-tune with `freeze_vision_modules: false`; then the
  trainer keeps no image-feature cache, and under multi-process ZeRO-3 it keeps none either when
  `ds3_gather_for_generation` is off (`VLMGRPOTrainer.__init__`); ZeRO-3 with that cache runs full rows in the
  log-prob passes;
- reentrant checkpointing: `use_reentrant` of `gradient_checkpointing_kwargs`, which TRL forces on for PEFT under
  ZeRO-3 (`GRPOTrainer.__init__`);
- the router aux loss: TRL's rule, `output_router_logits` declared by the text config and a non-zero
  `router_aux_loss_coef` (the option, else the config's own).
"""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig

from ..policy.sharing_plan import SharingPolicy
from .plan import PassSharing, Recipe


def sampling_config(training_args: Any) -> GenerationConfig:
    """The generation config TRL builds from the training options (`GRPOTrainer.__init__`), `generation_kwargs`
    included; the checkpoint's own `generation_config.json` is not read (the planner downloads nothing)."""
    options = dict(
        max_new_tokens=training_args.max_completion_length,
        do_sample=True,
        temperature=training_args.temperature,
        top_p=training_args.top_p,
        top_k=training_args.top_k,
        min_p=training_args.min_p,
        repetition_penalty=training_args.repetition_penalty,
        cache_implementation=training_args.cache_implementation,
    )
    options.update(training_args.generation_kwargs or {})
    return GenerationConfig(**options)


def router_aux_loss(text_config: Any, coefficient: float | None) -> bool:
    """TRL's rule for the router load-balancing loss: the text config declares `output_router_logits` and the
    coefficient (`router_aux_loss_coef`, else the config's own, else 0) is not zero."""
    fields = text_config.to_dict()
    if coefficient is None:
        coefficient = fields.get("router_aux_loss_coef", 0.0)
    return "output_router_logits" in fields and coefficient != 0.0


def group_sizes(rows: int, group: int) -> list[int]:
    """Rows per group in the first process's `rows` rows of a generation batch whose prompts repeat `group` times."""
    return [min(group, rows - start) for start in range(0, rows, group)]


def plan_sharing(recipe: Recipe) -> PassSharing:
    """Build the trainer's `SharingPolicy` for `recipe` and ask it about the planned batch."""
    inputs = recipe.sharing
    zero3 = recipe.zero_stage == 3
    per_module_gathers = zero3 and recipe.processes > 1 and not recipe.ds3_gather_for_generation
    image_feature_cache = not inputs.vision_trains and not per_module_gathers
    vllm = recipe.use_vllm
    reentrant = inputs.use_reentrant or (
        recipe.lora_r is not None and zero3
    )  # TRL forces it for PEFT + ZeRO-3
    policy = SharingPolicy(
        mode=inputs.mode,
        model_type=inputs.model_type,
        indexable_cache=inputs.indexable_cache,
        generation_config=None if vllm else inputs.generation_config,
        zero3_frozen_vision=zero3 and image_feature_cache,
        reentrant_checkpointing=recipe.gradient_checkpointing and reentrant,
        aux_loss=inputs.aux_loss,
    )
    shape = (
        recipe.prompt_tokens,
        recipe.completion_tokens,
        group_sizes(recipe.generation_rows, recipe.num_generations),
        lambda local: local,  # every process plans the same shapes, so they agree
    )
    generation = policy.shares_generation(*shape)
    plan = policy.plan(*shape, generation=generation)
    return PassSharing(plan.generation, plan.scoring, plan.training, dict(plan.reasons))
