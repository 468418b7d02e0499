"""What `vlm-grpo train` prints: one compact line per logging step and a closing summary.

Only the command line is made quiet (see also `vlm_grpo.runtime.notices`). A script that builds `VLMGRPOTrainer` itself keeps
transformers' printed metric dicts. Either way the full metrics go to every `report_to` backend and to
`trainer_state.json`.

The progress bar shares the terminal with log records (the trainer's warnings, transformers' notices): on the command
line every console log handler writes through `tqdm.write`, which clears the bar, writes the record on a line of its
own and draws the bar again below it (see `write_logs_around_bars`). The bar is drawn only when stdout and stderr
are both terminals (`vlm_grpo.runtime.notices.on_a_terminal`); piped or redirected, the output holds the step lines
alone, without a bar's redraws between them.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .notices import on_a_terminal


def compact_line(logs: dict[str, Any], step: int, max_steps: int) -> str | None:
    """`step 3/100 | reward 0.42 ± 0.31 | kl 0.0012 | length 18.5 | 2.1 s/step` from one `on_log` record.

    With tools (the record has `tools/call_frequency`), `tools 0.75 calls/completion, 12% failed` comes before the
    step time: the tool calls per completion and the share of calls that failed (`tools/failure_frequency`).
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
        value = _number(logs, f"{prefix}{key}")
        if value is not None:
            parts.append(f"{label} {value:{fmt}}")
    calls, failures = (
        _number(logs, f"{prefix}tools/call_frequency"),
        _number(logs, f"{prefix}tools/failure_frequency"),
    )
    if calls is not None:
        parts.append(
            f"tools {calls:.3g} calls/completion" + ("" if failures is None else f", {failures:.0%} failed")
        )
    seconds = logs.get("step_time")
    if seconds is not None:
        parts.append(f"{seconds:.2g} s/step")
    return " | ".join(parts)


def _number(logs: dict[str, Any], key: str) -> float | None:
    """The record's value of `key`, or None when it is missing or NaN."""
    value = logs.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


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


class BarSafeStream:
    """A text stream that writes through `tqdm.write`: open progress bars on the terminal are cleared first and drawn
    again after, so that what is written starts on a line of its own instead of after the bar.

    Args:
        stream (`TextIO`): the stream written to (`sys.stderr` or `sys.stdout`).
    """

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> None:
        """Write `text` (a whole record, ending in a newline) between clearing and redrawing the bars."""
        from tqdm import tqdm

        tqdm.write(text, file=self.stream, end="")

    def flush(self) -> None:
        """Flush the underlying stream."""
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)  # `isatty`, `encoding`, `name`, ... of the underlying stream


def write_logs_around_bars() -> None:
    """Make every log handler that writes to the terminal write through `BarSafeStream`.

    Affects the plain `logging.StreamHandler`s on `sys.stderr` or `sys.stdout` of the root logger (set up by
    `logging.basicConfig`) and of every library logger (transformers installs its own); file handlers and other
    handler classes are left as they are. Levels, formats and filters are kept. Calling it again changes nothing.
    """
    # the registry also holds placeholders of parent names no logger was made for
    named = [x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)]
    for logger in [logging.getLogger(), *named]:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout):
                handler.setStream(BarSafeStream(handler.stream))


def use_compact_console(trainer: Any) -> None:
    """Replace the trainer's metric-dict printers by their compact versions, and keep log records off the progress
    bar's line (`write_logs_around_bars`).

    Off a terminal (`vlm_grpo.runtime.notices.on_a_terminal` is False: output piped or redirected) the progress bar
    goes too: the step lines are printed alone (`CompactPrinterCallback`).
    """
    bar = CompactProgressCallback if on_a_terminal() else CompactPrinterCallback
    for full, compact in (
        (ProgressCallback, bar),
        (PrinterCallback, CompactPrinterCallback),
    ):
        if trainer.pop_callback(full) is not None:
            trainer.add_callback(compact)
    write_logs_around_bars()


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
