"""The changes that lower a plan's peak, each planned alone: the recipe's own settings, the optimizer, DeepSpeed,
more GPUs, LoRA and QLoRA.

Settings that leave the model as it is (checkpointing, batch, beta, completion length, vLLM, the optimizer,
DeepSpeed, GPUs) are planned again from the same counts with `plan_memory`, so the prompt-sharing decision is taken
again too (ZeRO-3 changes it). LoRA and QLoRA change what trains and what the layers save, so they are planned from
the config again with the caller's `replan` (`plan_config` with other model options), when the config does not fit.
Changes that do not lower the peak are left out; the rest are listed lowest peak first, each saying whether it fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .memory import Recipe, plan_memory

GPU_COUNTS = (2, 4, 8, 16, 32, 64)  # "more GPUs" tries these totals, with ZeRO-3
ZERO3 = "local_scripts/zero3.json"
ZERO3_OFFLOAD = "local_scripts/zero3_offload.json"


@dataclass(frozen=True)
class Advice:
    """One change and the planned peak per GPU with it.

    Attributes:
        change (`str`): the setting to change, as an option or a launch flag.
        peak (`int`): bytes per GPU at the planned peak with that change alone.
    """

    change: str
    peak: int


def _recipe_changes(recipe: Recipe) -> list[tuple[str, Recipe]]:
    """Changes of settings that keep the model as it is."""
    changes: list[tuple[str, Recipe]] = []
    if not recipe.gradient_checkpointing:
        changes.append(("gradient_checkpointing: true", replace(recipe, gradient_checkpointing=True)))
    if recipe.rows > 1:
        half = max(1, recipe.rows // 2)
        halved = replace(recipe, rows=half, accumulation_steps=2 * recipe.accumulation_steps)
        changes.append(
            (f"per_device_train_batch_size: {half} (and twice the gradient_accumulation_steps)", halved)
        )
    if recipe.beta != 0.0 and recipe.lora_r is None:
        changes.append(("beta: 0.0 (no reference model)", replace(recipe, beta=0.0)))
    if recipe.completion_tokens > 256:
        half = recipe.completion_tokens // 2
        changes.append((f"max_completion_length: {half}", replace(recipe, completion_tokens=half)))
    if recipe.vllm_colocate_fraction > 0.2:
        changes.append(("vllm_gpu_memory_utilization: 0.2", replace(recipe, vllm_colocate_fraction=0.2)))
    if recipe.vllm_colocate_fraction and not recipe.vllm_sleep:
        changes.append(("vllm_enable_sleep_mode: true", replace(recipe, vllm_sleep=True)))
    if "8bit" not in recipe.optim and not recipe.offload_optimizer:
        changes.append(
            ("optim: adamw_bnb_8bit (8-bit AdamW states)", replace(recipe, optim="adamw_bnb_8bit"))
        )
    if recipe.zero_stage == 3 and recipe.ds3_gather_for_generation and not recipe.use_vllm:
        changes.append(("ds3_gather_for_generation: false", replace(recipe, ds3_gather_for_generation=False)))
    if recipe.processes > 1 and recipe.zero_stage < 3:
        changes.append((f"DeepSpeed ZeRO-3 (--deepspeed {ZERO3})", replace(recipe, zero_stage=3)))
    if not recipe.offload_optimizer:
        offload = replace(recipe, zero_stage=3, offload_optimizer=True, offload_params=True)
        changes.append((f"DeepSpeed ZeRO-3 with CPU offload (--deepspeed {ZERO3_OFFLOAD})", offload))
    return changes


def _more_gpus(recipe: Recipe, fits: Any) -> tuple[str, Recipe] | None:
    """The fewest GPUs (more than now) over which ZeRO-3 fits, gathering for generation as configured or, if that
    does not fit, not gathering; the most tried when none fits."""
    stage = max(recipe.zero_stage, 3)
    tried = [
        replace(recipe, processes=n, zero_stage=stage, ds3_gather_for_generation=gather)
        for n in GPU_COUNTS
        if n > recipe.processes
        for gather in dict.fromkeys((recipe.ds3_gather_for_generation, False))
    ]
    if not tried:
        return None
    chosen = next((r for r in tried if fits(r)), tried[-1])
    config = ZERO3_OFFLOAD if chosen.offload_optimizer else ZERO3
    gather = (
        ""
        if chosen.ds3_gather_for_generation == recipe.ds3_gather_for_generation
        else ", ds3_gather_for_generation: false"
    )
    return f"{chosen.processes} GPUs in all with ZeRO-3 (--deepspeed {config}{gather})", chosen


def advise(planned: Any, model_args: Any, gpu_memory: int, replan: Callable[[Any], Any]) -> list[Advice]:
    """The changes that lower `planned`'s peak, each with its planned peak, lowest first.

    Args:
        planned (`Planned`): the plan of the config as it is.
        model_args (`VLMModelConfig`): its model options.
        gpu_memory (`int`): bytes of one GPU.
        replan (`Callable[[VLMModelConfig], Planned]`): the plan of the same config (training options, GPUs,
            DeepSpeed, images, prompt text, device) with other model options; LoRA and QLoRA are planned with it.
    """
    recipe, params, costs = planned.recipe, planned.params, planned.costs

    def peak_of(changed: Recipe) -> int:
        return plan_memory(changed, params, costs, gpu_memory).peak

    changes = _recipe_changes(recipe)
    more = _more_gpus(recipe, lambda r: peak_of(r) <= gpu_memory)
    if more is not None:
        changes.append(more)
    advice = [Advice(change, peak_of(changed)) for change, changed in changes]
    models = []  # LoRA and QLoRA rebuild the model: planned only when the config does not fit
    fits = planned.plan.peak <= gpu_memory
    if not model_args.use_peft and not fits:
        models.append((f"LoRA: use_peft: true (lora_r {model_args.lora_r})", {"use_peft": True}))
    if not model_args.load_in_4bit and not fits:
        models.append(("QLoRA: use_peft: true, load_in_4bit: true", {"use_peft": True, "load_in_4bit": True}))
    for change, fields in models:
        advice.append(Advice(change, replan(replace(model_args, **fields)).plan.peak))
    lower = [a for a in advice if a.peak < planned.plan.peak]
    return sorted(lower, key=lambda a: a.peak)
