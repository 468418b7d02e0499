"""The parts `VLMGRPOTrainer` builds once TRL's `__init__` has run: what decides which passes share each group's
prompt, frozen vision's feature cache, fast generation, and the rollout that samples each generation batch.

They read what TRL set up (its generation config, vLLM backend, tools, environments and event loop) and hand the
rollout exactly what it needs, so that the rollout keeps no reference to the trainer.
"""

from __future__ import annotations

import sys
from typing import Any

from ..config import fast_generation_mode, sharing_mode
from ..errors import VLMGRPOError
from ..policy.fast_generation import FastGeneration, decide_fast_generation
from ..policy.image_features import ImageFeatureCache
from ..policy.sharing_plan import SharingPolicy
from ..rollout.asynchronous import AsyncRollouts, generation_batches
from ..rollout.dynamic_sampling import DynamicSampling
from ..rollout.generation import GenerateSettings, TransformersSampler
from ..rollout.prompt_stream import PromptStream
from ..rollout.rollout import Rollout, RolloutSettings, Tools
from ..rollout.tools import ToolLoop
from ..rollout.vllm.generation import VLLMSampler


def zero3_processes(trainer: Any) -> tuple[bool, bool]:
    """`(ZeRO-3, ZeRO-3 over several processes)`: ZeRO-3 gathers each module's shards collectively."""
    zero3 = trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3
    return zero3, zero3 and trainer.accelerator.num_processes > 1


def image_feature_cache(trainer: Any) -> ImageFeatureCache | None:
    """Frozen vision's cache (see `image_features`), or None while a vision parameter trains.

    Under multi-process ZeRO-3 it needs generation to gather the whole model (`ds3_gather_for_generation`), so that
    no process runs the vision tower's collectives alone.
    """
    vision_trains = any(
        p.requires_grad for n, p in trainer.model.named_parameters() if trainer.family.is_vision_module(n)
    )
    per_module_gathers = zero3_processes(trainer)[1] and not trainer.args.ds3_gather_for_generation
    return None if vision_trains or per_module_gathers else ImageFeatureCache(trainer.family)


def sharing_policy(trainer: Any, generation_config: Any) -> SharingPolicy:
    """Which passes may share each group's prompt: decided per generation batch by the returned policy."""
    args = trainer.args
    checkpointing = args.gradient_checkpointing_kwargs or {}
    zero3, zero3_processes_ = zero3_processes(trainer)
    return SharingPolicy(
        mode=sharing_mode(args.share_prompt_prefix),
        model_type=trainer.family.model_type,
        indexable_cache=trainer.family.indexable_cache,
        generation_config=generation_config,
        zero3_frozen_vision=zero3 and trainer.image_features is not None,
        reentrant_checkpointing=args.gradient_checkpointing and checkpointing.get("use_reentrant", False),
        aux_loss=trainer.aux_loss_enabled,
        bidirectional_images=trainer.family.bidirectional_image_attention(
            trainer.accelerator.unwrap_model(trainer.model).config
        ),
        zero3_vision_trains=zero3_processes_ and trainer.image_features is None,
    )


def fast_generation(trainer: Any, generation_config: Any) -> FastGeneration:
    """The run's fast-generation decision (see `fast_generation`)."""
    config = trainer.accelerator.unwrap_model(trainer.model).config
    return decide_fast_generation(
        fast_generation_mode(trainer.args.fast_generation),
        trainer.accelerator.device,
        generation_config,
        quantized="quantization_config" in config.to_dict(),
        zero3=zero3_processes(trainer)[0],
    )


def build_rollout(trainer: Any, generation_config: Any, fast: FastGeneration) -> Rollout:
    """The trainer's `Rollout`, from what TRL's `__init__` set up.

    Args:
        trainer (`VLMGRPOTrainer`): the trainer, TRL's `__init__` done.
        generation_config (`GenerationConfig`, *optional*): the config `generate` runs with (None when vLLM samples).
        fast (`FastGeneration`): the fast-generation decision.
    """
    args, accelerator, family = trainer.args, trainer.accelerator, trainer.family
    zero3_processes_ = zero3_processes(trainer)[1]
    gather = args.ds3_gather_for_generation
    if trainer.tools and zero3_processes_ and not gather:
        raise VLMGRPOError(
            "tools and environment_factory under ZeRO-3 over several processes need ds3_gather_for_generation: true "
            "(the default): with the parameters left partitioned, the turns after a tool call would run different "
            "forwards on each process; remove ds3_gather_for_generation: false."
        )
    settings = GenerateSettings(
        generation_config=generation_config,
        generation_kwargs={} if trainer.use_vllm else trainer.generation_kwargs,  # TRL sets none with vLLM
        eos_token_ids=trainer.eos_token_ids,
        pad_token_id=trainer._tokenizer.pad_token_id,
        pad_to_multiple_of=trainer.pad_to_multiple_of,
        gather_for_generation=gather,
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
    )
    sampler = TransformersSampler(
        lambda: trainer.model_wrapped,  # wrapped by `Trainer.train` after construction
        accelerator,
        family,
        trainer.processing_class,
        settings,
        fast,
        trainer.image_features,
    )
    vllm = None
    if trainer.use_vllm:
        vllm = VLLMSampler(
            trainer.vllm_generation, trainer.vllm_mode, family, trainer.processing_class,
            accelerator.is_main_process,
            collects_processes=trainer.vllm_mode == "server" or args.vllm_tensor_parallel_size > 1,
        )  # fmt: skip
    model_config = accelerator.unwrap_model(trainer.model).config
    rollout_settings = RolloutSettings(
        num_generations=trainer.num_generations,
        num_generations_eval=trainer.num_generations_eval,
        max_completion_length=trainer.max_completion_length,
        chat_template_kwargs=trainer.chat_template_kwargs,
        model_config=model_config,
        tool_chat_template=trainer.chat_template if trainer.tools else None,
        encode_features_after_sampling=(
            trainer.image_features is not None
            and zero3_processes_
            and bool(trainer.tools or trainer.use_vllm)
        ),
        report_to=list(args.report_to or []),
    )
    dynamic = stream = None
    if args.dynamic_sampling:
        dynamic = DynamicSampling(
            trainer.num_generations, args.dynamic_sampling_max_rounds, args.dynamic_sampling_at_cap,
            args.steps_per_generation, trainer.reward_weights, trainer.multi_objective_aggregation,
        )  # fmt: skip
        stream = PromptStream(len(trainer.train_dataset), seed=args.seed + 1)
    rollout_func = None
    if trainer.rollout_func is not None:
        user_func = trainer.rollout_func
        rollout_func = lambda prompts: user_func(prompts, trainer)  # noqa: E731  (TRL's signature)
    return Rollout(
        family, trainer.processing_class, accelerator, rollout_settings, trainer._sharing, sampler, vllm,
        trainer.image_features, _tools(trainer, model_config) if trainer.tools else None, rollout_func, dynamic,
        stream, trainer.train_dataset, trainer._score,
    )  # fmt: skip


def _tools(trainer: Any, model_config: Any) -> Tools:
    """The run's tools and environments as TRL set them up, and the loop that calls them."""
    if trainer.use_vllm and trainer.vllm_mode == "colocate":
        max_model_len = trainer.vllm_generation.llm.llm_engine.model_config.max_model_len
    else:  # TRL's ceiling for a row: the language model's positions
        max_model_len = model_config.get_text_config().max_position_embeddings
    iterations = trainer.args.max_tool_calling_iterations
    loop = ToolLoop(
        trainer.processing_class,
        trainer.chat_template,
        trainer.chat_template_kwargs,
        sys.maxsize if iterations is None else iterations,
        trainer.max_completion_length,
        max_model_len,
        trainer.async_loop if trainer._has_async_funcs else None,
        trainer.args.tool_timeout,
    )
    factories = trainer.environment_factories
    return Tools(
        standalone=list(trainer._standalone_tools),
        factories=factories,
        pool=trainer._environment_pool if factories is not None else {},
        schemas=trainer._env_tools if factories is not None else {},
        multi_environment=trainer._multi_environment,
        loop=loop,
    )


def async_rollouts(trainer: Any, rollout: Rollout) -> AsyncRollouts | None:
    """With `async_rollouts`, the thread that samples the next generation batches on the server, over a second
    training data loader built as the trainer's (the same rows in the same order); None otherwise."""
    args = trainer.args
    if not args.async_rollouts:
        return None
    if trainer.rollout_func is not None:
        raise VLMGRPOError(
            "async_rollouts with a rollout_func is not supported (the function gets the trainer, which trains while "
            "the next batch samples); sample with tools or environments instead, or set async_rollouts: false."
        )
    if trainer.accelerator.num_processes > 1:
        raise VLMGRPOError(
            "async_rollouts runs on one training process for now (the sampling thread would meet the other processes' "
            "collectives); train on one process, or set async_rollouts: false."
        )
    every = args.steps_per_generation * trainer.num_iterations
    batches = generation_batches(trainer.get_train_dataloader(), every)
    return AsyncRollouts(rollout, batches, args.max_staleness)
