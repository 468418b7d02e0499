"""`VLMGRPOTrainer`: TRL's GRPO loop for vision-language models, with every model quirk delegated.

The file reads in the order a step runs, as TRL's `GRPOTrainer` does:

1. Construction: the per-model module (chosen by `config.model_type`) loads the model and processor; the vision
   tower is frozen on request and kept out of LoRA; TRL's own `__init__` runs; generation is configured so that
   image/video placeholder tokens are never sampled; the reference model is built as a frozen copy of the policy
   (the steps are functions in `trainer_setup`).
2. `_prepare_inputs`: one generation batch is rolled out, shuffled by whole groups and cut into micro-batches.
3. The rollout (`_generate_and_score_completions`): encode each distinct prompt once, sample, decode, pad, old and
   reference log-probs, rewards, group advantages, metrics.
4. Log-probs (`_get_per_token_logps_and_entropies`): one chunk loop; each chunk either runs each group's prompt
   once (shared prefix) or full rows.
5. Loss: TRL's `_compute_loss`, reading this micro-batch's per-sample image tensors.
6. Checkpoints.

Every `GRPOConfig` option behaves as in TRL 1.16 or is refused when the config is built (see `trl_options.py`).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import torch
from accelerate.utils import gather, gather_object, is_peft_model
from peft import PeftConfig
from safetensors import SafetensorError
from transformers import GenerationConfig, PreTrainedModel, ProcessorMixin
from trl import GRPOTrainer
from trl.data_utils import prepare_multimodal_messages
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import split_tensor_dict, use_adapter

from ..advantages import group_advantages
from ..config import VLMGRPOConfig, fast_generation_mode, sharing_mode
from ..data.rows import load_rows, row_images, same_prompt
from ..errors import VLMGRPOError
from ..models import EncodedPrompt, ModelFamily, get_model_family
from ..policy.adapters import drop_repeated_input_grad_hooks
from ..policy.image_features import ImageFeatureCache
from ..policy.image_rows import row_image_inputs
from ..policy.lm_head import keep_embedding_dtype
from ..policy.shared_prefix import (
    shared_prefix_continue,
    shared_prefix_generate,
    shared_prefix_logps,
    shuffle_batch,
)
from ..policy.sharing_plan import FULL_ROWS, SharingPlan, SharingPolicy, group_sizes
from ..policy.vision_dummy import add_dummy_row, drop_dummy_row, dummy_media_prompt, media_needed
from ..rewards.guard import RewardError
from ..rewards.text import REASONING_OPENED
from ..rollout.batch import Sampled, is_truncated, pad_batch, pad_rows
from ..rollout.dynamic_sampling import DynamicSampling, Round, chosen_logs, group_rows, kept_and_dropped
from ..rollout.dynamic_sampling import metrics as dynamic_metrics
from ..rollout.environments import draw_environments, reset_environments, tool_dicts, tool_metrics
from ..rollout.fast_generation import decide_fast_generation
from ..rollout.prompt_stream import PromptStream, prompt_key
from ..rollout.tools import history_prompts
from ..rollout.vllm import generation as vllm_generation
from ..rollout.vllm.cpu import keep_linear_weights_plain
from ..rollout.vllm.payload import (
    build_vllm_payload,
    check_vllm_architecture,
    check_vllm_cpu_attention,
    check_vllm_prompts,
    vllm_generate_kwargs,
    vllm_history_prompts,
    warn_vllm_cpu_image_mask,
)
from ..runtime.monitoring import PhaseTimer, step_metrics
from ..runtime.sample_log import samples_path, write_step_samples
from ..runtime.signal_watch import SignalWatch
from ..trl_options import check_tool_template, refuse_trainer_arguments
from . import setup as setup
from .checkpoints import (
    checkpoint_write_error,
    load_optimizer_and_scheduler_to_cpu,
    load_weights_mapped,
    mark_complete,
)
from .metrics import length_metrics, reward_metrics
from .rollout_buffer import load_rollout, save_rollout
from .vllm_correction import importance_sampling_ratio, local_statistics, sampling_metrics

logger = logging.getLogger(__name__)


class VLMGRPOTrainer(GRPOTrainer):
    """GRPO for vision-language models. Arguments are those of `trl.GRPOTrainer`, with these differences:

    Args:
        model (`str | PreTrainedModel | PeftModel`): a model folder (or hub id), loaded by the family's module with
            `args.model_init_kwargs` (dtype, attn_implementation, quantization_config, ...), or a model in memory.
        args (`VLMGRPOConfig`, *optional*, defaults to `None`): training options; see its docstring for the
            vision-specific ones.
        processing_class (`ProcessorMixin`, *optional*, defaults to `None`): defaults to the family's processor
            with `args`' image limits.
        peft_config (`peft.LoraConfig`, *optional*, defaults to `None`): LoRA; `target_modules=None` or
            `"all-linear"` means every linear layer of the language model, and the vision tower is never targeted.

    `tools`, `environment_factory` and `rollout_func` run as in TRL 1.16 (see `tool_rollout`): tools may return images,
    which join the row's images in order; a chat template that cannot render tool calls is refused in one line.
    """

    # ------------------------------------------------------------------------------------------ construction
    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any = None,
        args: VLMGRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: ProcessorMixin | None = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: PeftConfig | None = None,
        tools: list | None = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ):
        args = setup.resolve_args(args)
        model_path = model if isinstance(model, str) else None
        uses_peft = peft_config is not None or (model_path is None and is_peft_model(model))
        refuse_trainer_arguments(args, uses_peft)
        family = get_model_family(model, trust_remote_code=args.trust_remote_code)
        model, processing_class, init_kwargs = setup.load_policy(
            model, args, family, quantization_config, processing_class
        )
        builds_reference = args.beta != 0.0 and not uses_peft
        reference = copy.deepcopy(model).eval() if builds_reference and model_path is None else None
        peft_config = setup.freeze_vision_and_aim_lora(model, family, args, peft_config)
        placeholders = family.placeholder_token_ids(processing_class, model.config)
        # filled by the guarded rewards, see `_calculate_rewards`
        self._reward_failures: list[RewardError] = []
        reward_funcs = setup.reward_functions(reward_funcs, args, self._reward_failures)
        embedding_dtype = model.get_input_embeddings().weight.dtype
        setup.check_videos(
            (train_dataset, eval_dataset), family, args, bool(tools or environment_factory or rollout_func)
        )
        if tools or environment_factory:
            check_tool_template(processing_class)
            if args.use_vllm and args.vllm_mode == "colocate":
                family.vllm_history_ids(
                    processing_class, []
                )  # refuses a family whose history vLLM cannot take
        if args.use_vllm:
            check_vllm_architecture(family)
            check_vllm_cpu_attention(family, model.config, args.device, model.name_or_path)
            warn_vllm_cpu_image_mask(family, model.config, args.device)
            if args.vllm_mode == "colocate":  # on a CPU, vLLM's packed weights could not take the weight sync
                keep_linear_weights_plain()
        with setup.trl_view_of(args, builds_reference, placeholders, model) as hidden_tie:
            super().__init__(
                model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                eval_dataset=eval_dataset, processing_class=processing_class,
                reward_processing_classes=reward_processing_classes, callbacks=callbacks, optimizers=optimizers,
                peft_config=peft_config, tools=tools, rollout_func=rollout_func, environment_factory=environment_factory,
            )  # fmt: skip
        if hidden_tie:
            keep_embedding_dtype(model, embedding_dtype)
        self.beta = args.beta
        self.family: ModelFamily = family
        self.placeholder_token_ids = placeholders
        # the rewards read `<think>` in front of each completion (see `vlm_grpo.rewards.text.REASONING_OPENED`)
        self._reasoning_opened = family.completions_open_in_reasoning(
            self.processing_class, self.chat_template_kwargs
        )
        self._vllm_videos = None  # colocate mode: hands each row's videos to the engine (`ColocatedVideos`)
        if self.use_vllm:
            vllm_generation.name_weights_for_vllm(self.vllm_generation, family)
            if self.vllm_mode == "colocate":
                self._vllm_videos = vllm_generation.ColocatedVideos(self.vllm_generation)
        setup.check_dataset_size(train_dataset, args, self.num_generations)
        self._configure_generation()
        self._init_rollout_state()
        if builds_reference:
            self._attach_reference_model(reference or family.load_model(model_path, **init_kwargs))

    def _attach_reference_model(self, reference: PreTrainedModel) -> None:
        """The frozen reference policy, prepared like the policy, and kept in sync on `sync_ref_model`, as TRL."""
        self.ref_model = setup.prepare_reference_model(
            reference, self.args, self.accelerator, self.temperature, self.is_deepspeed_enabled
        )
        if self.args.sync_ref_model:
            self.add_callback(SyncRefModelCallback(ref_model=self.ref_model, accelerator=self.accelerator))

    def _configure_generation(self) -> None:
        """Completions end on TRL's eos ids plus the user's, and never contain image/video placeholder tokens.

        TRL replaces its `eos_token_id` and `suppress_tokens` with the user's `generation_kwargs`; here they are
        merged instead, so that a user's stop token adds to the family's and placeholders stay suppressed.
        """
        user = self.args.generation_kwargs or {}
        self.eos_token_ids = setup.merged_ids(self.eos_token_ids, user.get("eos_token_id"))
        if self.use_vllm:
            return
        self.generation_kwargs.update(
            eos_token_id=self.eos_token_ids,
            suppress_tokens=setup.merged_ids(self.placeholder_token_ids, user.get("suppress_tokens")),
        )
        self.generation_config = GenerationConfig(**self.generation_kwargs, disable_compile=True)

    def _init_rollout_state(self) -> None:
        """State of the rollout and of the per-step metrics, set once TRL's `__init__` has run."""
        self._active_inputs: dict[str, Any] | None = None  # the micro-batch `_compute_loss` is training on
        self._timer, self._step_seconds, self._step_tokens = PhaseTimer(), 0.0, 0
        samples = (
            f"{samples_path(self.args.output_dir, 0).parent}/ (written every {self.args.log_samples_steps} step(s))"
            if self.args.log_samples_steps
            else "the logs (set log_samples_steps to write them to output_dir/samples)"
        )
        self._signal_watch = SignalWatch(
            self.args.no_signal_warning_steps, self.args.no_signal_warning_every, samples
        )
        self._vision_dummies: dict[frozenset[str], EncodedPrompt] = {}  # by the kinds of media they hold
        # during the tool loop of a batch whose generation shares: its distinct prompts and their images
        self._turn_prompts: list[tuple[EncodedPrompt, list]] | None = None
        zero3 = self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        # ZeRO-3 gathers each module's shards collectively: see `vision_dummy`
        self._zero3_multi_process = zero3 and self.accelerator.num_processes > 1
        vision_trains = any(
            p.requires_grad for n, p in self.model.named_parameters() if self.family.is_vision_module(n)
        )
        # Frozen vision: each image is encoded once per generation batch (see `image_features`). Under multi-process
        # ZeRO-3 that needs generation to gather the whole model (`ds3_gather_for_generation`), so that no process
        # runs the vision tower's collectives alone.
        per_module_gathers = self._zero3_multi_process and not self.args.ds3_gather_for_generation
        self._image_features = None if vision_trains or per_module_gathers else ImageFeatureCache(self.family)
        self._sharing = self._sharing_policy(zero3)
        if self._sharing.describe():
            logger.info(self._sharing.describe())
        self._fast = decide_fast_generation(
            fast_generation_mode(self.args.fast_generation),
            self.accelerator.device,
            None if self.use_vllm else self._merged_generation_config(),
            quantized="quantization_config" in self.accelerator.unwrap_model(self.model).config.to_dict(),
            zero3=zero3,
        )
        logger.info(self._fast.reason)
        # transformers' config for `generate`, built once (TRL sets none when vLLM samples)
        self._fast_generation_config = (
            None if self.use_vllm else self._fast.generation_config(self.generation_config)
        )
        self._dynamic = self._prompt_stream = None
        if self.args.dynamic_sampling:
            self._dynamic = DynamicSampling(
                self.num_generations, self.args.dynamic_sampling_max_rounds, self.args.dynamic_sampling_at_cap,
                self.args.steps_per_generation, self.reward_weights, self.scale_rewards,
                self.multi_objective_aggregation,
            )  # fmt: skip
            self._prompt_stream = PromptStream(len(self.train_dataset), seed=self.args.seed + 1)

    def _sharing_policy(self, zero3: bool) -> SharingPolicy:
        """Which passes may share each group's prompt: decided per generation batch by the returned policy."""
        checkpointing = self.args.gradient_checkpointing_kwargs or {}
        return SharingPolicy(
            mode=sharing_mode(self.args.share_prompt_prefix),
            model_type=self.family.model_type,
            indexable_cache=self.family.indexable_cache,
            generation_config=None if self.use_vllm else self._merged_generation_config(),
            zero3_frozen_vision=zero3 and self._image_features is not None,
            reentrant_checkpointing=self.args.gradient_checkpointing
            and checkpointing.get("use_reentrant", False),
            aux_loss=self.aux_loss_enabled,
            bidirectional_images=self.family.bidirectional_image_attention(
                self.accelerator.unwrap_model(self.model).config
            ),
        )

    def _merged_generation_config(self) -> GenerationConfig:
        """The config `generate` runs with: TRL's, where unset filled from the model's own, as `generate` merges them."""
        model = self.accelerator.unwrap_model(self.model)
        return model._prepare_generation_config(self.generation_config)[0]

    def release_process_groups(self) -> None:
        """Destroy the process groups vLLM set up in colocate mode, through vLLM (see `shutdown.finish_processes`).

        Without vLLM in this process, a no-op.
        """
        if self.use_vllm and self.vllm_mode == "colocate":
            vllm_generation.release_process_groups()

    # ------------------------------------------------------------------------------------------ one step
    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's step, plus per-phase timings and throughput once per optimizer step."""
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._step_seconds += time.perf_counter() - start
        if self._step % self.current_gradient_accumulation_steps == 0:
            metrics = step_metrics(
                self._timer.pop(), self._step_seconds, self._step_tokens, self.accelerator.num_processes
            )
            for name, value in metrics.items():
                self._metrics["train"][name].append(value)
            self._step_seconds, self._step_tokens = 0.0, 0
        return loss

    def _prepare_inputs(self, generation_batch):
        """TRL's buffering of a generation batch, shuffled with TRL's draw (by whole groups when passes share).

        When a log-prob pass shares each group's prompt, a micro-batch holds complete groups whenever group sizes
        divide it, and each group's prompt is computed once per pass (see `shared_prefix.shuffle_batch`). Evaluation
        is unchanged.
        """
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            plan = batch.pop("sharing")  # every micro-batch carries its generation batch's plan
            batch = shuffle_batch(batch, plan)
            micro_batches = split_tensor_dict(batch, self.args.steps_per_generation)
            self._buffered_inputs = [{**micro_batch, "sharing": plan} for micro_batch in micro_batches]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ------------------------------------------------------------------------------------------ rollout
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Encode, sample, score and compute advantages for one generation batch (rows repeat each prompt G times)."""
        mode = "train" if self.model.training else "eval"
        timer = self._timer if mode == "train" else PhaseTimer()
        if self._image_features is not None and mode == "train":
            self._image_features.clear()  # the previous generation batch's features are not needed any more
        sampled = self._sample_rows(inputs, mode, timer)
        # with dynamic sampling the rewards are scored with the rollout, else after the log-prob passes, as TRL
        local_rewards = dropped = None
        if mode == "train" and self.args.dynamic_sampling:
            sampled, local_rewards, dropped = self._sample_dynamically(sampled, timer)
        self._log_lengths(
            mode, [e.input_ids for e in sampled.encoded], sampled.completion_ids, sampled.tool_mask
        )
        batch = self._pad_batch(sampled)
        width = batch["completion_ids"].size(1)
        batch["sharing"] = self._sharing.plan(
            *self._shape(sampled.encoded, width), generation=sampled.shared_generation,
            completion_images=self._tool_images_anywhere(sampled),
        )  # fmt: skip
        self._old_and_reference_logps(batch, mode, timer)
        if self._corrects_vllm_sampling:
            self._vllm_importance_sampling(batch, mode)
        prompts = self._reward_prompts(sampled.inputs)
        if local_rewards is None:
            with timer("reward"):
                rewards_per_func = self._calculate_rewards(
                    sampled.inputs, prompts, sampled.completions, sampled.completion_ids
                )  # [N, F]
        else:
            rewards_per_func = self.accelerator.gather(local_rewards)  # [N, F], processes in order as TRL
        with timer("adv"):
            num_generations = self.num_generations if mode == "train" else self.num_generations_eval
            advantages, rewards, is_std_zero = group_advantages(
                rewards_per_func, self.reward_weights, num_generations, self.scale_rewards,
                self.multi_objective_aggregation,
            )  # [N] each  # fmt: skip
        n = len(sampled.inputs)
        batch["advantages"] = advantages[self.accelerator.process_index * n :][:n]  # [B], this process's rows
        self._log_rewards(mode, rewards_per_func, is_std_zero)
        self._log_rollout(mode, sampled.inputs, prompts, sampled.completions, rewards_per_func, advantages)
        if mode == "train":
            self._write_samples(sampled, rewards_per_func, advantages, num_generations, dropped)
            self._watch_signal(rewards, is_std_zero)
        return batch

    def _sample_rows(self, inputs: list[dict[str, Any]], mode: str, timer: PhaseTimer) -> Sampled:
        """Encode each distinct prompt once, sample one completion per row, decode; with tools, TRL's tool loop runs
        the calls and samples the next turns (see `tool_rollout`)."""
        rows = load_rows(inputs)
        tools = self._prepare_tools(inputs, rows)  # [B] each row's tools, or None without tools
        with timer("gen"):
            encoded = self._encode_prompts(rows, tools)
            shared_generation = self._sharing.shares_generation(
                *self._shape(encoded, self.max_completion_length)
            )
            if self.rollout_func is not None:
                encoded, completion_ids_list, sampling_logps_list, tool_mask = self._roll_out(
                    rows, inputs, encoded
                )
            else:
                completion_ids_list, sampling_logps_list = self._sample(
                    rows, encoded, mode, shared_generation
                )
                tool_mask = None
        completions = self.family.decode_completions(
            self.processing_class, completion_ids_list, [e.input_ids for e in encoded], tools
        )
        sampled = Sampled(
            inputs,
            encoded,
            completion_ids_list,
            sampling_logps_list,
            completions,
            shared_generation,
            tool_mask,
        )
        if self.tools:
            with timer("gen"):
                sampled = self._call_tools(rows, sampled, mode)
        return sampled

    def _roll_out(
        self, rows: list[dict[str, Any]], inputs: list[dict[str, Any]], encoded: list[EncodedPrompt]
    ) -> tuple[list[EncodedPrompt], list[list[int]], list[list[float]] | None, list[list[int]] | None]:
        """The user's `rollout_func`, as TRL calls it: `(encoded prompts, completion ids, sampling log-probs, env_mask)`.

        It gets the rows' multimodal prompts and the trainer, and returns `prompt_ids`, `completion_ids`, `logprobs`
        and any other fields, which reach the rewards as columns (`env_mask` masks tokens out of the loss, as TRL's
        tool mask). The prompt of a row with images must be the trainer's own encoding of it
        (`trainer.processing_class` through `apply_chat_template`, images expanded), so that its image inputs fit.
        """
        if (
            self.use_vllm and self.state.global_step != self._last_loaded_step
        ):  # rollout_funcs sample with vLLM
            with profiling_context(self, "sync_weights"):
                self.sync_vllm_weights()
            self._last_loaded_step = self.state.global_step
        prompts = [prepare_multimodal_messages(r["prompt"], images=r["images"]) for r in rows]
        output = self.rollout_func(copy.deepcopy(prompts), self)
        missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - output.keys())
        if missing:
            raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
        extra = {k: v for k, v in output.items() if k not in ("prompt_ids", "completion_ids", "logprobs")}
        tool_mask = extra.pop("env_mask", None)
        for i, x in enumerate(inputs):  # the rewards get the other fields as columns, as TRL merges them
            fields = {k: v[i] for k, v in extra.items() if isinstance(v, list) and i < len(v)}
            fields.update({k: v for k, v in extra.items() if not isinstance(v, list)})
            inputs[i] = {**x, **fields}  # new dicts: the dataset's rows stay as they are
        own = []
        for i, (ids, item) in enumerate(zip(output["prompt_ids"], encoded, strict=True)):
            if list(ids) == item.input_ids:
                own.append(item)
            elif item.num_images:
                raise VLMGRPOError(
                    f"rollout_func: row {i}'s prompt_ids ({len(ids)} tokens) are not the trainer's encoding of its "
                    f"prompt with its {item.num_images} image(s) ({len(item.input_ids)} tokens); render prompts with "
                    "trainer.processing_class.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True), "
                    "which expands the image placeholders."
                )
            else:  # a text-only row: the function's own ids
                own.append(EncodedPrompt(input_ids=list(ids), image_inputs={}, num_images=0))
        logps = output["logprobs"] if self.use_vllm else None
        return own, [list(c) for c in output["completion_ids"]], logps, tool_mask

    def _prepare_tools(self, inputs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[list] | None:
        """Each row's tools (None without tools), after drawing and resetting the rows' environments as TRL does
        (a `reset()` observation joins the row's prompt, in `rows` and `inputs`, for the rewards too), and the tool
        dicts TRL's tool loop reads."""
        self.environments = None
        if self.environment_factories is not None:
            names, self.environments = draw_environments(
                inputs, self.environment_factories, self._environment_pool, self._multi_environment
            )
            self._batch_environments = names
            prompts = reset_environments(
                [r["prompt"] for r in rows], self.environments, inputs, self._multi_environment
            )
            for i, prompt in enumerate(prompts):  # new dicts: the dataset's rows stay as they are, as in TRL
                rows[i] = {**rows[i], "prompt": prompt}
                inputs[i] = {**inputs[i], "prompt": prompt}
        if not self.tools:
            return None
        self._sync_tool_dicts, self._async_tool_dicts = tool_dicts(
            self._standalone_tools, self.environments, len(rows)
        )
        if self.environment_factories is not None:
            return [self._env_tools[name] for name in self._batch_environments]
        return [self.tools] * len(rows)

    def _call_tools(self, rows: list[dict[str, Any]], sampled: Sampled, mode: str) -> Sampled:
        """TRL's tool loop over the first turn: the calls run, their results join each row, the next turns are sampled
        (`_generate_single_turn`); `tools/*` metrics as TRL logs them."""
        prompts = [prepare_multimodal_messages(r["prompt"], images=r["images"]) for r in rows]
        images = [r["images"] or None for r in rows]
        logps = None if sampled.sampling_logps is None else [list(x) for x in sampled.sampling_logps]
        # where the next turns share each group's prompt (`SharingPolicy.shares_later_turns`): the batch's distinct
        # prompts, with their images
        self._turn_prompts = (
            [(e, r["images"]) for i, (e, r) in enumerate(zip(sampled.encoded, rows, strict=True))
             if i == 0 or e is not sampled.encoded[i - 1]]
            if self._sharing.shares_later_turns(sampled.shared_generation) else None
        )  # fmt: skip
        try:
            tool_mask, completions, completion_ids, logps, calls, failures, tool_images = self._tool_call_loop(
                prompts, [e.input_ids for e in sampled.encoded], [list(c) for c in sampled.completion_ids],
                sampled.completions, logps, images if any(images) else None, {},
            )  # fmt: skip
        finally:
            self._turn_prompts = None
        counts = (
            self.accelerator.gather(
                torch.tensor(
                    [calls, failures, len(rows)], dtype=torch.float32, device=self.accelerator.device
                )
            )
            .view(-1, 3)
            .sum(dim=0)
        )  # calls, failures, rows over every process
        for name, value in tool_metrics(*counts.tolist()).items():
            self._metrics[mode][name].append(value)
        unanswered = sum(bool(c[-1].get("tool_calls")) for c in completions)
        if unanswered and self.accelerator.is_main_process:
            logger.info(
                f"{unanswered} of {len(rows)} completions end on a tool call without its result: the result would have "
                f"passed max_completion_length ({self.max_completion_length}) or the model's context (rolled back, as "
                f"TRL does), or max_tool_calling_iterations was reached."
            )
        return replace(
            sampled, completion_ids=completion_ids, completions=completions, sampling_logps=logps,
            tool_mask=tool_mask, tool_images=tool_images,
        )  # fmt: skip

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        """The next turn of each row that called a tool, from its whole history (TRL's tool loop calls it with the
        ids of prompt, completion and tool results, and every image of the row: the prompt's, then the tools').

        vLLM samples as in TRL, from each row's ids as its mode takes them (`vllm_history_prompts`: one placeholder per
        image in colocate mode, where TRL hands them expanded). transformers' `generate` continues each group's
        prompt from one prefill of it when the batch's first turn did (`_continue_turns`), else runs on the family's
        inputs of each row.
        """
        if self.use_vllm:
            self._sync_vllm_when_stale()  # TRL's own sync would keep vLLM's encoder cache
            ids = vllm_history_prompts(self.family, self.processing_class, prompt_ids, self.vllm_mode)
            return super()._generate_single_turn(ids, images, {}, num_generations, has_tool_images)
        prompts = self._turn_prompts and history_prompts(prompt_ids, images, self._turn_prompts)
        if prompts:
            return self._continue_turns(prompt_ids, images, prompts), None
        device = self.accelerator.device
        encoded = []
        for ids, pictures in zip(prompt_ids, images or [None] * len(prompt_ids), strict=True):
            inputs = self.family.encode_images(self.processing_class, pictures) if pictures else {}
            inputs = {k: v.to(device) for k, v in inputs.items()}
            encoded.append(
                EncodedPrompt(input_ids=list(ids), image_inputs=inputs, num_images=len(pictures or []))
            )
        return self._sample_with_transformers(encoded, shared=False), None

    def _encode_prompts(
        self, rows: list[dict[str, Any]], tools: list[list] | None = None
    ) -> list[EncodedPrompt]:
        """Chat template + processor once per distinct prompt: consecutive rows of one group share one encoding.

        Rows for which `same_prompt` holds get the same `EncodedPrompt` object; the shared-prefix passes and the vLLM
        payload find groups by that identity. Image tensors are moved to the device once. With tools, each prompt
        renders its row's tool definitions, with TRL's chat template (a prefix-preserving one where needed).
        """
        encoded: list[EncodedPrompt] = []
        for i, row in enumerate(rows):
            if i > 0 and same_prompt(row, rows[i - 1]) and (tools is None or tools[i] == tools[i - 1]):
                encoded.append(encoded[-1])
                continue
            messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
            item = self.family.encode_prompt(
                self.processing_class, messages, row["images"], self._template_kwargs(tools and tools[i]),
                row["videos"],
            )  # fmt: skip
            self._check_context(item, row)
            item.image_inputs = {k: v.to(self.accelerator.device) for k, v in item.image_inputs.items()}
            encoded.append(item)
        return encoded

    def _template_kwargs(self, tools: list | None) -> dict[str, Any]:
        """`apply_chat_template`'s arguments for a prompt: TRL's `chat_template_kwargs`, and with tools, the tools and
        TRL's chat template (`tools=None` renders no tool section, as TRL passes `self.tools or None`)."""
        if not self.tools:
            return self.chat_template_kwargs
        return {**self.chat_template_kwargs, "tools": tools or None, "chat_template": self.chat_template}

    def _check_context(self, item: EncodedPrompt, row: dict[str, Any]) -> None:
        """A prompt plus its completion must fit the model's context; say why when images make it too long."""
        context = self.family.context_length(self.accelerator.unwrap_model(self.model).config)
        if context is None or len(item.input_ids) + self.max_completion_length <= context:
            return
        image_token_id = self.family.image_token_id(self.processing_class)
        image_tokens = sum(t == image_token_id for t in item.input_ids)
        raise VLMGRPOError(
            f"A prompt ({row['prompt']!r:.80}) has {len(item.input_ids)} tokens, {image_tokens} of them for its "
            f"{item.num_images} image(s); with max_completion_length {self.max_completion_length} it exceeds the "
            f"model's context of {context} tokens. Lower max_pixels (or max_tiles), use fewer images per prompt, "
            "or lower max_completion_length."
        )

    def _tool_images_anywhere(self, sampled: Sampled) -> bool:
        """Whether a tool returned an image to some row on some process: one collective, with tools on a family
        whose image tokens attend to each other (elsewhere a tool's image does not change the plan)."""
        if not (self.tools and self._sharing.bidirectional_images):
            return False
        return bool(self._across_processes(any(sampled.tool_images or ()), torch.any))

    def _shape(self, encoded: list[EncodedPrompt], completion_len: int) -> tuple:
        """`(P, C, group sizes, agree)`: what `SharingPolicy` decides from; `agree` asks every process."""
        prompt_len = max(len(e.input_ids) for e in encoded)
        return (
            prompt_len,
            completion_len,
            group_sizes(encoded),
            lambda local: bool(self._across_processes(local, torch.all)),
        )

    def _across_processes(self, value: float | bool, reduce: Callable[[torch.Tensor], torch.Tensor]) -> float:
        """`reduce` (`torch.min`, `max`, `sum`, `all`) of a number over every process; every process must call it."""
        gathered = self.accelerator.gather(torch.tensor([value], device=self.accelerator.device))
        return reduce(gathered).item()

    def _sample(
        self, rows: list[dict[str, Any]], encoded: list[EncodedPrompt], mode: str, shared: bool
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """One completion per row, cut after its first eos; with vLLM also the sampled tokens' log-probs.

        `shared`: `generate` continues each group from one prefill of its prompt (see `SharingPolicy`).
        """
        if self.use_vllm:
            num_generations = self.num_generations if mode == "train" else self.num_generations_eval
            return self._sample_with_vllm(rows, encoded, num_generations)
        return self._sample_with_transformers(encoded, shared), None

    def _sample_with_vllm(
        self, rows: list[dict[str, Any]], encoded: list[EncodedPrompt], num_generations: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample through TRL's vLLM backend: raw images, sampled video frames (colocate mode) and prompts with
        unexpanded placeholders."""
        self._sync_vllm_when_stale()
        payload = build_vllm_payload(
            self.processing_class, self.family, rows, encoded, self._template_kwargs(self.tools)
        )
        kwargs = vllm_generate_kwargs(
            payload, num_generations, self.vllm_mode, expanded_prompt_ids=[e.input_ids for e in encoded]
        )
        videos = self._vllm_videos.passing(payload.videos) if self._vllm_videos else nullcontext()
        with videos:
            vllm_prompt_ids, completion_ids, logprobs, _ = self.vllm_generation.generate(
                **kwargs, profiler=profiling_context(self, "vLLM.generate")
            )
        if self.vllm_mode == "colocate":
            check_vllm_prompts(vllm_prompt_ids, [e.input_ids for e in encoded])
        sampling_logps = [[lp[0] for lp in seq] for seq in logprobs]  # the sampled token's log-prob
        return [list(ids) for ids in completion_ids], sampling_logps

    def _sync_vllm_when_stale(self) -> None:
        """The weight sync once per optimizer step as in TRL, vLLM's encoder cache emptied too (`sync_vllm_weights`)."""
        if self.state.global_step != self._last_loaded_step:
            with profiling_context(self, "sync_weights"):
                self.sync_vllm_weights()
            self._last_loaded_step = self.state.global_step

    def sync_vllm_weights(self) -> None:
        """TRL's weight sync into vLLM, with the family's weight names and vLLM's encoder cache emptied."""
        vllm_generation.sync_weights(self.vllm_generation, self.vllm_mode, self.accelerator.is_main_process)

    def _sample_with_transformers(self, encoded: list[EncodedPrompt], shared: bool) -> list[list[int]]:
        """`generate` on the left-padded prompts; each group's prompt is prefilled once when the prefix is shared."""
        prompt_ids, prompt_mask = self._left_padded([e.input_ids for e in encoded])  # [B, P]
        image_inputs = [e.image_inputs for e in encoded]
        max_cache_len = self._fast.max_cache_len(prompt_ids.size(1), self.generation_config.max_new_tokens)
        with self._generating(image_inputs) as unwrapped_model:
            if shared or max_cache_len is not None:  # the rows continue from a cache prefilled here
                output = shared_prefix_generate(
                    unwrapped_model, self._base_model(unwrapped_model), self.family, prompt_ids, prompt_mask,
                    image_inputs, max_cache_len=max_cache_len, share=shared,
                    generation_config=self._fast_generation_config,
                )  # fmt: skip
            else:
                config = self.accelerator.unwrap_model(self.model).config
                inputs = self.family.model_inputs(config, prompt_ids, prompt_mask, image_inputs)
                output = unwrapped_model.generate(**inputs, generation_config=self.generation_config)
        return self._cut_completions(output[:, prompt_ids.size(1) :])

    def _continue_turns(
        self, histories: list[list[int]], images: list[list | None] | None, prompts: list[EncodedPrompt]
    ) -> list[list[int]]:
        """The next turn of multi-turn rows, each group's prompt prefilled once (see `shared_prefix_continue`): the
        rows' continuations (turns so far, tool results) and the tools' images run per row over the prompt's cache.

        Args:
            histories (`list[list[int]]`): the rows' ids, each starting with its prompt's.
            images (`list`, *optional*): each row's images, the prompt's then the tools'.
            prompts (`list[EncodedPrompt]`): the prompt each row starts with (`tool_rollout.history_prompts`).
        """
        returned = [  # the images each row's tools returned
            (pictures or [])[prompt.num_images :]
            for prompt, pictures in zip(prompts, images or [None] * len(prompts), strict=True)
        ]
        image_inputs = row_image_inputs(
            self.family, self.processing_class, prompts, returned, self.accelerator.device
        )
        prompt_ids, prompt_mask = self._left_padded([p.input_ids for p in prompts])  # [B, P]
        continuation_ids, continuation_mask = self._left_padded(
            [h[len(p.input_ids) :] for h, p in zip(histories, prompts, strict=True)]
        )  # [B, T]
        with self._generating(image_inputs) as unwrapped_model:
            output = shared_prefix_continue(
                unwrapped_model, self._base_model(unwrapped_model), self.family, prompt_ids, prompt_mask,
                continuation_ids, continuation_mask, image_inputs, generation_config=self.generation_config,
            )  # fmt: skip
        return self._cut_completions(output[:, prompt_ids.size(1) + continuation_ids.size(1) :])

    def _left_padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`(ids [B, L], mask [B, L])`: the rows left-padded as TRL pads prompts, on the device."""
        ids, mask = pad_rows(rows, self._tokenizer.pad_token_id, "left", self.pad_to_multiple_of)
        return ids.to(self.accelerator.device), mask.to(self.accelerator.device)

    @contextmanager
    def _generating(self, image_inputs: Sequence[dict]) -> Iterator[torch.nn.Module]:
        """The model to call `generate` on (ZeRO-3 parameters gathered as TRL does), without gradients, its stored
        image features reused."""
        with (
            profiling_context(self, "transformers.generate"),
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped_model,
            torch.no_grad(),
            self._reusing_image_features(unwrapped_model, image_inputs),
        ):
            yield unwrapped_model
        if self.args.gradient_checkpointing:  # TRL turned it off for generation and on again
            drop_repeated_input_grad_hooks(self.accelerator.unwrap_model(self.model_wrapped))

    def _cut_completions(self, sampled: torch.Tensor) -> list[list[int]]:
        """Each row's sampled tokens `[B, N]` up to and including its first eos."""
        completion_ids = sampled.cpu()  # [B, N]
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids))  # [B, N]
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, completion_ids.size(1))  # eos kept
        return [row[:n].tolist() for row, n in zip(completion_ids, lengths.tolist(), strict=True)]

    def _reusing_image_features(
        self, model: torch.nn.Module, image_inputs: Sequence[dict]
    ) -> AbstractContextManager:
        """While vision is frozen, `model` takes this generation batch's stored image features (else: nothing)."""
        if self._image_features is None:
            return nullcontext()
        return self._image_features.reuse(self._base_model(model), image_inputs)

    def _sample_dynamically(
        self, sampled: Sampled, timer: PhaseTimer
    ) -> tuple[Sampled, torch.Tensor, tuple[Sampled, torch.Tensor]]:
        """Replace the groups whose advantages are all zero by groups of fresh prompts (see `dynamic_sampling`).

        Returns this process's rows to train on and their rewards `[n, F]`, and the rows dropped with theirs. What
        the reward functions logged (`log_extra`, `log_metric`) is kept for the rows trained on only.
        """
        process, num_generations = self.accelerator.process_index, self.num_generations
        seen: set[str] = set()  # every process's prompts sampled in this generation batch

        def score(part: Sampled) -> Round:
            with timer("reward"):
                rewards = self._calculate_rewards(
                    part.inputs, self._reward_prompts(part.inputs), part.completions, part.completion_ids
                )  # [N, F], every process
            seen.update(gather_object(sorted({prompt_key(x) for x in part.inputs})))
            n = len(part.inputs)
            extra, logged = dict(self._pending_extra_logs), dict(self._pending_metrics)
            self._pending_extra_logs.clear()
            self._pending_metrics.clear()
            return Round(part.inputs, part, rewards[process * n : (process + 1) * n], extra, logged)

        def fresh(groups: int) -> Round:
            skip = lambda i: prompt_key(self.train_dataset[i]) in seen  # noqa: E731
            indices = self._prompt_stream.take(groups * self.accelerator.num_processes, skip)
            mine = indices[process * groups : (process + 1) * groups]
            rows = [self.train_dataset[i] for i in mine for _ in range(num_generations)]
            return score(self._sample_rows(rows, "train", timer))

        least, most, total = (
            (lambda n: int(self._across_processes(n, torch.min))),
            (lambda n: int(self._across_processes(n, torch.max))),
            (lambda n: int(self._across_processes(n, torch.sum))),
        )
        collected = self._dynamic.collect(score(sampled), fresh, least, most)
        needed = len(sampled.inputs) // num_generations
        runs = group_rows(self._dynamic.chosen(collected, needed, least, total), num_generations)
        if collected.note and self.accelerator.is_main_process:
            logger.info(collected.note)
        for name, value in dynamic_metrics(
            collected, lambda v: self._across_processes(float(v), torch.sum)
        ).items():
            self._metrics["train"][name].append(value)
        extra, logged = chosen_logs(runs)
        self._pending_extra_logs.update(extra)
        self._pending_metrics.update(logged)
        chosen, rewards, dropped = kept_and_dropped(collected, runs, num_generations)
        if self._image_features is not None:  # features of the dropped groups' images are not kept
            self._image_features.keep([e.image_inputs for e in chosen.encoded])
        return chosen, rewards, dropped

    def _log_lengths(
        self,
        mode: str,
        prompt_ids_list: list[list[int]],
        completion_ids_list: list[list[int]],
        tool_mask: list[list[int]] | None = None,
    ) -> None:
        """Token counts and completion-length metrics, as TRL logs them (with tools, the model's tokens only), plus
        length percentiles."""
        device, pad_id = self.accelerator.device, self._tokenizer.pad_token_id
        prompt_lengths = gather(torch.tensor([len(i) for i in prompt_ids_list], device=device))  # [N]
        counted = [len(i) for i in completion_ids_list] if tool_mask is None else [sum(m) for m in tool_mask]
        lengths = gather(torch.tensor(counted, device=device)).float()  # [N]
        truncated = [is_truncated(i, self.eos_token_ids, pad_id) for i in completion_ids_list]
        truncated = gather(torch.tensor(truncated, device=device))  # [N]
        total_tokens = int(prompt_lengths.sum().item() + lengths.sum().item())
        if mode == "train":
            self.state.num_input_tokens_seen += total_tokens
            self._step_tokens += total_tokens
        for name, value in length_metrics(prompt_lengths, lengths, truncated).items():
            self._metrics[mode][name].append(value)
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]

    def _pad_batch(self, sampled: Sampled) -> dict[str, Any]:
        """Padded `[B, P]` prompts and `[B, C]` completions with masks, as TRL pads them (see `rollout.pad_batch`);
        a row whose tools returned images gets image inputs of its own (see `tool_rollout.row_image_inputs`)."""
        device = self.accelerator.device
        batch = pad_batch(
            sampled.encoded, sampled.completion_ids, sampled.sampling_logps, self._tokenizer.pad_token_id,
            self.pad_to_multiple_of, self.eos_token_ids if self.mask_truncated_completions else None, device,
            sampled.tool_mask,
        )  # fmt: skip
        if any(sampled.tool_images or ()):
            batch["image_inputs"] = row_image_inputs(
                self.family, self.processing_class, sampled.encoded, sampled.tool_images, device
            )
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)  # [B, C]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return batch

    def _old_and_reference_logps(self, batch: dict[str, Any], mode: str, timer: PhaseTimer) -> None:
        """Add `old_per_token_logps` (when generation and updates are misaligned, or to correct vLLM's sampling) and
        `ref_per_token_logps` (beta > 0)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # [B, P+C]
        logits_to_keep = batch["completion_ids"].size(1)  # C
        size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        args = (input_ids, attention_mask, logits_to_keep, size, batch["image_inputs"], batch["sharing"])
        generate_every = self.args.steps_per_generation * self.num_iterations
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
        ):
            if self.args.gradient_accumulation_steps % generate_every != 0 or self._corrects_vllm_sampling:
                with timer("old_log_prob"):
                    batch["old_per_token_logps"] = self._policy_logps(self.model, *args)  # [B, C]
            if self.beta != 0.0:
                with timer("ref"):
                    batch["ref_per_token_logps"] = self._reference_logps(*args)  # [B, C]

    @property
    def _corrects_vllm_sampling(self) -> bool:
        """Whether vLLM's sampling log-probs weight the loss (`vllm_importance_sampling_correction`, as TRL)."""
        return self.use_vllm and self.vllm_importance_sampling_correction

    def _vllm_importance_sampling(self, batch: dict[str, Any], mode: str) -> None:
        """Add TRL's `importance_sampling_ratio` `[B, C]` (`[B, 1]` per sequence) and log its `sampling/*` metrics."""
        old, sampling = batch["old_per_token_logps"], batch["sampling_per_token_logps"]
        mask = batch["completion_mask"] * batch.get("tool_mask", 1)  # [B, C]: the model's tokens, as TRL
        mode_name = self.vllm_importance_sampling_mode
        ratio = importance_sampling_ratio(
            old, sampling, mask, mode_name, self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )  # fmt: skip
        batch["importance_sampling_ratio"] = ratio
        local = local_statistics(old, sampling, mask, ratio, mode_name)
        for name, value in sampling_metrics(
            {k: self.accelerator.gather(v) for k, v in local.items()}
        ).items():
            self._metrics[mode][name].append(value)

    def _policy_logps(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, image_inputs, sharing
    ) -> torch.Tensor:
        """`[B, C]` log-probs of `model` over a whole generation batch, in chunks of `batch_size` rows."""
        return self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size,
            image_inputs=image_inputs,
            sharing=sharing,
        )[0]

    def _reference_logps(self, *args) -> torch.Tensor:
        """The reference model's log-probs; with PEFT, the policy with its "ref" adapter (or no adapter), as TRL.

        Args are those of `_policy_logps` after the model.
        """
        if self.ref_model is not None:
            return self._policy_logps(self.ref_model, *args)
        unwrapped = self.accelerator.unwrap_model(self.model)
        with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
            return self._policy_logps(self.model, *args)

    @staticmethod
    def _reward_prompts(inputs: list[dict[str, Any]]) -> list[Any]:
        """The prompts reward functions receive: TRL's multimodal messages (images inside) when the batch has images."""
        prompts = [x["prompt"] for x in inputs]
        images = [row_images(x) for x in inputs]
        if not any(images):
            return prompts
        return [prepare_multimodal_messages(p, images=i) for p, i in zip(prompts, images, strict=True)]

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list) -> torch.Tensor:
        """TRL's rewards `[N, F]`, gathered; a reward that fails on one process stops every process with its message.

        Where the generation prompt opens the reasoning block (`<think>` at its end), the rewards also get
        `reasoning_opened=[True] * N`, with which the built-in ones read each completion with `<think>` in front.

        A failing reward returns None for the batch (see `guard_reward`), so that every process reaches TRL's gather
        instead of waiting in it for the one that raised; then all processes learn of the failure and raise it.
        """
        self._reward_failures.clear()
        if self._reasoning_opened:  # new row dicts: the batch's own stay as TRL's
            inputs = [{**x, REASONING_OPENED: True} for x in inputs]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        failures = [str(f) for f in gather_object([str(f) for f in self._reward_failures])]
        if self._reward_failures:
            raise self._reward_failures[0]
        if failures:
            raise RewardError(f"{failures[0]} (on another process)")
        return rewards_per_func

    def _log_rewards(self, mode: str, rewards_per_func: torch.Tensor, is_std_zero: torch.Tensor) -> None:
        """Each function's mean and std, and the weighted sum of raw rewards (NaN where none applies), as TRL logs."""
        metrics = reward_metrics(rewards_per_func, self.reward_weights, self.reward_func_names, is_std_zero)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def _log_rollout(self, mode, inputs, prompts, completions, rewards_per_func, advantages) -> None:
        """The completions table (TRL's `_logs`), the rewards' own `log_extra` columns and `log_metric` values."""
        self._logs["prompt"].extend(gather_object(prompts))
        self._logs["completion"].extend(gather_object(completions))
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(advantages.tolist())
        # Sorted keys: every process must gather the same names in the same order.
        for column in sorted(set(gather_object(list(self._pending_extra_logs)))):
            values = self._pending_extra_logs.get(column, [None] * len(prompts))
            self._logs["extra"][column].extend(gather_object(values))
        self._pending_extra_logs.clear()
        for name in sorted(set(gather_object(list(self._pending_metrics)))):
            values = self._pending_metrics.get(name, [])
            local = torch.tensor(
                [sum(values), len(values)], dtype=torch.float32, device=self.accelerator.device
            )
            total, count = self.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
            self._metrics[mode][name].append(total / count)
        self._pending_metrics.clear()
        if self.log_multimodal and ("images" in inputs[0] or "image" in inputs[0]):  # alike on every process
            self._logs["images"].extend(gather_object([row_images(x) or None for x in inputs]))

    def _write_samples(self, sampled, rewards_per_func, advantages, num_generations, dropped=None) -> None:
        """At step 1 and every `log_samples_steps` steps, write the step's groups to `output_dir/samples/` (see
        `rollout_log`); steps count from 1, as on the console."""
        every, step = (
            self.args.log_samples_steps,
            self.state.global_step + 1,
        )  # the step this rollout trains as
        if every and (step == 1 or step % every == 0):
            write_step_samples(
                self.args.output_dir, self.state.global_step, self.reward_func_names, sampled, rewards_per_func,
                advantages, num_generations, self.accelerator.is_main_process, dropped,
            )  # fmt: skip

    def _watch_signal(self, rewards: torch.Tensor, is_std_zero: torch.Tensor) -> None:
        """Warn (main process) when rollouts in a row had no learning signal (see `signal_watch`)."""
        warning = self._signal_watch.observe(
            frac_zero_std=is_std_zero.float().mean().item(),
            mean_reward=torch.nanmean(rewards).item(),
            all_zero=bool(torch.nan_to_num(rewards, nan=0.0).eq(0).all()),
            step=self.state.global_step + 1,
        )
        if warning and self.accelerator.is_main_process:
            logger.warning(warning)

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        image_inputs: Sequence[dict[str, torch.Tensor]] | None = None,
        sharing: SharingPlan | None = None,
        **trl_multimodal_kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-token log-probs `[B, C]` of the last `logits_to_keep` tokens, entropies and MoE aux loss.

        Image tensors come per sample (`image_inputs`) and the batch's `SharingPlan` says whether the pass shares each
        group's prompt; both default to those of the micro-batch being trained on (set by `_compute_loss`). TRL's flat
        keyword arguments (`pixel_values=...`) are never used and must be None.
        """
        stray = sorted(k for k, v in trl_multimodal_kwargs.items() if v is not None)
        if stray:
            raise RuntimeError(
                f"Unexpected flat multimodal inputs {stray}: VLMGRPOTrainer keeps them per sample."
            )
        active = self._active_inputs or {}
        image_inputs = active.get("image_inputs") if image_inputs is None else image_inputs
        sharing = active.get("sharing", FULL_ROWS) if sharing is None else sharing
        batch_size = batch_size or input_ids.size(0)
        shared = sharing.shares(builds_graph=torch.is_grad_enabled(), aux_loss=compute_aux_loss)
        all_logps, all_entropies, all_aux = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            logps, entropies, aux = self._chunk_logps(
                model, input_ids[rows], attention_mask[rows], logits_to_keep, image_inputs[rows], shared,
                compute_entropy, compute_aux_loss,
            )  # fmt: skip
            all_logps.append(logps)  # [b, C]
            all_entropies.append(entropies)
            all_aux.append(aux)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        aux_loss = torch.stack(all_aux).mean() if compute_aux_loss else None
        return torch.cat(all_logps, dim=0), entropies, aux_loss

    def _chunk_logps(
        self, model, ids, mask, logits_to_keep, image_inputs, shared, compute_entropy, compute_aux_loss
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Log-probs `[b, C]` (entropies, aux loss) of one chunk: shared prefix, or full rows scored by TRL's head.

        Under multi-process ZeRO-3 a chunk that lacks a kind of media (image, video) another process's chunk holds
        gets a dummy row of the kinds it lacks (see `vision_dummy`), unless vision is frozen: then no log-prob pass
        runs the vision tower on any process.
        """
        lacking = frozenset()
        if self._zero3_multi_process and self._image_features is None:
            lacking = media_needed(self.family, image_inputs, self.accelerator.device)
        dummy = bool(lacking)
        if dummy:
            if lacking not in self._vision_dummies:
                self._vision_dummies[lacking] = dummy_media_prompt(
                    self.family, self.processing_class, self.accelerator.device, lacking
                )
            ids, mask, image_inputs = add_dummy_row(
                ids,
                mask,
                logits_to_keep,
                image_inputs,
                self._vision_dummies[lacking],
                self._tokenizer.pad_token_id,
            )
        aux = None
        with self.accelerator.autocast(), self._reusing_image_features(model, image_inputs):
            if shared:
                logps, entropies = shared_prefix_logps(
                    model, self._base_model(model), self.family, ids, mask, logits_to_keep, image_inputs,
                    compute_entropy,
                )  # fmt: skip
            else:
                config = self.accelerator.unwrap_model(model).config
                inputs = self.family.model_inputs(config, ids, mask, image_inputs)
                if compute_aux_loss:
                    inputs["output_router_logits"] = True
                labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)  # [b, P+C]
                labels[:, :-logits_to_keep] = -100
                outputs = model(**inputs, labels=labels, fused_lm_head=True)
                logps = outputs.log_probs[:, -logits_to_keep:]  # [b, C]
                entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
                aux = outputs.aux_loss if compute_aux_loss else None
        if dummy:
            logps = drop_dummy_row(logps)
            entropies = drop_dummy_row(entropies) if compute_entropy else None
        return logps, entropies, aux

    def _base_model(self, model: torch.nn.Module) -> PreTrainedModel:
        """The transformers model under any DDP/DeepSpeed wrapper and PEFT adapter."""
        unwrapped = self.accelerator.unwrap_model(model)
        return unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped

    # ------------------------------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        """TRL's GRPO loss; the forward reads this micro-batch's per-sample image tensors and sharing plan."""
        self._active_inputs = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._active_inputs = None

    # ------------------------------------------------------------------------------------------ checkpoints
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """Load a checkpoint's weights through `from_pretrained`, which maps their key names (`load_weights_mapped`).

        DeepSpeed, FSDP and PEFT load their own way, as in transformers.
        """
        model = self.model if model is None else model
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or is_peft_model(model):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_weights_mapped(self.accelerator.unwrap_model(model), self.family, resume_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Load the optimizer and scheduler states as transformers does; to plain `cpu` in a multi-process CPU run."""
        plain = self.is_deepspeed_enabled or self.args.world_size == 1 or self.args.device.type != "cpu"
        if checkpoint is None or plain:
            return super()._load_optimizer_and_scheduler(checkpoint)
        load_optimizer_and_scheduler_to_cpu(self.optimizer, self.lr_scheduler, checkpoint)

    def _save_checkpoint(self, model, trial):
        """Save as transformers does, with the buffered rollout (see `rollout_buffer`), then mark the checkpoint
        complete once every process has written it.

        A write that fails (disk full, a read-only folder, a file-size limit) stops every process with one line
        naming the folder; the checkpoint is never marked complete, so resuming picks the previous complete one.
        """
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        failure = None
        try:
            super()._save_checkpoint(model, trial)
            inside = self._step % (self.args.steps_per_generation * self.num_iterations) != 0
            save_rollout(
                folder, self.accelerator.process_index, self._step, self._buffered_inputs if inside else None
            )
        except (OSError, RuntimeError, SafetensorError) as error:
            failure = checkpoint_write_error(folder, error)
            if failure is None:  # not a failed write: a bug, with its traceback
                raise
        failures = [f for f in gather_object([failure]) if f]
        if failures:
            raise VLMGRPOError(failures[0])
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            if self._prompt_stream is not None:  # where dynamic sampling's fresh prompts resume
                self._prompt_stream.save(folder)
            mark_complete(folder)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore the random states as transformers does, dynamic sampling's prompt stream, and the micro-step count
        and buffered rollout of a checkpoint taken inside a generation batch (see `rollout_buffer`)."""
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        if self._prompt_stream is not None:
            self._prompt_stream.load(checkpoint)
        step, buffered = load_rollout(checkpoint, self.accelerator.process_index, self.accelerator.device)
        if step is not None:
            self._step = step
        if buffered is not None:
            self._buffered_inputs = buffered
