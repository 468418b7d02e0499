"""The plan of a parsed training config, and its printed report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from transformers.training_args import OptimizerNames

from ..config import fast_generation_mode
from ..errors import VLMGRPOError
from ..models import get_model_family
from .advice import Advice
from .advice import advise as advise_changes
from .architectures import load_model_config
from .measure import ParameterCounts, TokenCosts, build_on_meta, count_parameters, token_costs
from .memory import GIB, Plan, Recipe, plan_memory
from .plan import SharingInputs
from .sharing import router_aux_loss, sampling_config

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_IMAGE = (448, 448)


@dataclass
class Planned:
    """A recipe, its plan and what it was computed from.

    Attributes:
        recipe (`Recipe`): the settings that decide memory.
        plan (`Plan`): the plan.
        params (`ParameterCounts`): the model's parameters.
        costs (`TokenCosts`): its measured per-token costs.
        source (`str`): where its `config.json` came from.
        model_type (`str`): its `model_type`.
        image_tokens (`int | None`): tokens of one image, None when the family cannot say.
        lora_layers (`int`): linear layers LoRA targets.
        image_size (`tuple[int, int]`, defaults to 448x448): the images the plan assumes.
        videos (`VideoShape | None`, defaults to None): the videos of a prompt the plan assumes, with the tokens of
            one; None without video.
        advice (`list[Advice]`, defaults to none): the changes that lower the peak (when asked for), lowest first.
    """

    recipe: Recipe
    plan: Plan
    params: ParameterCounts
    costs: TokenCosts
    source: str
    model_type: str
    image_tokens: int | None
    lora_layers: int
    image_size: tuple[int, int] = DEFAULT_IMAGE
    videos: VideoShape | None = None
    advice: list[Advice] = field(default_factory=list)


@dataclass(frozen=True)
class VideoShape:
    """The videos of one prompt that a plan assumes.

    Args:
        count (`int`): videos per prompt.
        frames (`int`): frames the video processor samples from each.
        size (`tuple[int, int]`): width and height of the frames.
        tokens (`int`, defaults to 0): placeholder tokens of one video, as the family counts them (set by
            `plan_config`).
    """

    count: int
    frames: int
    size: tuple[int, int]
    tokens: int = 0

    def describe(self) -> str:
        """`"1 video of 16 frames 448x448, 1024 tokens each"`."""
        width, height = self.size
        plural = "s" if self.count > 1 else ""
        return (
            f"{self.count} video{plural} of {self.frames} frames {width}x{height}, {self.tokens} tokens each"
        )


def weight_dtype(model_args: Any, model_config: Any) -> torch.dtype:
    """The dtype the weights load in: the `dtype` option, or the checkpoint's own (`auto`/unset), else bf16."""
    name = model_args.dtype
    if name in (None, "auto"):
        name = str(model_config.dtype or "bfloat16").removeprefix("torch.")
    if name not in _DTYPES:
        raise VLMGRPOError(f"dtype {name!r}: the planner knows {', '.join(_DTYPES)}.")
    return _DTYPES[name]


def default_image_size(training_args: Any) -> tuple[int, int]:
    """The image the plan assumes: the largest square `max_pixels` lets through when the config sets it, else
    448x448."""
    if training_args.max_pixels:
        side = math.isqrt(training_args.max_pixels)
        return side, side
    return DEFAULT_IMAGE


def old_log_probs(training_args: Any) -> bool:
    """Whether the trainer computes old log-probs (`_old_and_reference_logps`): when generation and updates are
    misaligned, or to correct vLLM's sampling."""
    every = training_args.steps_per_generation * training_args.num_iterations
    corrects_vllm = training_args.use_vllm and training_args.vllm_importance_sampling_correction
    return training_args.gradient_accumulation_steps % every != 0 or corrects_vllm


def plan_config(
    training_args: Any,
    model_args: Any,
    gpu_memory: int,
    processes: int = 1,
    deepspeed: tuple[int, bool, bool] = (0, False, False),
    image_size: tuple[int, int] | None = None,
    images: int = 1,
    text_tokens: int = 64,
    model_config: str | None = None,
    device: str = "cuda",
    advise: bool = False,
    videos: VideoShape | None = None,
) -> Planned:
    """Plan a parsed training config.

    Args:
        training_args (`VLMGRPOConfig`): the training options.
        model_args (`VLMModelConfig`): the model options.
        gpu_memory (`int`): bytes of one GPU.
        processes (`int`, defaults to 1): GPUs in all.
        deepspeed (`tuple`, defaults to no DeepSpeed): `(zero stage, offload optimizer, offload params)`.
        image_size (`tuple[int, int] | None`, defaults to None): width and height of the images; None: the square
            of `max_pixels` when the config sets it, else 448x448.
        images (`int`, defaults to 1): images per prompt.
        text_tokens (`int`, defaults to 64): text tokens of a prompt (chat template included).
        model_config (`str | None`, defaults to None): a `config.json` for a model that is not local.
        device (`str`, defaults to `"cuda"`): where it trains ("cuda" or "cpu"); TRL's LM head scores only completion
            tokens on CUDA (Triton) and every position elsewhere, and `fast_generation: auto` decodes from a static
            cache on CUDA only.
        advise (`bool`, defaults to False): also plan the changes that would lower the peak (`Planned.advice`).
        videos (`VideoShape | None`, defaults to None): the videos of each prompt; None: no video.

    Raises:
        VLMGRPOError: `videos` are given for a family that reads no video.
    """
    config, processor, source = load_model_config(model_args.model_name_or_path, model_config)
    family = get_model_family(config)
    dtype = weight_dtype(model_args, config)
    model = build_on_meta(family, config, dtype)
    lora_targets = None
    if model_args.use_peft:
        from ..policy.adapters import language_linear_names

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
        quantize_8bit=model_args.load_in_8bit,
    )
    recipe = _recipe(training_args, model_args, config, family, params, dtype, processes, deepspeed, device)
    if (
        model_args.use_peft
    ):  # LoRA layers save their own inputs (dropout) and casts: measure with them in place
        from peft import get_peft_model
        from trl import get_peft_config

        from ..policy.adapters import resolve_lora_config

        lora = resolve_lora_config(get_peft_config(model_args), model, family)
        model = get_peft_model(model, lora, autocast_adapter_dtype=recipe.adapter_bytes == 4).base_model.model
    costs = token_costs(model, dtype)
    min_pixels = training_args.min_pixels or processor.get("min_pixels")
    max_pixels = training_args.max_pixels or processor.get("max_pixels")
    max_tiles = training_args.max_tiles or processor.get("max_tiles")
    size = image_size or default_image_size(training_args)
    per_image = family.image_tokens(config, *size, min_pixels, max_pixels, max_tiles)
    video_tokens = 0
    if videos is not None:
        videos = _video_shape(family, config, videos, training_args, processor)
        video_tokens = videos.count * videos.tokens
    recipe = replace(recipe, prompt_tokens=text_tokens + images * (per_image or 0) + video_tokens)
    plan = plan_memory(recipe, params, costs, gpu_memory)
    if model_args.attn_implementation == "eager":
        eager = "attn_implementation eager keeps each layer's attention matrix (heads x tokens^2)"
        plan.unpredicted.append(eager + ": counted as a fused kernel")
    if per_image is None:
        plan.unpredicted.append(
            f"image tokens: {config.model_type} sizes images by its processor; not counted"
        )
    planned = Planned(
        recipe,
        plan,
        params,
        costs,
        source,
        config.model_type,
        per_image,
        len(lora_targets or []),
        size,
        videos,
    )
    if advise:  # LoRA and QLoRA are planned again from this config with other model options
        replan = partial(
            plan_config,
            training_args,
            gpu_memory=gpu_memory,
            processes=processes,
            deepspeed=deepspeed,
            image_size=size,
            images=images,
            text_tokens=text_tokens,
            model_config=model_config,
            device=device,
            videos=videos,
        )
        planned.advice = advise_changes(planned, model_args, gpu_memory, replan)
    return planned


def _video_shape(
    family: Any, config: Any, videos: VideoShape, training_args: Any, processor: dict[str, Any]
) -> VideoShape:
    """`videos` with the tokens of one video, as the family counts them with the config's video size bounds
    (`video_min_pixels` / `video_max_pixels`, else the model folder's video processor's, else the family's)."""
    frames = min(videos.frames, training_args.video_max_frames or videos.frames)
    min_pixels = training_args.video_min_pixels or processor.get("video_min_pixels")
    max_pixels = training_args.video_max_pixels or processor.get("video_max_pixels")
    tokens = family.video_tokens(config, frames, *videos.size, min_pixels, max_pixels)
    if tokens is None:
        raise VLMGRPOError(
            f"{config.model_type} models read no video here; drop --videos (families with video: docs/families.md)."
        )
    return replace(videos, frames=frames, tokens=tokens)


def _recipe(
    training_args: Any,
    model_args: Any,
    config: Any,
    family: Any,
    params: ParameterCounts,
    dtype: torch.dtype,
    processes: int,
    deepspeed: tuple[int, bool, bool],
    device: str,
) -> Recipe:
    """The `Recipe` of the options (the prompt's tokens are set once the image size is known)."""
    stage, offload_optimizer, offload_params = deepspeed
    colocate = training_args.use_vllm and training_args.vllm_mode == "colocate"
    checkpointing = training_args.gradient_checkpointing_kwargs or {}
    sharing = SharingInputs(
        mode=training_args.share_prompt_prefix,
        model_type=config.model_type,
        indexable_cache=family.indexable_cache,
        generation_config=sampling_config(training_args),
        vision_trains=params.vision_trainable,
        use_reentrant=bool(checkpointing.get("use_reentrant", False)),
        aux_loss=router_aux_loss(config.get_text_config(), training_args.router_aux_loss_coef),
    )
    return Recipe(
        weight_bytes=torch.tensor([], dtype=dtype).element_size(),
        lora_r=model_args.lora_r if model_args.use_peft else None,
        load_in_4bit=model_args.load_in_4bit,
        load_in_8bit=model_args.load_in_8bit,
        double_quant=model_args.use_bnb_nested_quant,
        beta=training_args.beta,
        rows=training_args.per_device_train_batch_size,
        generation_rows=training_args.per_device_train_batch_size * training_args.steps_per_generation,
        num_generations=training_args.num_generations,
        completion_tokens=training_args.max_completion_length,
        gradient_checkpointing=training_args.gradient_checkpointing,
        optim=OptimizerNames(training_args.optim).value,
        optim_args=training_args.optim_args,
        accumulation_steps=training_args.gradient_accumulation_steps,
        old_log_probs=old_log_probs(training_args),
        cast_lm_head_to_fp32=training_args.cast_lm_head_to_fp32,
        processes=processes,
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        ds3_gather_for_generation=training_args.ds3_gather_for_generation,
        vllm_colocate_fraction=training_args.vllm_gpu_memory_utilization if colocate else 0.0,
        vllm_sleep=colocate and training_args.vllm_enable_sleep_mode,
        vllm_server=training_args.use_vllm and training_args.vllm_mode == "server",
        scores_every_position=device != "cuda",
        sharing=sharing,
        fast_generation=fast_generation_mode(training_args.fast_generation),
        device=device,
    )


def verdict(plan: Plan, gpu_memory: int) -> str:
    """One line: fits with what to spare, or does not fit."""
    peak = plan.peak / GIB
    if plan.peak <= gpu_memory:
        return f"fits in {gpu_memory / GIB:.0f} GiB with {(gpu_memory - plan.peak) / GIB:.1f} GiB to spare ({peak:.1f} GiB)"
    return f"does not fit in {gpu_memory / GIB:.0f} GiB: {peak:.1f} GiB"


def _gib(size: int) -> str:
    return f"{size / GIB:6.2f} GiB"


def describe(planned: Planned, gpu_memory: int, processes: int, title: str, gpus_per_node: int = 1) -> str:
    """The printed plan: parameters, which passes share, the per-GPU terms by phase, host RAM, the verdict and the
    changes that lower the peak.

    Args:
        planned (`Planned`): what `plan_config` returned.
        gpu_memory (`int`): bytes of one GPU.
        processes (`int`): GPUs in all.
        title (`str`): the first line.
        gpus_per_node (`int`, defaults to 1): GPUs per node, for the host RAM of a node.
    """
    p, r, plan = planned.params, planned.recipe, planned.plan
    head = f"LM head {p.lm_head / 1e9:.2f}B" if not p.tied else "LM head tied to the embeddings"
    trainable = (
        f"LoRA r={r.lora_r} on {planned.lora_layers} language linear layers"
        if r.lora_r is not None
        else ("language model (vision frozen)" if p.trainable < p.total else "every parameter")
    )
    width, height = planned.image_size
    images = "no image tokens known" if planned.image_tokens is None else f"{planned.image_tokens} per image"
    videos = f"; {planned.videos.describe()}" if planned.videos else ""
    lines = [
        title,
        f"model       {planned.source} ({planned.model_type})",
        f"parameters  {p.total / 1e9:.3f}B = vision {p.vision / 1e9:.3f}B + language {p.language / 1e9:.3f}B + "
        f"embeddings {p.embeddings / 1e9:.3f}B; {head}",
        f"trainable   {p.trainable / 1e6:.1f}M ({trainable})",
        f"batch       {r.rows} completions per micro-batch, G={r.num_generations}, {r.generation_rows} generated at "
        f"once; prompt {r.prompt_tokens} tokens ({images} of {width}x{height}{videos}), completion "
        f"{r.completion_tokens}",
        "sharing     " + "\n            ".join(plan.sharing.lines()),
        f"per GPU ({processes} process{'es' if processes > 1 else ''})",
        "  held",
        *[f"    {t.name:<30}{_gib(t.gpu)}   {t.note}" for t in plan.held],
    ]
    for name, terms in plan.phases.items():
        if terms:
            lines.append(f"  {name}")
            lines += [f"    {t.name:<30}{_gib(t.gpu)}   {t.note}" for t in terms]
    lines.append(f"  {'peak':<32}{_gib(plan.peak)}   held + the largest phase")
    if plan.host:
        per_node = f" ({_gib(plan.host * gpus_per_node).strip()} per node)" if gpus_per_node > 1 else ""
        lines.append(f"host RAM    {_gib(plan.host).strip()} per process{per_node} (offloaded states)")
    lines.append(f"not counted {'; '.join(plan.unpredicted)}")
    lines.append(f"verdict     {verdict(plan, gpu_memory)}")
    if planned.advice:
        lines.append("would lower the peak (planned peak per GPU with each change alone):")
        lines += [
            f"  {a.change:<72} {a.peak / GIB:6.1f} GiB  {'fits' if a.peak <= gpu_memory else 'does not fit'}"
            for a in planned.advice
        ]
    return "\n".join(lines)


__all__ = [
    "Planned",
    "VideoShape",
    "default_image_size",
    "describe",
    "plan_config",
    "verdict",
    "weight_dtype",
]
