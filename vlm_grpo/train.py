"""The one training entry point: parse config, load data, build rewards, load model, train, save.

Same arguments for every launcher:

    vlm-grpo train recipes/qwen2_5_vl_3b_rec.yaml --learning_rate 1e-6
    python -m vlm_grpo.train recipes/qwen2_5_vl_3b_rec.yaml --learning_rate 1e-6
    torchrun --nproc_per_node 8 -m vlm_grpo.train recipes/qwen2_5_vl_3b_rec.yaml --deepspeed local_scripts/zero3.json
    accelerate launch --config_file local_scripts/accelerate_zero3.yaml -m vlm_grpo.train recipes/...yaml

The YAML gives defaults for any field of `ScriptArguments`, `VLMGRPOConfig` and `VLMModelConfig`; flags override.
A key or flag that names no field is an error, reported before any other check, with the closest valid name.

Exit status: 0 when training finished, 1 on bad input (one line, see `vlm_grpo.errors`), 75 (`EXIT_PREEMPTED`)
when SIGTERM or SIGUSR1 stopped the run after a complete checkpoint (resume with `--resume_from_checkpoint true`;
see `vlm_grpo.runtime.preemption`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cli.option_help import read_options, short_help
from .cli.options import (
    USAGE,
    ScriptArguments,
    build_parser,
    check_config_keys,
    check_flags,
    check_model_path,
    parser_options,
    read_config,
)
from .dotted import import_dotted
from .errors import EXIT_USER_ERROR, VLMGRPOError, one_line, run_cli
from .rewards import build_rewards, connect_rewards
from .trainer.checkpoints import checkpoint_step, resolve_resume

if TYPE_CHECKING:  # torch, TRL and transformers are imported when a command needs them (see `parse_args`)
    from .config import VLMGRPOConfig, VLMModelConfig
    from .trainer.trainer import VLMGRPOTrainer

logger = logging.getLogger("vlm_grpo")

"""Keys of a training YAML that are no option: `env` sets environment variables (as `trl.TrlParser` does)."""


def model_init_kwargs(model_args: VLMModelConfig) -> dict[str, Any]:
    """`from_pretrained` keyword arguments from the model config (QLoRA: NF4 weights, bf16 compute)."""
    import torch

    from .policy.adapters import qlora_quantization_config

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
    """Parse `CONFIG.yaml [--option value ...]` (`--config CONFIG.yaml` works too) into the three configs.

    Unknown keys and flags, YAML errors and reward-entry keys are checked first; TRL's and transformers'
    validation of the values then runs, and its errors are re-raised as `VLMGRPOError` naming the config.

    Raises:
        SystemExit: no arguments (the usage is printed; status 1 under `vlm-grpo`).
        VLMGRPOError: any of the errors above, no `data_config` / `model_name_or_path`, or, with `use_vllm` on a
            CPU, a model whose head dims vLLM's CPU backend cannot run.
    """
    early = read_early(argv)
    parser = build_parser()
    _check_inputs(early, parser_options(parser))
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(args=early.argv)
    except VLMGRPOError:
        raise
    except ValueError as error:  # TRL's and transformers' validation of the options' values
        raise VLMGRPOError(f"{early.config_path or 'command line'}: {one_line(error)}") from error
    if script_args.data_config is None:
        raise VLMGRPOError(
            "data_config is required: set `data_config: path/to/data.yaml` in the training YAML."
        )
    if model_args.model_name_or_path is None:
        raise VLMGRPOError(
            "model_name_or_path is required: set it in the training YAML or pass --model_name_or_path."
        )
    if training_args.use_vllm:
        check_vllm_model(model_args, training_args)
    return script_args, training_args, model_args


def check_vllm_model(model_args: VLMModelConfig, training_args: VLMGRPOConfig) -> None:
    """With `use_vllm` on a CPU, refuse a local model whose head dims vLLM's CPU backend cannot run, before anything
    loads (`vlm_grpo.rollout.vllm.payload.check_vllm_cpu_attention`). A hub id is left to vLLM: published checkpoints use
    head dims it runs, and reading their config here would mean a download before the other checks."""
    from transformers import AutoConfig

    from .models import get_model_family
    from .rollout.vllm.payload import check_vllm_cpu_attention

    path = Path(model_args.model_name_or_path)
    if (path / "config.json").is_file():
        config = AutoConfig.from_pretrained(path, trust_remote_code=training_args.trust_remote_code)
        check_vllm_cpu_attention(get_model_family(config), config, training_args.device, str(path))


@dataclass
class Early:
    """A command line as read before any heavy import: the YAML, the flags after it, and lookups in both.

    Attributes:
        argv (`list[str]`): the arguments, with `--config` before the YAML path.
        config_path (`str | None`): the training YAML.
        config (`dict`): its contents.
        rest (`list[str]`): the flags.
    """

    argv: list[str]
    config_path: str | None
    config: dict[str, Any]
    rest: list[str]

    def value(self, key: str, default: Any = None) -> Any:
        """The option's value as the parser will see it: its flag, else the YAML, else `default`."""
        flag = f"--{key}"
        if flag in self.rest[:-1]:
            return self.rest[self.rest.index(flag) + 1]
        return self.config.get(key, default)

    def where(self, key: str) -> str:
        """Where the option's value comes from, for a message: `CONFIG.yaml: key`, or `--key` on the command line."""
        if self.config_path is not None and f"--{key}" not in self.rest:
            return f"{self.config_path}: {key}"
        return f"--{key}"


def read_early(argv: list[str] | None) -> Early:
    """Read the YAML and flags, print the help or the usage, and check every input that needs no heavy import.

    The options come from `vlm_grpo.cli.option_help.read_options` (read from the source in milliseconds); only when it
    cannot read them does `--help` build the real parser, and the key and flag checks wait for `parse_args`.

    Raises:
        SystemExit: `--help` (status 0), `--help-all` (status 0) or no arguments (the usage; status 1).
        VLMGRPOError: a missing or malformed YAML, an unknown key or flag, or a bad reward.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv or "--help-all" in argv:
        options = read_options() or parser_options(build_parser())
        print(short_help(options, USAGE, every="--help-all" in argv))
        raise SystemExit(0)
    if not argv:
        print(
            f"usage: {USAGE}\nvlm-grpo train: error: give a training config (--help lists the options)",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_USER_ERROR)
    if not argv[0].startswith("-"):
        argv = ["--config", argv[0], *argv[1:]]
    config_path = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    rest = [a for i, a in enumerate(argv) if a != "--config" and (i == 0 or argv[i - 1] != "--config")]
    early = Early(argv, config_path, read_config(config_path) if config_path is not None else {}, rest)
    options = read_options()
    if options is not None:  # every check that needs no heavy import, within a second
        _check_inputs(early, options)
    return early


def check_model(early: Early) -> None:
    """Refuse a `model_name_or_path` that reads as a local path and names no saved model, in a second, before the data
    loads (instead of after the data and the hub's retries).

    A value is a hub id when it reads `owner/name` and `owner` is no folder here; anything else (a path starting with
    `.`, `/` or `~`, one with a further `/`, a bare name, `runs/x` with a `runs/` folder here) is a local path, which
    must be a folder holding a saved model (see `vlm_grpo.cli.evaluate.is_hub_id`, the rule `vlm-grpo eval` follows).

    Raises:
        VLMGRPOError: the path is missing, a file, or a folder without `config.json`; the message names the path
            and where it was set (`CONFIG.yaml: model_name_or_path` or `--model_name_or_path`).
    """
    model = early.value("model_name_or_path")
    if model is not None:
        check_model_path(str(model), early.where("model_name_or_path"))


def read_datasets(early: Early) -> tuple[tuple, Any, Any]:
    """`(key, train, eval)`: the data configs read and checked (records, images) before the heavy imports.

    The seed (which samples the records) is the one the options give, or TrainingArguments' default of 42; `key`
    lets `build_trainer` use these datasets only if the parsed options agree.
    """
    for key in ("data_config", "eval_data_config"):
        path = early.value(key)
        if path is not None and not Path(str(path)).is_file():
            raise VLMGRPOError(
                f"{early.where(key)}: data config {path} not found (paths are relative to the working directory "
                f"{Path.cwd()}); fix the path."
            )
    from .data import load_data_config  # datasets, PIL and numpy: after the paths are checked

    seed = int(early.value("seed", 42))
    paths = early.value("data_config"), early.value("eval_data_config")
    train, evaluation = (None if path is None else load_data_config(str(path), seed=seed) for path in paths)
    return (*paths, seed), train, evaluation


def _check_inputs(early: Early, options: dict) -> None:
    """Unknown flags and keys, and reward names and entries, named in one line."""
    check_flags(early.rest, options["flags"])
    config, config_path = early.config, early.config_path
    if config_path is not None:
        check_config_keys(config, config_path, options["names"])
        if "rewards" in config and "--rewards" not in early.rest:
            try:
                build_rewards(config["rewards"])  # reward names and entry keys, before TRL's checks
            except VLMGRPOError as error:
                raise VLMGRPOError(f"{config_path}: rewards: {error}") from error


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
    import torch

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
    script_args: ScriptArguments,
    training_args: VLMGRPOConfig,
    model_args: VLMModelConfig,
    compact_console: bool = False,
    datasets: tuple[tuple, Any, Any] | None = None,
) -> VLMGRPOTrainer:
    """Train with parsed arguments and save the model (or adapter) and processor to `output_dir`.

    With `compact_console` (the command line), each logging step prints one line instead of the metrics dict (see
    `vlm_grpo.runtime.console`). `datasets` are passed on to `build_trainer`.

    SIGTERM and SIGUSR1 are handled while this runs (the previous handlers are restored after): the run finishes
    its optimizer step, writes a complete checkpoint and returns without saving a final model;
    `preempted_step(trainer.callback_handler.callbacks)` then gives the step (see `vlm_grpo.runtime.preemption`).
    """
    from .runtime.console import use_compact_console
    from .runtime.preemption import PreemptionCallback

    # Parsing built `training_args`, which set up the process group (its DeepSpeed config uses the world size);
    # DeepSpeed must see that group before the model is loaded under ZeRO-3.
    init_deepspeed_comm(training_args)
    preemption = PreemptionCallback()
    with preemption.handle_signals():
        trainer = build_trainer(script_args, training_args, model_args, [preemption], datasets)
        if compact_console:
            use_compact_console(trainer)
        checkpoint = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
        if checkpoint is not None:
            logger.info("resumed from %s at step %s", checkpoint, checkpoint_step(checkpoint))
        elif training_args.resume_from_checkpoint not in (None, False, "false", "False"):
            logger.info("no complete checkpoint in %s: training starts at step 0", training_args.output_dir)
        trainer.train(resume_from_checkpoint=checkpoint)
        if preemption.stopped_at is None:
            trainer.save_state()
            trainer.save_model(training_args.output_dir)
            if trainer.accelerator.is_main_process:
                trainer.processing_class.save_pretrained(training_args.output_dir)
    return trainer


def build_trainer(
    script_args: ScriptArguments,
    training_args: VLMGRPOConfig,
    model_args: VLMModelConfig,
    callbacks: list | None = None,
    datasets: tuple[tuple, Any, Any] | None = None,
) -> VLMGRPOTrainer:
    """Load the data and rewards and build the trainer (the model is loaded here).

    `datasets` are those `read_datasets` read already; used when the parsed options name the same files and seed.
    """
    from trl import get_peft_config

    from .data import load_data_config
    from .trainer.trainer import VLMGRPOTrainer

    key = (script_args.data_config, script_args.eval_data_config, training_args.seed)
    if datasets is not None and datasets[0] == key:
        train_dataset, eval_dataset = datasets[1], datasets[2]
    else:
        train_dataset = load_data_config(script_args.data_config, seed=training_args.seed)
        eval_dataset = None
        if script_args.eval_data_config:
            eval_dataset = load_data_config(script_args.eval_data_config, seed=training_args.seed)
    reward_funcs, weights = build_rewards(script_args.rewards)
    connect_rewards(reward_funcs)  # a judge that cannot be reached stops the run here, before the model loads
    tools = [import_callable(path, "Tool", "package.module.function") for path in script_args.tools]
    environment_factory = None
    if script_args.environment_factory:
        environment_factory = import_callable(
            script_args.environment_factory, "environment_factory", "package.module.Class"
        )
    training_args.reward_weights = weights
    training_args.model_init_kwargs = {
        **model_init_kwargs(model_args),
        **(training_args.model_init_kwargs or {}),
    }
    return VLMGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
        tools=tools or None,
        environment_factory=environment_factory,
    )


def import_callable(path: str, what: str, expected: str) -> Any:
    """The callable a config names by dotted path (a tool, an environment class).

    Args:
        path (`str`): `package.module.name`.
        what (`str`): the option, for the message (`"Tool"`, `"environment_factory"`).
        expected (`str`): what the path should name (`"package.module.function"`).

    Raises:
        VLMGRPOError: the path imports nothing callable (see `vlm_grpo.dotted.import_dotted`).
    """
    found = import_dotted(path, what, expected)
    if not callable(found):
        raise VLMGRPOError(
            f"{what} {path!r} is a {type(found).__name__}, not a callable: point it to {expected}."
        )
    return found


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo train`."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    start = time.perf_counter()
    early = read_early(argv)
    check_model(early)
    datasets = read_datasets(early)  # bad input is named before the heavy libraries load
    args = parse_args(argv)
    from .runtime.console import closing_summary
    from .runtime.notices import quiet_third_party
    from .runtime.preemption import EXIT_PREEMPTED, preempted_step
    from .runtime.shutdown import exit_process, finish_processes

    quiet_third_party()
    trainer = run(*args, compact_console=True, datasets=datasets)
    step = preempted_step(trainer.callback_handler.callbacks)
    output_dir = trainer.args.output_dir
    several_processes = finish_processes(trainer.release_process_groups)
    if step is None and trainer.accelerator.is_main_process:
        print(closing_summary(trainer, time.perf_counter() - start), flush=True)
    if step is not None:
        print(
            f"vlm-grpo train: preempted: stopped after step {step} with a complete checkpoint "
            f"{output_dir}/checkpoint-{step}; run the same command with --resume_from_checkpoint true to "
            f"continue (exit status {EXIT_PREEMPTED}).",
            file=sys.stderr,
            flush=True,
        )
    status = 0 if step is None else EXIT_PREEMPTED
    if several_processes:
        exit_process(
            status
        )  # see `vlm_grpo.runtime.shutdown`: no interpreter finalization after a process group
    if status:
        raise SystemExit(status)


if __name__ == "__main__":  # python -m vlm_grpo.train (torchrun): same arguments, same error reporting
    run_cli("train", main, sys.argv[1:])
