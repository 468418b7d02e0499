"""What `vlm-grpo train` prints: one compact line per logging step, no third-party notices, a closing summary.

Only the command line is made quiet. A script that builds `VLMGRPOTrainer` itself keeps transformers' printed metric
dicts and every library warning. Either way the full metrics go to every `report_to` backend and to
`trainer_state.json`.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

# Notices the user cannot act on: deprecations inside the libraries' own calls, and settings that the trainer
# makes on purpose (gradient checkpointing turns the cache off during training).
_WARNINGS = (
    r"`(is_)?gradient_checkpointing",  # TRL and transformers call the v5-deprecated names themselves
    r"`use_transformers_paged",
)
_LOG_MESSAGES = (
    "`use_cache=True` is incompatible with gradient checkpointing",
    "Setting accelerator to CPU",  # DeepSpeed on a machine without GPU: nothing to do about it
    "Failed to load CPU gemm_4bit_forward from kernels-community",
)


class _Drop(logging.Filter):
    """Drops log records whose message starts with one of `_LOG_MESSAGES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in _LOG_MESSAGES)


def quiet_third_party() -> None:
    """Silence the known notices of transformers, DeepSpeed and bitsandbytes that a user cannot act on."""
    from transformers.utils import logging as hf_logging

    for pattern in _WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars at every load and save
    drop = _Drop()
    for name in ("transformers", "DeepSpeed", "bitsandbytes.backends.cpu.ops"):
        logger = logging.getLogger(name)
        logger.addFilter(drop)
        for handler in logger.handlers:
            handler.addFilter(drop)


def compact_line(logs: dict[str, Any], step: int, max_steps: int) -> str | None:
    """`step 3/100 | reward 0.42 ± 0.31 | kl 0.0012 | length 18.5 | 2.1 s/step` from one `on_log` record.

    Evaluation records read `eval step 3 | reward ...`; the end-of-training record and records without a reward give
    None.
    """
    prefix = "eval_" if any(k.startswith("eval_") for k in logs) else ""
    reward = logs.get(f"{prefix}reward")
    if reward is None:
        return None
    parts = [f"{'eval ' if prefix else ''}step {step}" + ("" if prefix else f"/{max_steps}")]
    spread = logs.get(f"{prefix}reward_std")
    parts.append(f"reward {reward:.3g}" + ("" if spread is None else f" ± {spread:.2g}"))
    for key, label, fmt in (("kl", "kl", ".3g"), ("completions/mean_length", "length", ".3g")):
        value = logs.get(f"{prefix}{key}")
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            parts.append(f"{label} {value:{fmt}}")
    seconds = logs.get("step_time")
    if seconds is not None:
        parts.append(f"{seconds:.2g} s/step")
    return " | ".join(parts)


class CompactProgressCallback(ProgressCallback):
    """transformers' progress bar, writing `compact_line` instead of the whole metrics dict at each log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = compact_line(logs or {}, state.global_step, state.max_steps)
        if state.is_world_process_zero and self.training_bar is not None and line:
            self.training_bar.write(line)


class CompactPrinterCallback(TrainerCallback):
    """Without a progress bar (`disable_tqdm`): `compact_line` printed at each log, on the main process."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = compact_line(logs or {}, state.global_step, state.max_steps)
        if state.is_world_process_zero and line:
            print(line, flush=True)


def use_compact_console(trainer: Any) -> None:
    """Replace the trainer's metric-dict printers by their compact versions."""
    for full, compact in (
        (ProgressCallback, CompactProgressCallback),
        (PrinterCallback, CompactPrinterCallback),
    ):
        if trainer.pop_callback(full) is not None:
            trainer.add_callback(compact)


def closing_summary(trainer: Any, seconds: float) -> str:
    """Where the model (or adapter) and checkpoints went, the final and best reward, and the wall time."""
    output = Path(trainer.args.output_dir)
    what = "adapter" if (output / "adapter_config.json").is_file() else "model"
    rewards = [(e["step"], e["reward"]) for e in trainer.state.log_history if "reward" in e and "step" in e]
    checkpoints = sorted(output.glob("checkpoint-*"), key=lambda p: int(p.name.rpartition("-")[2]))
    lines = [
        f"vlm-grpo train: done in {seconds:.0f} s, {trainer.state.global_step} steps; {what} saved to {output}"
    ]
    if checkpoints:
        lines.append(f"  checkpoints: {len(checkpoints)} in {output} (latest {checkpoints[-1].name})")
    if rewards:
        best_step, best = max(rewards, key=lambda r: r[1])
        lines.append(
            f"  reward: final {rewards[-1][1]:.3g} (step {rewards[-1][0]}), best {best:.3g} (step {best_step})"
        )
    return "\n".join(lines)
