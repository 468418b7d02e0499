"""The one training entry point: parse config, load data, build rewards, load model, train, save.

Same arguments for every launcher:

    vlm-grpo train recipes/qwen2_5_vl_3b_rec.yaml --learning_rate 1e-6
    python -m vlm_grpo.train recipes/qwen2_5_vl_3b_rec.yaml --learning_rate 1e-6
    torchrun --nproc_per_node 8 -m vlm_grpo.train recipes/qwen2_5_vl_3b_rec.yaml --deepspeed local_scripts/zero3.json
    accelerate launch --config_file local_scripts/accelerate_zero3.yaml -m vlm_grpo.train recipes/...yaml

The YAML gives defaults for any field of `ScriptArguments`, `VLMGRPOConfig` and `VLMModelConfig`; flags override.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import TrlParser, get_peft_config

from .adapters import qlora_quantization_config
from .checkpoints import resolve_resume
from .config import VLMGRPOConfig, VLMModelConfig
from .data import load_data_config
from .errors import run_cli
from .rewards import build_rewards
from .trainer import VLMGRPOTrainer

logger = logging.getLogger("vlm_grpo")


@dataclass
class ScriptArguments:
    """What to train on.

    Parameters:
        data_config (`str`): YAML data config (see `vlm_grpo.data.load_data_config`).
        rewards (`list`, defaults to `["format"]`): reward names, dotted paths to the user's functions, or (in
            YAML) mappings `{name: iou, weight: 1.0, ...}`; extra keys are passed to the reward as options.
        eval_data_config (`str | None`): optional YAML data config for evaluation during training.
    """

    data_config: str | None = field(default=None, metadata={"help": "YAML data config to train on."})
    rewards: list[str] = field(
        default_factory=lambda: ["format"],
        metadata={"help": "Reward names or dotted paths; in YAML also {name, weight, options...} mappings."},
    )
    eval_data_config: str | None = field(default=None, metadata={"help": "YAML data config for evaluation."})


def model_init_kwargs(model_args: VLMModelConfig) -> dict[str, Any]:
    """`from_pretrained` keyword arguments from the model config (QLoRA: NF4 weights, bf16 compute)."""
    kwargs: dict[str, Any] = {"revision": model_args.model_revision, "dtype": model_args.dtype}
    if model_args.attn_implementation is not None:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if model_args.load_in_4bit:
        kwargs["quantization_config"] = qlora_quantization_config(
            torch.bfloat16, double_quant=model_args.use_bnb_nested_quant
        )
    elif model_args.load_in_8bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    return kwargs


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, VLMGRPOConfig, VLMModelConfig]:
    """Parse `[CONFIG.yaml] [--field value ...]`; a leading YAML path is the same as `--config CONFIG.yaml`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--config", argv[0], *argv[1:]]
    parser = TrlParser((ScriptArguments, VLMGRPOConfig, VLMModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    if script_args.data_config is None:
        raise ValueError(
            "data_config is required: set `data_config: path/to/data.yaml` in the training YAML."
        )
    if model_args.model_name_or_path is None:
        raise ValueError(
            "model_name_or_path is required: set it in the training YAML or pass --model_name_or_path."
        )
    return script_args, training_args, model_args


def init_deepspeed_comm(training_args: VLMGRPOConfig) -> None:
    """Register the launcher's process group with DeepSpeed's communication layer before any model is loaded.

    DeepSpeed reads the world size from its own backend object (`deepspeed.comm`), not from `torch.distributed`.
    On GPU, `TrainingArguments` creates the process group through `deepspeed.init_distributed`. With `use_cpu`,
    accelerate's `PartialState(cpu=True)` skips that branch and calls `torch.distributed.init_process_group`
    directly, so `deepspeed.comm` has no backend yet when `from_pretrained` enters `deepspeed.zero.Init` (ZeRO-3):
    its `DeepSpeedConfig` then falls back to world_size 1 and rejects the batch sizes that `TrainingArguments`
    computed for the real world size ("train_batch_size ... 4 != 2 * 1 * 1"). Here the existing group is wrapped
    (never a new one); a no-op without DeepSpeed, without a process group, or when DeepSpeed already has one.
    """
    if training_args.deepspeed_plugin is None:
        return
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    from deepspeed import comm as ds_comm

    if not ds_comm.is_initialized():
        ds_comm.init_distributed(
            dist_backend=torch.distributed.get_backend(),
            auto_mpi_discovery=False,
            timeout=training_args.ddp_timeout_delta,
        )


def run(
    script_args: ScriptArguments, training_args: VLMGRPOConfig, model_args: VLMModelConfig
) -> VLMGRPOTrainer:
    """Train with parsed arguments and save the model (or adapter) and processor to `output_dir`."""
    # Parsing built `training_args`, which set up the process group (its DeepSpeed config uses the world size);
    # DeepSpeed must see that group before the model is loaded under ZeRO-3.
    init_deepspeed_comm(training_args)
    train_dataset = load_data_config(script_args.data_config, seed=training_args.seed)
    eval_dataset = None
    if script_args.eval_data_config:
        eval_dataset = load_data_config(script_args.eval_data_config, seed=training_args.seed)
    reward_funcs, weights = build_rewards(script_args.rewards)
    training_args.reward_weights = weights
    training_args.model_init_kwargs = {
        **model_init_kwargs(model_args),
        **(training_args.model_init_kwargs or {}),
    }

    trainer = VLMGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(
        resume_from_checkpoint=resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    )
    trainer.save_state()
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(training_args.output_dir)
    return trainer


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo train`."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    run(*parse_args(argv))


if __name__ == "__main__":  # python -m vlm_grpo.train (torchrun): same arguments, same error reporting
    run_cli("train", main, sys.argv[1:])
