"""What `VLMGRPOTrainer.__init__` resolves before and after TRL's own `__init__`, as plain functions.

In the order construction uses them: the config is checked, the family's `from_pretrained` arguments resolved, the
vision tower frozen and LoRA aimed at the language model, reward functions loaded or guarded, TRL shown the view of
the config it must see, the dataset's size checked, and the reference model prepared like the policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator
from datasets import Dataset
from peft import LoraConfig, PeftConfig
from transformers import AutoModelForSequenceClassification, PreTrainedModel, ProcessorMixin
from trl.models import prepare_deepspeed
from trl.trainer.utils import (
    add_fused_lm_head,
    disable_dropout_in_model,
    get_callable_name,
    is_async_callable,
)

from ..config import VLMGRPOConfig
from ..errors import VLMGRPOError
from ..models import ModelFamily
from ..policy.adapters import resolve_lora_config
from ..policy.lm_head import cast_lm_head_to_fp32
from ..rewards.guard import RewardError, guard_reward

VLLM_NEVER = -100.0
"""vLLM clamps a logit bias to [-100, 100]; -100 makes a placeholder token's probability vanish (exp(-100))."""


def resolve_args(args: VLMGRPOConfig | None) -> VLMGRPOConfig:
    """The trainer's config: `args`, or the defaults with `output_dir="vlm-grpo-output"` when None."""
    if args is None:
        return VLMGRPOConfig(output_dir="vlm-grpo-output")
    if not isinstance(args, VLMGRPOConfig):
        raise VLMGRPOError(
            f"args must be a VLMGRPOConfig, got {type(args).__name__}; build one from your options."
        )
    return args


def merged_ids(ours: Sequence[int], user: int | Sequence[int] | None) -> list[int]:
    """Token ids of `ours` followed by the user's that are not among them (`generation_kwargs` merge)."""
    user = [] if user is None else [user] if isinstance(user, int) else list(user)
    return [*ours, *(i for i in user if i not in ours)]


def _places_itself(args: VLMGRPOConfig) -> bool:
    """Whether distributed training places the model itself (no `device_map` then)."""
    return args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED")


def model_init_kwargs(args: VLMGRPOConfig, family: ModelFamily, quantization_config: Any) -> dict[str, Any]:
    """`from_pretrained` keyword arguments of the policy (and reference), resolved by the family's module.

    Args:
        args (`VLMGRPOConfig`): the training config; its `model_init_kwargs` and `trust_remote_code` are read.
        family (`ModelFamily`): the model's family.
        quantization_config (`Any`): the trainer's `quantization_config` argument, or None.
    """
    kwargs = dict(args.model_init_kwargs or {})
    if quantization_config is not None:
        if "quantization_config" in kwargs:
            raise VLMGRPOError(
                "quantization_config is set both as a trainer argument and in model_init_kwargs; keep one."
            )
        kwargs["quantization_config"] = quantization_config
    if _places_itself(args):
        kwargs["device_map"] = None
    return family.model_init_kwargs(**{**kwargs, "trust_remote_code": args.trust_remote_code})


def load_policy(
    model: str | PreTrainedModel,
    args: VLMGRPOConfig,
    family: ModelFamily,
    quantization_config: Any,
    processing_class: ProcessorMixin | None,
) -> tuple[PreTrainedModel, ProcessorMixin, dict[str, Any]]:
    """The policy, its processor, and the `from_pretrained` arguments it was loaded with (`{}` for a model in memory).

    Args:
        model (`str | PreTrainedModel`): a model folder (or hub id), or a model in memory.
        args (`VLMGRPOConfig`): the training config (`model_init_kwargs`, image limits).
        family (`ModelFamily`): the model's family, which loads both.
        quantization_config (`Any`): the trainer's `quantization_config` argument, or None.
        processing_class (`ProcessorMixin`, *optional*): the processor given, else the family's is loaded.
    """
    model_path = model if isinstance(model, str) else None
    init_kwargs = model_init_kwargs(args, family, quantization_config) if model_path else {}
    if model_path is not None:
        model = family.load_model(model_path, **init_kwargs)
    if processing_class is None:
        processing_class = family.load_processor(
            model_path or model.config._name_or_path,
            trust_remote_code=args.trust_remote_code,
            **args.image_size_kwargs(),
        )
    family.configure_video(processing_class, **args.video_kwargs())
    return model, processing_class, init_kwargs


def check_videos(datasets: Sequence[Any], family: ModelFamily, args: VLMGRPOConfig, rolls_out: bool) -> None:
    """Refuse, in one line, what cannot train on the datasets' videos: a family whose model reads none, vLLM, and
    tools, environments or a `rollout_func` (their later turns re-encode a row from its images alone).

    Args:
        datasets (`Sequence[Any]`): the train and eval datasets given (a `datasets.Dataset` with a `videos` column is
            read; others are checked when their rows are encoded).
        family (`ModelFamily`): the model's family.
        args (`VLMGRPOConfig`): the training config.
        rolls_out (`bool`): whether tools, environments or a `rollout_func` sample the completions.
    """
    has_videos = any(
        isinstance(data, Dataset) and "videos" in data.column_names and any(data["videos"])
        for data in datasets
    )
    if not has_videos:
        return
    if not family.reads_video:
        raise VLMGRPOError(
            f"The dataset holds videos, but {family.no_video_reason()}; remove the video records, or train a family "
            "that reads video (see docs/families.md)."
        )
    if args.use_vllm and args.vllm_mode == "server":
        raise VLMGRPOError(
            "The dataset holds videos, which vLLM server mode does not take (TRL's client sends a server images "
            "only); set vllm_mode: colocate, or use_vllm: false (transformers samples them)."
        )
    if args.use_vllm and family.vllm_video_refusal:
        raise VLMGRPOError(
            f"The dataset holds videos, which vLLM does not take for {family.model_type} here "
            f"({family.vllm_video_refusal}); set use_vllm: false to generate with transformers."
        )
    if args.use_vllm and args.vllm_tensor_parallel_size > 1:
        raise VLMGRPOError(
            "The dataset holds videos, which vLLM with vllm_tensor_parallel_size > 1 does not take here; set "
            "vllm_tensor_parallel_size: 1, or use_vllm: false."
        )
    if args.use_vllm and (args.video_min_pixels or args.video_max_pixels):
        raise VLMGRPOError(
            "video_min_pixels and video_max_pixels do not reach vLLM, which sizes videos as the model folder's video "
            "processor says; set its size there (video_preprocessor_config.json) and remove them, or set "
            "use_vllm: false."
        )
    if rolls_out:
        raise VLMGRPOError(
            "The dataset holds videos, which tools, environment_factory and rollout_func do not take yet (their later "
            "turns would drop the video); remove them, or the video records."
        )


def check_tools(args: VLMGRPOConfig, family: ModelFamily, processor: ProcessorMixin) -> None:
    """Refuse, in one line, tools or environments that a family cannot run with vLLM's colocate engine (it cannot
    take the histories of later turns; see `ModelFamily.vllm_history_ids`)."""
    if args.use_vllm and args.vllm_mode == "colocate":
        family.vllm_history_ids(processor, [])


def freeze_vision_and_aim_lora(
    model: PreTrainedModel, family: ModelFamily, args: VLMGRPOConfig, peft_config: PeftConfig | None
) -> PeftConfig | None:
    """Freeze the vision tower on request; aim LoRA at the language model only. Returns the LoRA config."""
    if args.freeze_vision_modules:
        for name, param in model.named_parameters():
            if family.is_vision_module(name):
                param.requires_grad_(False)
    if isinstance(peft_config, LoraConfig):
        return resolve_lora_config(peft_config, model, family)
    return peft_config


def reward_functions(reward_funcs: Any, args: VLMGRPOConfig, failures: list[RewardError]) -> list:
    """Reward models given as paths loaded as TRL loads them; plain callables wrapped to fail precisely.

    Args:
        reward_funcs (`Any`): the trainer's `reward_funcs`: one or a list of callables or model paths, or None.
        args (`VLMGRPOConfig`): the training config.
        failures (`list[RewardError]`): where a guarded reward records its failure (see `guard_reward`).
    """
    funcs = (
        []
        if reward_funcs is None
        else list(reward_funcs)
        if isinstance(reward_funcs, list)
        else [reward_funcs]
    )
    kwargs = dict(args.model_init_kwargs or {})
    if _places_itself(args):
        kwargs["device_map"] = None
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    for i, func in enumerate(funcs):
        if isinstance(func, str):
            funcs[i] = AutoModelForSequenceClassification.from_pretrained(func, num_labels=1, **kwargs)
        elif callable(func) and not isinstance(func, torch.nn.Module) and not is_async_callable(func):
            funcs[i] = guard_reward(func, get_callable_name(func), failures)
    return funcs


@contextmanager
def trl_view_of(
    args: VLMGRPOConfig, builds_reference: bool, placeholders: list[int], model: PreTrainedModel | None = None
) -> Iterator[bool]:
    """What `GRPOTrainer.__init__` must see of `args`, restored afterwards.

    TRL must not rebuild a reference model from `config._name_or_path` (it fails for a model that exists only in
    memory, and loads another class than the VLM's): the trainer builds it after. The policy is already loaded, so
    `model_init_kwargs` must not be applied again. With vLLM, the placeholder tokens get a logit bias that keeps them
    from being sampled, merged into the user's `generation_kwargs`. With `cast_lm_head_to_fp32` and tied embeddings,
    TRL must not see the tie (it looks for the embedding where a text-only model keeps it, see `lm_head`): yields
    whether the tie was hidden, so that the trainer keeps the embedding's dtype itself.

    Args:
        args (`VLMGRPOConfig`): the config TRL's `__init__` reads; changed while the context is open.
        builds_reference (`bool`): whether the trainer builds the reference model itself.
        placeholders (`list[int]`): image/video placeholder token ids.
        model (`PreTrainedModel`, *optional*, defaults to `None`): the policy, whose embedding tie may be hidden.
    """
    saved = args.beta, args.sync_ref_model, args.model_init_kwargs, args.generation_kwargs
    hide_tie = model is not None and args.cast_lm_head_to_fp32 and model.config.tie_word_embeddings
    if hide_tie:
        model.config.tie_word_embeddings = False
    if builds_reference:
        args.beta, args.sync_ref_model = 0.0, False
    args.model_init_kwargs = None
    if args.use_vllm:
        user = dict(args.generation_kwargs or {})
        bias = {int(i): VLLM_NEVER for i in placeholders}
        args.generation_kwargs = {**user, "logit_bias": {**bias, **(user.get("logit_bias") or {})}}
    try:
        yield hide_tie
    finally:
        args.beta, args.sync_ref_model, args.model_init_kwargs, args.generation_kwargs = saved
        if hide_tie:
            model.config.tie_word_embeddings = True


def check_dataset_size(dataset: Any, args: VLMGRPOConfig, num_generations: int) -> None:
    """A dataset must fill at least one generation batch, or no training step can run."""
    if not isinstance(dataset, Sized):
        if args.dynamic_sampling:
            raise VLMGRPOError(
                "dynamic_sampling draws fresh prompts by index, which a dataset without a length (an "
                "IterableDataset) cannot give; load the data as a Dataset or set dynamic_sampling: false."
            )
        return
    needed = args.generation_batch_size // num_generations  # distinct prompts per generation batch
    if len(dataset) < needed:
        raise VLMGRPOError(
            f"The training dataset has {len(dataset)} prompts but one generation batch needs {needed} "
            f"(generation_batch_size {args.generation_batch_size} / num_generations {num_generations}); add data "
            "or lower per_device_train_batch_size or steps_per_generation."
        )


def prepare_reference_model(
    ref_model: PreTrainedModel,
    args: VLMGRPOConfig,
    accelerator: Accelerator,
    temperature: float,
    deepspeed: bool,
) -> torch.nn.Module:
    """Reference policy: a frozen copy of the initial model, prepared like the policy (ZeRO-3 shards it).

    Args:
        ref_model (`PreTrainedModel`): the loaded copy.
        args (`VLMGRPOConfig`): the training config (`disable_dropout`, `cast_lm_head_to_fp32`).
        accelerator (`Accelerator`): the trainer's accelerator.
        temperature (`float`): the sampling temperature TRL's fused head divides the logits by.
        deepspeed (`bool`): whether DeepSpeed prepares the model.
    """
    ref_model.requires_grad_(False)
    if args.disable_dropout:
        disable_dropout_in_model(ref_model)
    if args.cast_lm_head_to_fp32:  # as TRL casts its own reference model
        cast_lm_head_to_fp32(ref_model)
    add_fused_lm_head(ref_model, temperature=temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
    if deepspeed:
        return prepare_deepspeed(ref_model, accelerator)
    return accelerator.prepare_model(ref_model, evaluation_mode=True)
