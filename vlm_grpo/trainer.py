"""`VLMGRPOTrainer`: TRL's GRPO loop for vision-language models, with every model quirk delegated.

What this subclass changes, in the order a step runs:

1. `__init__`: loads the model and processor through the per-model module chosen by `config.model_type`,
   freezes the vision tower on request, aims LoRA at the language model only, and builds the reference model
   itself (from the path, or a copy of an in-memory model; with PEFT the adapter-disabled policy is the
   reference).
2. `_generate_and_score_completions`: each prompt is encoded once (chat template + processor) into ids and
   per-sample image tensors; completions are sampled with image/video placeholder tokens suppressed; old and
   reference log-probs, rewards and group advantages follow as in TRL.
3. `_compute_loss`: TRL's loss, with the forward inputs assembled by the module from the per-sample tensors.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import gather, gather_object, is_peft_model
from peft import LoraConfig, PeftConfig
from transformers import PreTrainedModel, ProcessorMixin
from trl import GRPOTrainer
from trl.data_utils import prepare_multimodal_messages
from trl.extras.profiling import profiling_context
from trl.models import prepare_deepspeed, unwrap_model_for_generation
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import (
    add_fused_lm_head,
    disable_dropout_in_model,
    get_callable_name,
    is_async_callable,
    nanstd,
    pad,
    split_tensor_dict,
    use_adapter,
)

from .adapters import resolve_lora_config
from .advantages import group_advantages
from .checkpoints import mark_complete
from .config import VLMGRPOConfig
from .models import EncodedPrompt, VLMModule, get_vlm_module
from .monitoring import PhaseTimer, length_stats, sample_records, step_metrics
from .reward_guard import guard_reward
from .samples import samples_path, write_samples
from .shared_prefix import shared_prefix_generate, shared_prefix_logps, shuffle_groups
from .vision_dummy import add_dummy_row, drop_dummy_row, dummy_image_prompt
from .vllm_payload import build_vllm_payload, row_images, vllm_generate_kwargs


def _same_example(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows hold the same prompt and pixel-identical images (consecutive rows of one group do)."""
    if a["prompt"] != b["prompt"]:
        return False
    images_a, images_b = row_images(a), row_images(b)
    return len(images_a) == len(images_b) and all(
        x is y or (x.size == y.size and x.mode == y.mode and x.tobytes() == y.tobytes())
        for x, y in zip(images_a, images_b, strict=True)
    )


def _image_names(example: dict[str, Any]) -> dict[str, list[str]]:
    """`{"image_paths": [...]}` from the row's images when the row has no `image_paths` column."""
    if "image_paths" in example:
        return {}
    return {"image_paths": [getattr(img, "filename", "") or "" for img in row_images(example)]}


def _guarded_rewards(reward_funcs: Any) -> list:
    """Wrap plain reward callables so failures name the reward and the record (see `reward_guard`)."""
    funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    return [
        guard_reward(f, get_callable_name(f))
        if callable(f) and not isinstance(f, (str, torch.nn.Module)) and not is_async_callable(f)
        else f
        for f in funcs
    ]


class VLMGRPOTrainer(GRPOTrainer):
    """GRPO for vision-language models. Arguments are those of `trl.GRPOTrainer`, with these differences:

    Args:
        model (`str | PreTrainedModel`): a model folder (or hub id), loaded by the family's module with
            `args.model_init_kwargs` (dtype, attn_implementation, quantization_config, ...), or a model in memory.
        args (`VLMGRPOConfig`): training options; see its docstring for the vision-specific ones.
        processing_class (`ProcessorMixin | None`): defaults to the family's processor with `args`' image limits.
        peft_config (`peft.LoraConfig | None`): LoRA; `target_modules=None` or `"all-linear"` means every linear
            layer of the language model, and the vision tower is never targeted.

    Not supported (a clear error is raised): tools, environments, a custom `rollout_func`, transformers
    continuous batching, and reward models given as paths (pass reward functions).
    """

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any = None,
        args: VLMGRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: ProcessorMixin | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: PeftConfig | None = None,
    ):
        if args is None:
            args = VLMGRPOConfig(output_dir="vlm-grpo-output")
        if not isinstance(args, VLMGRPOConfig):
            raise TypeError(f"args must be a VLMGRPOConfig, got {type(args).__name__}.")
        if args.use_transformers_continuous_batching:
            raise ValueError("use_transformers_continuous_batching does not support images; leave it off.")
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("VLMGRPOTrainer supports multi_objective_aggregation='sum_then_normalize' only.")
        if args.use_vllm and args.vllm_importance_sampling_correction:
            raise ValueError(
                "With use_vllm, VLMGRPOTrainer does not apply vLLM importance-sampling correction: set "
                "vllm_importance_sampling_correction: false."
            )
        module = get_vlm_module(model, trust_remote_code=args.trust_remote_code)

        model_path = model if isinstance(model, str) else None
        if model_path is not None:
            init_kwargs = dict(args.model_init_kwargs or {})
            if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
                init_kwargs["device_map"] = None
            init_kwargs = module.model_init_kwargs(
                **{**init_kwargs, "trust_remote_code": args.trust_remote_code}
            )
            model = module.load_model(model_path, **init_kwargs)
        if processing_class is None:
            source = model_path or model.config._name_or_path
            processing_class = module.load_processor(
                source, trust_remote_code=args.trust_remote_code, **args.image_size_kwargs()
            )

        # Reference model (beta > 0): TRL would rebuild it from `config._name_or_path`, which fails for a model that
        # exists only in memory. We build it ourselves after TRL's __init__ (see `_build_reference_model`).
        needs_ref = args.beta != 0.0 and peft_config is None and not is_peft_model(model)
        ref_model = None
        if needs_ref and model_path is None:
            ref_model = copy.deepcopy(model).eval()

        if args.freeze_vision_modules:
            for name, param in model.named_parameters():
                if module.is_vision_module(name):
                    param.requires_grad_(False)
        if isinstance(peft_config, LoraConfig):
            peft_config = resolve_lora_config(peft_config, model, module)
        reward_funcs = _guarded_rewards(reward_funcs)

        # TRL must neither build its own reference model nor re-read the load kwargs of a model already loaded.
        saved = args.beta, args.sync_ref_model, args.model_init_kwargs
        args.beta, args.sync_ref_model, args.model_init_kwargs = 0.0, False, None
        try:
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
            )
        finally:
            args.beta, args.sync_ref_model, args.model_init_kwargs = saved
        self.beta = args.beta
        self.vlm_module: VLMModule = module
        self._active_mm_inputs: Sequence[dict[str, torch.Tensor]] | None = None
        self._timer = PhaseTimer()
        self._step_seconds = 0.0
        self._step_tokens = 0
        self._check_dataset_size(train_dataset)
        # ZeRO-3 gathers each module's shards collectively: every process must run the vision tower in each forward
        self._zero3_multi_process = (
            self.is_deepspeed_enabled
            and self.accelerator.state.deepspeed_plugin.zero_stage == 3
            and self.accelerator.num_processes > 1
        )
        self._vision_dummy: EncodedPrompt | None = None
        if self.tools or self.environment_factories is not None or self.rollout_func is not None:
            raise ValueError("VLMGRPOTrainer does not support tools, environment_factory or rollout_func.")

        # Completions end on the family's eos tokens and never contain image/video placeholders.
        unwrapped = self.accelerator.unwrap_model(self.model)
        self.eos_token_ids = module.eos_token_ids(processing_class, unwrapped)
        self.placeholder_token_ids = module.placeholder_token_ids(processing_class, unwrapped.config)
        self.context_length = getattr(unwrapped.config.get_text_config(), "max_position_embeddings", None)
        if not self.use_vllm:
            self.generation_kwargs.update(
                eos_token_id=self.eos_token_ids, suppress_tokens=self.placeholder_token_ids
            )
            self.generation_config.eos_token_id = self.eos_token_ids
            self.generation_config.suppress_tokens = self.placeholder_token_ids

        if needs_ref:
            self.ref_model = self._build_reference_model(
                ref_model, model_path, module, init_kwargs if model_path else {}
            )
            if args.sync_ref_model:
                self.add_callback(
                    SyncRefModelCallback(ref_model=self.ref_model, accelerator=self.accelerator)
                )

    def _check_dataset_size(self, dataset: Any) -> None:
        """A dataset must fill at least one generation batch, or no training step can run."""
        if dataset is None or not hasattr(dataset, "__len__"):
            return
        needed = (
            self.args.generation_batch_size // self.num_generations
        )  # distinct prompts per generation batch
        if len(dataset) < needed:
            raise ValueError(
                f"The training dataset has {len(dataset)} prompts but one generation batch needs {needed} "
                f"(generation_batch_size {self.args.generation_batch_size} / num_generations "
                f"{self.num_generations}); add data or lower per_device_train_batch_size or steps_per_generation."
            )

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

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """Load a checkpoint's weights through `from_pretrained`, which maps their key names.

        transformers 5.23 saves VLM weights under the checkpoint's original key names (e.g. `visual.*`), and
        `Trainer._load_from_checkpoint` loads them without that mapping: every weight is skipped with a warning
        and training silently resumes from the initial weights. DeepSpeed and PEFT load their own way.
        """
        model = self.model if model is None else model
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or is_peft_model(model):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        target = self.accelerator.unwrap_model(model)
        loaded = self.vlm_module.load_model(resume_from_checkpoint, dtype=target.dtype, device_map=None)
        missing, unexpected = target.load_state_dict(loaded.state_dict(), strict=False)
        if missing or unexpected:
            raise ValueError(
                f"Checkpoint {resume_from_checkpoint} does not match the model: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}; resume with the model and config that wrote it."
            )

    def _save_checkpoint(self, model, trial):
        """Save as transformers does, then mark the checkpoint complete once every process has written it."""
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            mark_complete(folder)

    # ------------------------------------------------------------------------------------------- reference
    def _build_reference_model(
        self, ref_model: PreTrainedModel | None, model_path: str | None, module: VLMModule, init_kwargs: dict
    ) -> torch.nn.Module:
        """Reference policy: a frozen copy of the initial model, prepared like the policy (ZeRO-3 shards it)."""
        if ref_model is None:
            ref_model = module.load_model(model_path, **init_kwargs)
        ref_model.requires_grad_(False)
        if self.args.disable_dropout:
            disable_dropout_in_model(ref_model)
        add_fused_lm_head(
            ref_model, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32
        )
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(ref_model, self.accelerator)
        return self.accelerator.prepare_model(ref_model, evaluation_mode=True)

    # ------------------------------------------------------------------------------------------- encoding
    def _encode_examples(self, examples: list[dict[str, Any]]) -> list[EncodedPrompt]:
        """Chat template + processor once per distinct prompt (the G copies of a group share one encoding).

        Image tensors are moved to the device once. Returns one `EncodedPrompt` per row, copies sharing objects.
        """
        device = self.accelerator.device
        encoded: list[EncodedPrompt] = []
        for i, example in enumerate(examples):
            if i > 0 and _same_example(example, examples[i - 1]):
                encoded.append(encoded[-1])
                continue
            images = row_images(example)
            messages = prepare_multimodal_messages(example["prompt"], images=images)
            item = self.vlm_module.encode_prompt(self.processing_class, messages, images)
            self._check_context(item, example)
            item.mm = {k: v.to(device) for k, v in item.mm.items()}
            encoded.append(item)
        return encoded

    def _check_context(self, item: EncodedPrompt, example: dict[str, Any]) -> None:
        """A prompt plus its completion must fit the model's context; say why when images make it too long."""
        if (
            self.context_length is None
            or len(item.input_ids) + self.max_completion_length <= self.context_length
        ):
            return
        image_token_id = self.accelerator.unwrap_model(self.model).config.image_token_id
        image_tokens = sum(t == image_token_id for t in item.input_ids)
        where = example.get("image_paths") or example.get("id") or example.get("solution")
        raise ValueError(
            f"A prompt ({where!r}) has {len(item.input_ids)} tokens, {image_tokens} of them for its "
            f"{item.num_images} image(s); with max_completion_length {self.max_completion_length} it exceeds the "
            f"model's context of {self.context_length} tokens. Lower max_pixels (or max_tiles), use fewer images "
            "per prompt, or lower max_completion_length."
        )

    def _base_model(self, model: torch.nn.Module) -> PreTrainedModel:
        """The transformers model under any DDP/DeepSpeed wrapper and PEFT adapter."""
        unwrapped = self.accelerator.unwrap_model(model)
        return unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped

    def _shares_prefix(self, compute_aux_loss: bool = False) -> bool:
        """Whether this pass runs each group's prompt once (see `shared_prefix`).

        Reentrant gradient checkpointing detaches what a layer writes to the KV cache, so a forward that builds a
        graph under it runs full rows instead (the transformers default is non-reentrant).
        """
        if not self.args.share_prompt_prefix or compute_aux_loss:
            return False
        if torch.is_grad_enabled() and self.args.gradient_checkpointing:
            return not (self.args.gradient_checkpointing_kwargs or {}).get("use_reentrant", False)
        return True

    def _model_inputs(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mm_list: Sequence[dict],
    ) -> dict[str, torch.Tensor]:
        config = self.accelerator.unwrap_model(model).config
        return self.vlm_module.model_inputs(config, input_ids, attention_mask, mm_list)

    # ----------------------------------------------------------------------------------------- generation
    def _vllm_completions(
        self, rows: list[dict[str, Any]], prompt_ids_list: list[list[int]], num_generations: int
    ) -> list[list[int]]:
        """Sample through TRL's vLLM backend: raw images and prompts with unexpanded image placeholders."""
        if self.state.global_step != self._last_loaded_step:
            with profiling_context(self, "sync_weights"):
                self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        payload = build_vllm_payload(self.processing_class, rows)
        kwargs = vllm_generate_kwargs(
            payload, num_generations, self.vllm_mode, expanded_prompt_ids=prompt_ids_list
        )
        _, completion_ids, _, _ = self.vllm_generation.generate(
            **kwargs, profiler=profiling_context(self, "vLLM.generate")
        )
        return [list(ids) for ids in completion_ids]

    def _sample_completions(self, prompt_ids_list: list[list[int]], mm_list: list[dict]) -> list[list[int]]:
        """Sample one completion per prompt row (rows already repeat each prompt G times); ids up to first eos."""
        device = self.accelerator.device
        prompt_ids = pad([torch.tensor(ids) for ids in prompt_ids_list], self._tokenizer.pad_token_id, "left")
        prompt_mask = pad([torch.ones(len(ids), dtype=torch.long) for ids in prompt_ids_list], 0, "left")
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
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
        ):
            if self._shares_prefix():
                output = shared_prefix_generate(
                    unwrapped_model,
                    self._base_model(unwrapped_model),
                    self.vlm_module,
                    prompt_ids,
                    prompt_mask,
                    mm_list,
                    generation_config=self.generation_config,
                )
            else:
                inputs = self._model_inputs(self.model, prompt_ids, prompt_mask, mm_list)
                output = unwrapped_model.generate(**inputs, generation_config=self.generation_config)
        completion_ids = output[:, prompt_ids.size(1) :].cpu()  # [B, C]
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids))
        lengths = torch.where(
            is_eos.any(1), is_eos.int().argmax(1) + 1, completion_ids.size(1)
        )  # keep the eos
        return [row[:n].tolist() for row, n in zip(completion_ids, lengths.tolist(), strict=True)]

    # ----------------------------------------------------------------------------------------- log-probs
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        mm_inputs: Sequence[dict[str, torch.Tensor]] | None = None,
        **trl_multimodal_kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-token log-probs `[B, C]` of the last `logits_to_keep` tokens, entropies and MoE aux loss.

        Multimodal inputs come per sample (`mm_inputs`, or the batch being trained on, set by `_compute_loss`);
        TRL's flat keyword arguments (`pixel_values=...`) are never used and must be None.
        """
        stray = sorted(k for k, v in trl_multimodal_kwargs.items() if v is not None)
        if stray:
            raise RuntimeError(
                f"Unexpected flat multimodal inputs {stray}: VLMGRPOTrainer keeps them per sample."
            )
        mm_inputs = self._active_mm_inputs if mm_inputs is None else mm_inputs
        batch_size = batch_size or input_ids.size(0)
        if self._shares_prefix(compute_aux_loss):
            return self._shared_prefix_logps(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, mm_inputs
            )
        all_logps, all_entropies, all_aux = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask, mm, dummy = self._chunk(
                input_ids, attention_mask, logits_to_keep, mm_inputs, start, end
            )
            inputs = self._model_inputs(model, ids, mask, mm)
            if compute_aux_loss:
                inputs["output_router_logits"] = True
            labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)  # [b, P+C]
            labels[:, :-logits_to_keep] = -100
            with self.accelerator.autocast():
                outputs = model(**inputs, labels=labels, fused_lm_head=True)
            logps = outputs.log_probs[:, -logits_to_keep:]  # [b, C]
            entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
            if dummy:
                logps = drop_dummy_row(logps)
                entropies = drop_dummy_row(entropies) if compute_entropy else None
            all_logps.append(logps)
            all_entropies.append(entropies)
            if compute_aux_loss:
                all_aux.append(outputs.aux_loss)
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        aux_loss = torch.stack(all_aux).mean() if compute_aux_loss else None
        return logps, entropies, aux_loss

    def _chunk(self, input_ids, attention_mask, logits_to_keep, mm_inputs, start, end):
        """Rows `start:end`; under multi-process ZeRO-3 a chunk without images gets a dummy image row appended.

        Returns `(input_ids, attention_mask, mm_list, has_dummy)`; see `vision_dummy` for why.
        """
        ids, mask, mm = input_ids[start:end], attention_mask[start:end], mm_inputs[start:end]
        if not self._zero3_multi_process or any(mm):
            return ids, mask, mm, False
        if self._vision_dummy is None:
            self._vision_dummy = dummy_image_prompt(
                self.vlm_module, self.processing_class, self.accelerator.device
            )
        pad_id = self._tokenizer.pad_token_id
        return (*add_dummy_row(ids, mask, logits_to_keep, mm, self._vision_dummy, pad_id), True)

    def _shared_prefix_logps(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, mm_inputs
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """`_get_per_token_logps_and_entropies` with each group's prompt run once per chunk of `batch_size` rows.

        Chunks start every `batch_size` rows, as in the unshared path, so every process runs the same number of
        forwards (ZeRO-3 gathers parameters collectively in each). Rows are grouped (see `_prepare_inputs`), so a
        chunk holds whole groups whenever the group size divides `batch_size`; a cut group is simply computed once
        in each chunk it spans.
        """
        base_model = self._base_model(model)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask, mm, dummy = self._chunk(
                input_ids, attention_mask, logits_to_keep, mm_inputs, start, end
            )
            with self.accelerator.autocast():
                logps, entropies = shared_prefix_logps(
                    model, base_model, self.vlm_module, ids, mask, logits_to_keep, mm, compute_entropy
                )
            if dummy:
                logps = drop_dummy_row(logps)
                entropies = drop_dummy_row(entropies) if compute_entropy else None
            all_logps.append(logps)  # [b, C]
            all_entropies.append(entropies)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        return torch.cat(all_logps, dim=0), entropies, None

    def _prepare_inputs(self, generation_batch):
        """TRL's buffering of a generation batch, but shuffled by whole groups so that micro-batches keep them.

        A micro-batch then holds complete groups whenever group sizes divide it, and each group's prompt is computed
        once per pass (see `shared_prefix`). Evaluation is unchanged.
        """
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = shuffle_groups(self._generate_and_score_completions(generation_batch))
            self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        """TRL's GRPO loss; the forward reads this batch's per-sample image tensors."""
        self._active_mm_inputs = inputs["mm_inputs"]
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._active_mm_inputs = None

    def _reference_logps(self, input_ids, attention_mask, logits_to_keep, batch_size, mm_list):
        if self.ref_model is not None:
            return self._get_per_token_logps_and_entropies(
                self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size, mm_inputs=mm_list
            )[0]
        unwrapped = self.accelerator.unwrap_model(self.model)
        adapter = "ref" if "ref" in unwrapped.peft_config else None
        with use_adapter(unwrapped, adapter_name=adapter):
            return self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size, mm_inputs=mm_list
            )[0]

    # ------------------------------------------------------------------------------------------- rollout
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Encode, sample, score and compute advantages for one generation batch (rows repeat each prompt G times)."""
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        prompts = [x["prompt"] for x in inputs]
        timer = self._timer if mode == "train" else PhaseTimer()
        with timer("gen"):
            encoded = self._encode_examples(inputs)
            prompt_ids_list = [e.input_ids for e in encoded]
            mm_list = [e.mm for e in encoded]
            if self.use_vllm:
                num_generations = self.num_generations if mode == "train" else self.num_generations_eval
                completion_ids_list = self._vllm_completions(inputs, prompt_ids_list, num_generations)
            else:
                completion_ids_list = self._sample_completions(prompt_ids_list, mm_list)
        texts = self.processing_class.batch_decode(completion_ids_list, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        self._log_lengths(mode, prompt_ids_list, completion_ids_list)

        pad_id = self._tokenizer.pad_token_id
        prompt_ids = pad([torch.tensor(ids) for ids in prompt_ids_list], pad_id, "left").to(device)  # [B, P]
        prompt_mask = pad([torch.ones(len(ids), dtype=torch.long) for ids in prompt_ids_list], 0, "left").to(
            device
        )
        completion_ids = pad([torch.tensor(ids) for ids in completion_ids_list], pad_id, "right").to(
            device
        )  # [B, C]
        completion_mask = pad(
            [torch.ones(len(ids), dtype=torch.long) for ids in completion_ids_list], 0, "right"
        )
        completion_mask = completion_mask.to(device)
        if self.mask_truncated_completions:
            truncated = torch.tensor(
                [not ids or ids[-1] not in self.eos_token_ids for ids in completion_ids_list]
            )
            completion_mask = completion_mask * (~truncated).to(device).unsqueeze(1).int()
        num_items_in_batch = self.accelerator.gather(completion_mask.sum()).sum()

        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P+C]
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # [B, P+C]
        logits_to_keep = completion_ids.size(1)
        batch_size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )

        old_logps = ref_logps = None
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
        ):
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self.args.gradient_accumulation_steps % generate_every != 0:
                with timer("old_log_prob"):
                    old_logps = self._get_per_token_logps_and_entropies(
                        self.model, input_ids, attention_mask, logits_to_keep, batch_size, mm_inputs=mm_list
                    )[0]  # [B, C]
            if self.beta != 0.0:
                with timer("ref"):
                    ref_logps = self._reference_logps(
                        input_ids, attention_mask, logits_to_keep, batch_size, mm_list
                    )

        with timer("reward"):
            rewards_per_func = self._calculate_rewards(
                inputs, prompts, completions, completion_ids_list
            )  # [N, F]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        with timer("adv"):
            advantages, rewards, is_std_zero = group_advantages(
                rewards_per_func, self.reward_weights, num_generations, self.scale_rewards
            )
        all_advantages = advantages.clone()
        rank = self.accelerator.process_index
        advantages = advantages[rank * len(prompts) : (rank + 1) * len(prompts)]  # [B]
        self._log_rewards(mode, rewards_per_func, rewards, is_std_zero)
        self._logs["prompt"].extend(gather_object(prompts))
        self._logs["completion"].extend(gather_object(completions))
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(all_advantages.tolist())
        if mode == "train":
            self._write_samples(inputs, texts, rewards_per_func, all_advantages, num_generations)

        output = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": advantages,
            "num_items_in_batch": num_items_in_batch,
            "mm_inputs": mm_list,
        }
        if old_logps is not None:
            output["old_per_token_logps"] = old_logps
        if ref_logps is not None:
            output["ref_per_token_logps"] = ref_logps
        return output

    def _write_samples(self, inputs, texts, rewards_per_func, advantages, num_generations) -> None:
        """Every `log_samples_steps` steps, write the step's groups to `output_dir/samples/` (main process)."""
        every = self.args.log_samples_steps
        if not every or self.state.global_step % every != 0:
            return
        keep = ("prompt", "image_paths", "solution", "id")
        rows = gather_object([{k: x[k] for k in keep if k in x} | _image_names(x) for x in inputs])
        all_texts = gather_object(texts)
        if not self.accelerator.is_main_process:
            return
        rewards = {name: rewards_per_func[:, i].tolist() for i, name in enumerate(self.reward_func_names)}
        records = sample_records(
            self.state.global_step, rows, all_texts, rewards, advantages.tolist(), num_generations
        )
        write_samples(samples_path(self.args.output_dir, self.state.global_step), records)

    # ------------------------------------------------------------------------------------------- metrics
    def _log_lengths(
        self, mode: str, prompt_ids_list: list[list[int]], completion_ids_list: list[list[int]]
    ) -> None:
        device = self.accelerator.device
        prompt_lengths = gather(torch.tensor([len(i) for i in prompt_ids_list], device=device))
        lengths = gather(torch.tensor([len(i) for i in completion_ids_list], device=device)).float()
        truncated = gather(
            torch.tensor(
                [not i or i[-1] not in self.eos_token_ids for i in completion_ids_list], device=device
            )
        )
        total_tokens = int(prompt_lengths.sum().item() + lengths.sum().item())
        if mode == "train":
            self.state.num_input_tokens_seen += total_tokens
            self._step_tokens += total_tokens
        metrics = self._metrics[mode]
        stats = {
            **length_stats("prompt_length", prompt_lengths.tolist()),
            **length_stats("response_length", lengths.tolist()),
        }
        for name, value in stats.items():
            metrics[name].append(value)
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        metrics["completions/mean_length"].append(lengths.mean().item())
        metrics["completions/min_length"].append(lengths.min().item())
        metrics["completions/max_length"].append(lengths.max().item())
        metrics["completions/clipped_ratio"].append(truncated.float().mean().item())

    def _log_rewards(self, mode: str, rewards_per_func, rewards, is_std_zero) -> None:
        metrics = self._metrics[mode]
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[:, i]).item())
        metrics["reward"].append(torch.nanmean(rewards).item())
        metrics["reward_std"].append(nanstd(rewards).item())
        metrics["frac_reward_zero_std"].append(is_std_zero.float().mean().item())
