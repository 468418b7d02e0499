"""Every option of TRL's `GRPOConfig`, and what `VLMGRPOTrainer` does with it.

Each GRPO-specific field of `trl.GRPOConfig` (those it adds to `transformers.TrainingArguments`) is either
**honoured** (it behaves exactly as in TRL 1.16; the entry names the test that shows it) or **rejected** (a value
other than TRL's default is refused when `VLMGRPOConfig` is built, with one line saying what to do). The fields of
`TrainingArguments` are handled by `transformers.Trainer` unchanged, except those listed in `TRAINING_ARGUMENTS`.
`tests/test_trl_options.py` fails when TRL adds a field that is not classified here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import VLMGRPOError

PARITY = "tests/test_trl_parity.py::test_one_step_matches_trl"
"""The table-driven test: one GRPO step of stock `trl.GRPOTrainer` and of ours, same completions, loss, weights."""


@dataclass(frozen=True)
class Honoured:
    """The option behaves as in TRL 1.16; `test` is the test (file::name[case]) that shows it."""

    test: str


@dataclass(frozen=True)
class Rejected:
    """The option is refused when `applies(config)` holds; `message` says what to do instead."""

    applies: Callable[[Any], bool]
    message: str


def _parity(case: str) -> Honoured:
    return Honoured(f"{PARITY}[{case}]")


# Several micro-batches and iterations per rollout: three rollouts give stock TRL's completions, metrics and weights.
_ROLLOUTS = Honoured("tests/test_trl_parity.py::test_three_rollouts_match_trl")
_CONTINUOUS_BATCHING = (
    "use_transformers_continuous_batching does not support images (TRL refuses it for VLMs too); leave it off, or "
    "use use_vllm for fast generation."
)
_VLLM = Honoured("tests/test_vllm.py::test_weight_sync_reaches_vllm")
_VLLM_IS = Honoured("tests/test_vllm_correction.py::test_ratio_matches_trl")

GRPO_OPTIONS: dict[str, Honoured | Rejected] = {
    # model loading
    "model_init_kwargs": Honoured(
        "tests/test_trl_parity.py::test_reward_model_path_loads_with_model_init_kwargs"
    ),
    "trust_remote_code": Honoured("tests/test_bad_input.py::test_remote_code_model_needs_explicit_opt_in"),
    "router_aux_loss_coef": Honoured("tests/test_trl_parity.py::test_aux_loss_pass_runs_full_rows"),
    "disable_dropout": _parity("disable_dropout"),
    "cast_lm_head_to_fp32": Honoured(
        "tests/test_trl_parity.py::test_cast_lm_head_to_fp32_with_tied_embeddings"
    ),
    # batches and generation
    "num_generations": _parity("default"),
    "num_generations_eval": Honoured("tests/test_trl_parity.py::test_evaluation_uses_num_generations_eval"),
    "max_completion_length": _parity("mask_truncated"),
    "ds3_gather_for_generation": Honoured("tests/test_distributed.py::test_torchrun"),
    "shuffle_dataset": _parity("no_shuffle"),
    "pad_to_multiple_of": _parity("pad_to_multiple_of"),
    "generation_batch_size": _ROLLOUTS,
    "steps_per_generation": _ROLLOUTS,
    "temperature": _parity("sampling"),
    "top_p": _parity("sampling"),
    "top_k": _parity("sampling"),
    "min_p": _parity("sampling"),
    "repetition_penalty": _parity("sampling"),
    "generation_kwargs": Honoured("tests/test_shared_prefix.py::test_generation_options_that_need_full_rows"),
    "chat_template_kwargs": _parity("chat_template_kwargs"),
    "cache_implementation": Honoured(
        "tests/test_trl_parity.py::test_cache_implementation_with_shared_prefix"
    ),
    # vLLM (TRL's backend, see the vllm-marked tests)
    "use_vllm": _VLLM,
    "vllm_mode": _VLLM,
    "vllm_model_impl": _VLLM,
    "vllm_enable_sleep_mode": _VLLM,
    "vllm_structured_outputs_regex": _VLLM,
    "vllm_server_base_url": _VLLM,
    "vllm_server_host": _VLLM,
    "vllm_server_port": _VLLM,
    "vllm_server_timeout": _VLLM,
    "vllm_group_port": _VLLM,
    "vllm_gpu_memory_utilization": _VLLM,
    "vllm_max_model_length": _VLLM,
    "vllm_tensor_parallel_size": _VLLM,
    "vllm_importance_sampling_correction": _VLLM_IS,
    "vllm_importance_sampling_mode": _VLLM_IS,
    "vllm_importance_sampling_clip_max": _VLLM_IS,
    "vllm_importance_sampling_clip_min": _VLLM_IS,
    "vllm_importance_sampling_cap": _VLLM_IS,
    # loss
    "beta": _parity("beta"),
    "num_iterations": _ROLLOUTS,
    "epsilon": _parity("clipping"),
    "delta": _parity("clipping"),
    "epsilon_high": _parity("clipping"),
    "sapo_temperature_neg": _parity("sapo"),
    "sapo_temperature_pos": _parity("sapo"),
    "vespo_k_pos": _parity("vespo"),
    "vespo_lambda_pos": _parity("vespo"),
    "vespo_k_neg": _parity("vespo"),
    "vespo_lambda_neg": _parity("vespo"),
    "importance_sampling_level": _parity("sequence_level"),
    "reward_weights": _parity("normalize_then_sum"),
    "multi_objective_aggregation": _parity("normalize_then_sum"),
    "scale_rewards": _parity("scale_batch"),
    "loss_type": _parity("grpo"),
    "mask_truncated_completions": _parity("mask_truncated"),
    "sync_ref_model": Honoured("tests/test_trl_parity.py::test_sync_ref_model_checks_as_trl"),
    "ref_model_mixup_alpha": Honoured("tests/test_trl_parity.py::test_sync_ref_model_checks_as_trl"),
    "ref_model_sync_steps": Honoured("tests/test_trl_parity.py::test_sync_ref_model_checks_as_trl"),
    "top_entropy_quantile": _parity("entropy"),
    "entropy_coef": _parity("entropy"),
    "use_adaptive_entropy": _parity("adaptive_entropy"),
    "entropy_coef_min": _parity("adaptive_entropy"),
    "entropy_coef_max": _parity("adaptive_entropy"),
    "entropy_coef_delta": _parity("adaptive_entropy"),
    "entropy_target": _parity("adaptive_entropy"),
    "off_policy_mask_threshold": Honoured("tests/test_trl_parity.py::test_off_policy_mask_uses_old_logps"),
    "use_bias_correction_kl": _parity("beta"),
    # logging
    "log_completions": _parity("log_completions"),
    "log_multimodal": Honoured("tests/test_trl_parity.py::test_log_multimodal_records_images"),
    "num_completions_to_print": _parity("log_completions"),
    "log_unique_prompts": _parity("log_completions"),
    "log_completions_hub_repo": Rejected(
        lambda c: c.log_completions_hub_repo is not None,
        "log_completions_hub_repo pushes to the Hugging Face Hub, which vlm_grpo does not reach; remove it and "
        "read the completions from the logs or output_dir/samples.",
    ),
    # multi-turn and continuous batching
    "max_tool_calling_iterations": Honoured("tests/test_tools.py::test_tool_rollouts_match_trl"),
    "use_transformers_continuous_batching": Rejected(
        # TRL turns it on for `use_transformers_paged`, which is refused in its own words below
        lambda c: c.use_transformers_continuous_batching and not c.use_transformers_paged,
        _CONTINUOUS_BATCHING,
    ),
    "transformers_continuous_batching_config": Rejected(
        lambda c: c.transformers_continuous_batching_config is not None,
        "transformers_continuous_batching_config applies to continuous batching, which does not support images; "
        "remove it.",
    ),
    "use_transformers_paged": Rejected(
        lambda c: bool(c.use_transformers_paged),
        "use_transformers_paged (paged, continuously batched generation) does not support images; remove it, or "
        "use use_vllm for fast generation.",
    ),
}

TRAINING_ARGUMENTS: dict[str, Honoured | Rejected] = {
    "fsdp": Rejected(
        lambda c: bool(c.fsdp),
        "FSDP is not supported by VLMGRPOTrainer yet; use DeepSpeed ZeRO-3 (--deepspeed local_scripts/zero3.json).",
    ),
    "fsdp_config": Rejected(
        lambda c: bool(c.fsdp),
        "FSDP is not supported by VLMGRPOTrainer yet; use DeepSpeed ZeRO-3 (--deepspeed local_scripts/zero3.json).",
    ),
}
"""`TrainingArguments` fields this project treats otherwise than `transformers.Trainer`; all others are Trainer's."""


GENERATION_KWARGS: dict[str, Rejected] = {
    "num_return_sequences": Rejected(
        lambda kwargs: (kwargs.get("num_return_sequences") or 1) > 1,
        "generation_kwargs num_return_sequences > 1 would sample more rows than the batch holds (TRL fails on it "
        "too); GRPO samples num_generations completions per prompt: set num_generations instead.",
    ),
}
"""Values inside `generation_kwargs` that are refused; every other key is passed to `generate` as TRL passes it."""


def refused_options(config: Any) -> list[str]:
    """Messages of the rejected options that `config` sets, one per option (empty when none is set)."""
    table = {**GRPO_OPTIONS, **TRAINING_ARGUMENTS}
    messages = [
        entry.message for entry in table.values() if isinstance(entry, Rejected) and entry.applies(config)
    ]
    kwargs = config.generation_kwargs or {}
    messages += [entry.message for entry in GENERATION_KWARGS.values() if entry.applies(kwargs)]
    return list(dict.fromkeys(messages))


def rejected_option_names() -> list[str]:
    """Names of the options that can be refused, for the README's short list."""
    table = {**GRPO_OPTIONS, **TRAINING_ARGUMENTS}
    return [name for name, entry in table.items() if isinstance(entry, Rejected)]


TOOL_TEMPLATE_MESSAGE = (
    "tools and environment_factory need a chat template that renders a tool-calling conversation (user, assistant "
    "with tool_calls, tool), as the published Qwen3-VL, Qwen3.5 and Gemma 4 templates do and the Qwen2-VL, "
    "Qwen2.5-VL and Gemma 3 ones do not; use such a model, or pass a processing_class with such a chat template."
)
"""The one-line refusal of a chat template that cannot render tool calls (TRL's `supports_tool_calling`)."""


def check_tool_template(processing_class: Any) -> None:
    """Refuse, in one line, tools on a processor whose chat template cannot render a tool-calling conversation.

    Stock TRL refuses the same templates (`trl.chat_template_utils.supports_tool_calling`), with a longer message.

    Args:
        processing_class (`ProcessorMixin`): the processor the trainer renders prompts with.
    """
    from trl.chat_template_utils import supports_tool_calling

    if not supports_tool_calling(processing_class):
        raise VLMGRPOError(TOOL_TEMPLATE_MESSAGE)


def refuse_trainer_arguments(args: Any, uses_peft: bool) -> None:
    """Refuse, in one line each, the trainer arguments and combinations this trainer cannot run.

    Args:
        args (`VLMGRPOConfig`): the training options.
        uses_peft (`bool`): whether the policy trains a PEFT adapter (a `peft_config`, or a PEFT model given).
    """
    if args.sync_ref_model and uses_peft:
        raise VLMGRPOError(
            "sync_ref_model with PEFT: the reference is the policy with its adapter disabled, there is no "
            "reference model to sync (as in TRL); set sync_ref_model: false or train without PEFT."
        )
