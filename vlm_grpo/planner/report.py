"""The plan of a parsed training config, and its printed report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.training_args import OptimizerNames

from ..errors import VLMGRPOError
from ..models import get_model_family
from .architectures import load_model_config
from .measure import ParameterCounts, TokenCosts, build_on_meta, count_parameters, token_costs
from .memory import GIB, Plan, Recipe, plan_memory, suggestions

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Planned:
    """A recipe, its plan and what it was computed from."""

    recipe: Recipe
    plan: Plan
    params: ParameterCounts
    costs: TokenCosts
    source: str
    model_type: str
    image_tokens: int | None
    lora_layers: int


def weight_dtype(model_args: Any, model_config: Any) -> torch.dtype:
    """The dtype the weights load in: the `dtype` option, or the checkpoint's own (`auto`/unset), else bf16."""
    name = model_args.dtype
    if name in (None, "auto"):
        name = str(model_config.dtype or "bfloat16").removeprefix("torch.")
    if name not in _DTYPES:
        raise VLMGRPOError(f"dtype {name!r}: the planner knows {', '.join(_DTYPES)}.")
    return _DTYPES[name]


def plan_config(
    training_args: Any,
    model_args: Any,
    gpu_memory: int,
    processes: int = 1,
    deepspeed: tuple[int, bool, bool] = (0, False, False),
    image_size: tuple[int, int] = (448, 448),
    images: int = 1,
    text_tokens: int = 64,
    model_config: str | None = None,
    device: str = "cuda",
) -> Planned:
    """Plan a parsed training config.

    Args:
        training_args (`VLMGRPOConfig`): the training options.
        model_args (`VLMModelConfig`): the model options.
        gpu_memory (`int`): bytes of one GPU.
        processes (`int`, defaults to 1): GPUs in all.
        deepspeed (`tuple`, defaults to no DeepSpeed): `(zero stage, offload optimizer, offload params)`.
        image_size (`tuple[int, int]`, defaults to 448x448): width and height of the images.
        images (`int`, defaults to 1): images per prompt.
        text_tokens (`int`, defaults to 64): text tokens of a prompt (chat template included).
        model_config (`str | None`, defaults to None): a `config.json` for a model that is not local.
        device (`str`, defaults to `"cuda"`): where it trains; TRL's LM head scores only completion tokens on CUDA
            (Triton) and every position elsewhere.
    """
    config, processor, source = load_model_config(model_args.model_name_or_path, model_config)
    family = get_model_family(config)
    dtype = weight_dtype(model_args, config)
    model = build_on_meta(family, config, dtype)
    lora_targets = None
    if model_args.use_peft:
        from ..adapters import language_linear_names

        targets = model_args.lora_target_modules
        patterns = None if targets in (None, "all-linear", ["all-linear"]) else list(targets)
        lora_targets = language_linear_names(model, family, patterns)
    params = count_parameters(
        model,
        family,
        freeze_vision=training_args.freeze_vision_modules,
        lora_r=model_args.lora_r if model_args.use_peft else None,
        lora_targets=lora_targets,
        quantize_4bit=model_args.load_in_4bit,
    )
    stage, offload_optimizer, offload_params = deepspeed
    if (
        model_args.use_peft
    ):  # LoRA layers save their own inputs (dropout) and casts: measure with them in place
        from peft import get_peft_model
        from trl import get_peft_config

        from ..adapters import resolve_lora_config

        lora = resolve_lora_config(get_peft_config(model_args), model, family)
        adapters_in_weight_dtype = stage == 3 and not model_args.load_in_4bit  # as TRL sets it under ZeRO-3
        model = get_peft_model(
            model, lora, autocast_adapter_dtype=not adapters_in_weight_dtype
        ).base_model.model
    costs = token_costs(model, dtype)
    min_pixels = training_args.min_pixels or processor.get("min_pixels")
    max_pixels = training_args.max_pixels or processor.get("max_pixels")
    max_tiles = training_args.max_tiles or processor.get("max_tiles")
    per_image = family.image_tokens(config, *image_size, min_pixels, max_pixels, max_tiles)
    recipe = Recipe(
        weight_bytes=torch.tensor([], dtype=dtype).element_size(),
        lora_r=model_args.lora_r if model_args.use_peft else None,
        load_in_4bit=model_args.load_in_4bit,
        double_quant=model_args.use_bnb_nested_quant,
        beta=training_args.beta,
        rows=training_args.per_device_train_batch_size,
        generation_rows=training_args.per_device_train_batch_size * training_args.steps_per_generation,
        num_generations=training_args.num_generations,
        prompt_tokens=text_tokens + images * (per_image or 0),
        completion_tokens=training_args.max_completion_length,
        gradient_checkpointing=training_args.gradient_checkpointing,
        share_prompt=training_args.share_prompt_prefix != "false" and family.indexable_cache,
        optim=OptimizerNames(training_args.optim).value,
        processes=processes,
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        vllm_colocate_fraction=training_args.vllm_gpu_memory_utilization
        if training_args.use_vllm and training_args.vllm_mode == "colocate"
        else 0.0,
        vllm_server=training_args.use_vllm and training_args.vllm_mode == "server",
        scores_every_position=device != "cuda",
    )
    plan = plan_memory(recipe, params, costs, gpu_memory)
    if per_image is None:
        plan.unpredicted.append(
            f"image tokens: {config.model_type} sizes images by its processor; not counted"
        )
    return Planned(recipe, plan, params, costs, source, config.model_type, per_image, len(lora_targets or []))


def verdict(plan: Plan, gpu_memory: int) -> str:
    """One line: fits with what to spare, or does not fit."""
    peak = plan.peak / GIB
    if plan.peak <= gpu_memory:
        return f"fits in {gpu_memory / GIB:.0f} GiB with {(gpu_memory - plan.peak) / GIB:.1f} GiB to spare ({peak:.1f} GiB)"
    return f"does not fit in {gpu_memory / GIB:.0f} GiB: {peak:.1f} GiB"


def _gib(size: int) -> str:
    return f"{size / GIB:6.2f} GiB"


def describe(planned: Planned, gpu_memory: int, processes: int, title: str) -> str:
    """The printed plan: parameters, the per-GPU terms, host RAM, verdict and the settings that matter most."""
    p, r, plan = planned.params, planned.recipe, planned.plan
    head = f"LM head {p.lm_head / 1e9:.2f}B" if not p.tied else "LM head tied to the embeddings"
    trainable = (
        f"LoRA r={r.lora_r} on {planned.lora_layers} language linear layers"
        if r.lora_r is not None
        else ("language model (vision frozen)" if p.trainable < p.total else "every parameter")
    )
    images = "no image tokens known" if planned.image_tokens is None else f"{planned.image_tokens} per image"
    lines = [
        title,
        f"model       {planned.source} ({planned.model_type})",
        f"parameters  {p.total / 1e9:.3f}B = vision {p.vision / 1e9:.3f}B + language {p.language / 1e9:.3f}B + "
        f"embeddings {p.embeddings / 1e9:.3f}B; {head}",
        f"trainable   {p.trainable / 1e6:.1f}M ({trainable})",
        f"batch       {r.rows} completions per micro-batch, G={r.num_generations}, {r.generation_rows} generated at "
        f"once; prompt {r.prompt_tokens} tokens ({images}), completion {r.completion_tokens}",
        f"per GPU ({processes} process{'es' if processes > 1 else ''})",
    ]
    sections = (("held", plan.held), ("training pass", plan.training), ("generation", plan.generation))
    for name, terms in sections:
        lines.append(f"  {name}")
        lines += [f"    {t.name:<26}{_gib(t.gpu)}   {t.note}" for t in terms]
    lines.append(f"  {'peak':<28}{_gib(plan.peak)}   held + the larger of the training pass and generation")
    if plan.host:
        lines.append(f"host RAM    {_gib(plan.host).strip()} per process (offloaded states)")
    lines.append(f"not counted {'; '.join(plan.unpredicted)}")
    lines.append(f"verdict     {verdict(plan, gpu_memory)}")
    best = suggestions(r, p, planned.costs, gpu_memory)
    if best:
        lines.append("would lower the peak most:")
        lines += [f"  {change:<66} -{saving / GIB:.1f} GiB" for change, saving in best]
    return "\n".join(lines)


__all__ = ["Planned", "describe", "plan_config", "verdict", "weight_dtype"]
