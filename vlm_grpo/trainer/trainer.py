"""`VLMGRPOTrainer`: TRL's GRPO step for vision-language models, with every model quirk delegated.

The file reads in the order a step runs, as TRL's `GRPOTrainer` does:

1. Construction: the per-model module (chosen by `config.model_type`) loads the model and processor; the vision
   tower is frozen on request and kept out of LoRA; TRL's own `__init__` runs; generation is configured so that
   image/video placeholder tokens are never sampled; the parts are built (`parts`): the rollout, the sharing
   policy, frozen vision's feature cache; the reference model is a frozen copy of the policy (`setup`).
2. `_prepare_inputs`: one generation batch is rolled out, shuffled by whole groups and cut into micro-batches.
3. `_generate_and_score_completions`: the rollout samples the batch (`vlm_grpo.rollout.Rollout.sample`); then the
   sharing plan, old and reference log-probs, rewards, group advantages, metrics.
4. Log-probs (`_get_per_token_logps_and_entropies`): one chunk loop; each chunk either runs each group's prompt
   once (shared prefix) or full rows (`logps`).
5. Loss: TRL's `_compute_loss`, reading this micro-batch's per-sample image tensors.
6. Checkpoints, with the buffered rollout (`checkpoints`, `rollout_buffer`).

Every `GRPOConfig` option behaves as in TRL 1.16 or is refused when the config is built (see `trl_options.py`).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import datasets
import torch
from accelerate.utils import gather, gather_object, is_peft_model
from peft import PeftConfig
from safetensors import SafetensorError
from transformers import GenerationConfig, PreTrainedModel, ProcessorMixin
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import split_tensor_dict, use_adapter

from ..advantages import group_advantages
from ..data.rows import GroupRows, reward_prompts
from ..errors import VLMGRPOError
from ..models import ModelFamily, get_model_family
from ..policy.lm_head import keep_embedding_dtype
from ..policy.shared_prefix import shuffle_batch
from ..policy.sharing_plan import FULL_ROWS, SharingPlan
from ..rewards.guard import RewardError
from ..rewards.text import REASONING_OPENED
from ..rollout.batch import Sampled, across_processes, pad_batch
from ..rollout.vllm.cpu import keep_linear_weights_plain
from ..rollout.vllm.cpu_transfer import install_client
from ..rollout.vllm.generation import release_process_groups
from ..rollout.vllm.payload import check_vllm_architecture, check_vllm_cpu_attention, warn_vllm_cpu_image_mask
from ..runtime.monitoring import PhaseTimer, step_metrics
from ..runtime.sample_log import samples_path
from ..runtime.signal_watch import SignalWatch
from ..runtime.step_samples import write_step_samples
from ..trl_options import check_tool_template, refuse_trainer_arguments
from . import parts
from . import setup as setup
from .checkpoints import (
    checkpoint_write_error,
    load_optimizer_and_scheduler_to_cpu,
    load_weights_mapped,
    mark_complete,
)
from .logps import LogProbPasses
from .metrics import lengths_of, log_completions, reward_metrics
from .rollout_buffer import load_rollout, save_rollout
from .vllm_correction import importance_sampling

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

    `tools`, `environment_factory` and `rollout_func` run as in TRL 1.16 (see `vlm_grpo.rollout.tools`): tools may
    return images, which join the row's images in order; a chat template that cannot render tool calls is refused in
    one line. The rollout itself is `self.rollout` (`vlm_grpo.rollout.Rollout`).
    """

    # ------------------------------------------------------------------------------------------ construction
    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any = None,
        args: Any = None,
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
        # filled by the guarded rewards, see `_calculate_rewards`; asynchronous rollouts score on their thread
        self._reward_failures: list[RewardError] = []
        self._rewards_lock = threading.RLock()
        reward_funcs = setup.reward_functions(reward_funcs, args, self._reward_failures)
        embedding_dtype = model.get_input_embeddings().weight.dtype
        rolls_out = bool(tools or environment_factory or rollout_func)
        setup.check_videos((train_dataset, eval_dataset), family, args, rolls_out)
        if tools or environment_factory:
            check_tool_template(processing_class)
            setup.check_tools(args, family, processing_class)
        if args.use_vllm:
            check_vllm_architecture(family)
            check_vllm_cpu_attention(family, model.config, args.device, model.name_or_path)
            warn_vllm_cpu_image_mask(family, model.config, args.device)
            if args.vllm_mode == "colocate":  # on a CPU, vLLM's packed weights could not take the weight sync
                keep_linear_weights_plain()
            else:  # on a CPU, the weights go to the server over gloo (NCCL needs CUDA)
                install_client()
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
        setup.check_dataset_size(train_dataset, args, self.num_generations)
        self._configure_generation()
        self._build_parts()
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

    def _build_parts(self) -> None:
        """The rollout and what decides each batch's passes, once TRL's `__init__` has run (see `parts`)."""
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
        self.image_features = parts.image_feature_cache(self)
        # the config `generate` runs with: TRL's, where unset filled from the model's own (None when vLLM samples)
        model = self.accelerator.unwrap_model(self.model)
        merged = None if self.use_vllm else model._prepare_generation_config(self.generation_config)[0]
        self._sharing = parts.sharing_policy(self, merged)
        if self._sharing.describe():
            logger.info(self._sharing.describe())
        fast = parts.fast_generation(self, merged)
        logger.info(fast.reason)
        dummy_rows = parts.zero3_processes(self)[1] and self.image_features is None
        self._logps = LogProbPasses(
            self.family, self.processing_class, self.accelerator, self.image_features, dummy_rows,
            self._tokenizer.pad_token_id,
        )  # fmt: skip
        self.rollout = parts.build_rollout(self, None if self.use_vllm else self.generation_config, fast)
        self._async = parts.async_rollouts(self, self.rollout)

    def _get_dataloader(self, dataset, description, batch_size, sampler_fn=None, is_training=False, **kwargs):
        """Transformers' loader, whose batches read and decode each of TRL's repeated prompts once (`GroupRows`)."""
        if isinstance(dataset, datasets.Dataset):
            dataset = GroupRows(self._remove_unused_columns(dataset, description))
        return super()._get_dataloader(dataset, description, batch_size, sampler_fn, is_training, **kwargs)

    def release_process_groups(self) -> None:
        """Destroy the process groups vLLM set up in colocate mode, through vLLM (see `shutdown.finish_processes`).

        Without vLLM in this process, a no-op.
        """
        if self.use_vllm and self.vllm_mode == "colocate":
            release_process_groups()

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
            self._log("train", metrics)
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

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Roll out, score and compute advantages for one generation batch (rows repeat each prompt G times)."""
        mode = "train" if self.model.training else "eval"
        rolled = self._roll_out(inputs, mode)
        if mode == "train" and self._async is None:  # sampled in the step (asynchronous: beside it)
            self._timer.add(rolled.seconds)
        self._log(mode, rolled.metrics)
        sampled = rolled.sampled
        self._log_lengths(mode, sampled)
        batch = self._pad_batch(sampled, rolled.image_inputs)
        batch["sharing"] = self._plan(sampled, batch["completion_ids"].size(1))
        self._old_and_reference_logps(batch, mode)
        if self._corrects_vllm_sampling:  # TRL's importance-sampling ratio, its `sampling/*` metrics
            ratio, metrics = importance_sampling(
                batch, self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max, self.accelerator.gather,
            )  # fmt: skip
            batch["importance_sampling_ratio"] = ratio  # [B, C], or [B, 1] per sequence
            self._log(mode, metrics)
        with self._rewards_lock:  # what the rewards log is read by `log_completions`
            rewards_per_func = self._batch_rewards(rolled, mode)  # [N, F]
            num_generations = self.num_generations if mode == "train" else self.num_generations_eval
            with self._timed("adv", mode):
                advantages, rewards, is_std_zero = group_advantages(
                    rewards_per_func, self.reward_weights, num_generations, self.scale_rewards,
                    self.multi_objective_aggregation,
                )  # [N] each  # fmt: skip
            n, names = len(sampled.inputs), self.reward_func_names
            batch["advantages"] = advantages[self.accelerator.process_index * n :][:n]  # [B]: its own rows
            self._log(mode, reward_metrics(rewards_per_func, self.reward_weights, names, is_std_zero))
            logged = log_completions(self, mode, sampled, rewards_per_func, advantages)  # `log_extra` columns
        if mode == "train":
            self._write_samples(rolled, rewards_per_func, advantages, num_generations, logged)
            self._watch_signal(rewards, is_std_zero, rolled.metrics.get("tools/call_frequency"))
        return batch

    def _roll_out(self, inputs: list[dict[str, Any]], mode: str) -> Any:
        """The rollout of a generation batch: sampled now, or with `async_rollouts` taken from the batches the server
        sampled while the previous ones trained (see `rollout.asynchronous`)."""
        step = self.state.global_step
        if self._async is None:
            return self.rollout.sample(inputs, mode, step)
        if mode == "eval":  # sampled now, between two of the thread's batches
            with self._async.lock:
                return self.rollout.sample(inputs, mode, self.rollout.vllm.version)
        if step % self.args.weight_sync_steps == 0:
            self._async.sync(step)
        if self.image_features is not None:
            self.image_features.clear()  # the previous batch's passes are done
        batch = self._async.take(inputs, step)
        self._log(mode, self._async.metrics())
        return batch

    def train(self, *args, **kwargs):
        """`Trainer.train`; with `async_rollouts`, the sampling thread is stopped when training ends or fails."""
        try:
            return super().train(*args, **kwargs)
        finally:
            if self._async is not None:
                self._async.close()

    def _timed(self, phase: str, mode: str):
        """Times `phase` of a training step (evaluation is not timed)."""
        return self._timer(phase) if mode == "train" else PhaseTimer()(phase)

    def _pad_batch(self, sampled: Sampled, image_inputs: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        """Padded `[B, P]` prompts and `[B, C]` completions with masks, as TRL pads them (see `rollout.pad_batch`),
        and each row's image inputs as the rollout made them."""
        batch = pad_batch(
            sampled.encoded, sampled.completion_ids, sampled.sampling_logps, self._tokenizer.pad_token_id,
            self.pad_to_multiple_of, self.eos_token_ids if self.mask_truncated_completions else None,
            self.accelerator.device, sampled.tool_mask, [bool(x) for x in sampled.tool_images or ()] or None,
        )  # fmt: skip
        batch["image_inputs"] = image_inputs
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)  # [B, C]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return batch

    def _plan(self, sampled: Sampled, width: int) -> SharingPlan:
        """The batch's `SharingPlan`: which log-prob passes share each group's prompt (agreed by every process)."""
        completion_images = False
        if self.tools and self._sharing.completion_images_need_full_rows():
            local = any(sampled.tool_images or ())
            completion_images = bool(across_processes(self.accelerator, local, torch.any))
        return self._sharing.plan(
            *self.rollout.shape(sampled.encoded, width), generation=sampled.shared_generation,
            completion_images=completion_images,
        )  # fmt: skip

    def _old_and_reference_logps(self, batch: dict[str, Any], mode: str) -> None:
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
                with self._timed("old_log_prob", mode):
                    batch["old_per_token_logps"] = self._policy_logps(self.model, *args)  # [B, C]
            if self.beta != 0.0:
                with self._timed("ref", mode):
                    batch["ref_per_token_logps"] = self._reference_logps(*args)  # [B, C]

    @property
    def _corrects_vllm_sampling(self) -> bool:
        """Whether vLLM's sampling log-probs weight the loss (`vllm_importance_sampling_correction`, as TRL)."""
        return self.use_vllm and self.vllm_importance_sampling_correction

    def _policy_logps(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, image_inputs, sharing
    ) -> torch.Tensor:
        """`[B, C]` log-probs of `model` over a whole generation batch, in chunks of `batch_size` rows."""
        return self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size, image_inputs=image_inputs, sharing=sharing,
        )[0]  # fmt: skip

    def _reference_logps(self, *args) -> torch.Tensor:
        """The reference model's log-probs; with PEFT, the policy with its "ref" adapter (or no adapter), as TRL.

        Args are those of `_policy_logps` after the model.
        """
        if self.ref_model is not None:
            return self._policy_logps(self.ref_model, *args)
        unwrapped = self.accelerator.unwrap_model(self.model)
        with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
            return self._policy_logps(self.model, *args)

    # ------------------------------------------------------------------------------------------ rewards
    def _score(self, sampled: Sampled, keep_logs: bool = False) -> tuple[torch.Tensor, dict, dict]:
        """The rewards `[N, F]` of every process's rows, with what the reward functions logged while scoring them.

        A row whose environment failed (its `reset()` raised) gets no reward (NaN, TRL's None), so that it does not
        train. The rollout calls it too, for dynamic sampling's rounds (every process calls it together).

        Args:
            sampled (`Sampled`): this process's rows.
            keep_logs (`bool`, defaults to False): leave the logged values pending for the completions table (the
                batch's own rows); else they are taken and returned.
        """
        with self._rewards_lock:
            self.environments = sampled.environments  # TRL hands the rows' environments to the rewards
            rewards = self._calculate_rewards(
                sampled.inputs, reward_prompts(sampled.inputs), sampled.completions, sampled.completion_ids
            )  # [N, F]
            if sampled.failures is not None:
                failed = torch.tensor([int(f is not None) for f in sampled.failures], device=rewards.device)
                rewards[gather(failed).bool()] = torch.nan  # [N, F]
            if keep_logs:
                return rewards, {}, {}
            extra, logged = dict(self._pending_extra_logs), dict(self._pending_metrics)
            self._pending_extra_logs.clear()
            self._pending_metrics.clear()
            return rewards, extra, logged

    def _batch_rewards(self, rolled: Any, mode: str) -> torch.Tensor:
        """The rewards `[N, F]` of a rolled-out batch: scored now, or by dynamic sampling's rounds already (what they
        logged is then handed on for the completions table)."""
        if rolled.rewards is None:
            with self._timed("reward", mode):
                return self._score(rolled.sampled, keep_logs=True)[0]  # [N, F]
        self._pending_extra_logs.update(rolled.reward_logs[0])
        self._pending_metrics.update(rolled.reward_logs[1])
        return rolled.rewards

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

    # ------------------------------------------------------------------------------------------ logs
    def _log_lengths(self, mode: str, sampled: Sampled) -> None:
        """Token counts and completion-length metrics, as TRL logs them (see `metrics.lengths_of`)."""
        pad_id, device = self._tokenizer.pad_token_id, self.accelerator.device
        tokens, metrics = lengths_of(
            sampled.encoded, sampled.completion_ids, sampled.tool_mask, self.eos_token_ids, pad_id, device
        )
        if mode == "train":
            self.state.num_input_tokens_seen += tokens
            self._step_tokens += tokens
        self._log(mode, metrics)
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]

    def _log(self, mode: str, metrics: dict[str, float]) -> None:
        """Append each metric's value for this step (TRL averages them over the logging steps)."""
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def _write_samples(self, rolled, rewards_per_func, advantages, num_generations, logged) -> None:
        """At step 1 and every `log_samples_steps` steps, write the step's groups to `output_dir/samples/` (see
        `runtime.sample_log`), with what the rewards logged of each row (`log_extra`: a judge's replies); steps count
        from 1, as on the console."""
        every, step = self.args.log_samples_steps, self.state.global_step + 1  # the step it trains as
        if every and (step == 1 or step % every == 0):
            write_step_samples(
                self.args.output_dir, self.state.global_step, self.reward_func_names, rolled.sampled,
                rewards_per_func, advantages, num_generations, self.accelerator.is_main_process, rolled.dropped,
                logged,
            )  # fmt: skip

    def _watch_signal(self, rewards: torch.Tensor, is_std_zero: torch.Tensor, calls: float | None) -> None:
        """Warn (main process) when rollouts in a row had no learning signal (see `signal_watch`)."""
        warning = self._signal_watch.observe(
            frac_zero_std=is_std_zero.float().mean().item(),
            mean_reward=torch.nanmean(rewards).item(),
            all_zero=bool(torch.nan_to_num(rewards, nan=0.0).eq(0).all()),
            step=self.state.global_step + 1,
            tool_call_frequency=calls,
        )
        if warning and self.accelerator.is_main_process:
            logger.warning(warning)

    # ------------------------------------------------------------------------------------------ log-probs and loss
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
            logps, entropies, aux = self._logps.chunk(
                model, input_ids[rows], attention_mask[rows], logits_to_keep, image_inputs[rows], shared,
                compute_entropy, compute_aux_loss,
            )  # fmt: skip
            all_logps.append(logps)  # [b, C]
            all_entropies.append(entropies)
            all_aux.append(aux)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        aux_loss = torch.stack(all_aux).mean() if compute_aux_loss else None
        return torch.cat(all_logps, dim=0), entropies, aux_loss

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
            if self.rollout.prompt_stream is not None:  # where dynamic sampling's fresh prompts resume
                self.rollout.prompt_stream.save(folder)
            mark_complete(folder)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore the random states as transformers does, dynamic sampling's prompt stream, and the micro-step count
        and buffered rollout of a checkpoint taken inside a generation batch (see `rollout_buffer`)."""
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        if self.rollout.prompt_stream is not None:
            self.rollout.prompt_stream.load(checkpoint)
        step, buffered = load_rollout(checkpoint, self.accelerator.process_index, self.accelerator.device)
        if step is not None:
            self._step = step
        if buffered is not None:
            self._buffered_inputs = buffered
