"""Third-party notices a user cannot act on, silenced on the command line only (library use keeps them).

Deprecation warnings raised inside the libraries' own calls, a setting the trainer makes on purpose (gradient
checkpointing turns the generation cache off during training), DeepSpeed's note that it runs on the CPU,
bitsandbytes' note about an optional kernel, and transformers' load and save progress bars. When the output is not
a terminal (piped to `tee`, redirected to a log file), the datasets library's progress bars are off too, and
`vlm_grpo.runtime.console` prints the step lines without the training progress bar: a bar redraws itself with
carriage returns, which a log keeps between the step lines.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

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


_DROP = _Drop()


def on_a_terminal() -> bool:
    """Whether stdout and stderr are both terminals, the only case where progress bars are drawn on the command line.

    The step lines go to stdout and the bars to stderr: when either is piped or redirected, a bar's redraws land
    in the log or on the screen between the step lines (`vlm-grpo train ... | tee log` shows both on the terminal,
    out of step).
    """
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


def quiet_third_party() -> None:
    """Silence the known notices of transformers, DeepSpeed and bitsandbytes that a user cannot act on, and the
    datasets library's progress bars when the output is not a terminal (`on_a_terminal`).

    Imports nothing heavy: called first by every command, and again once transformers is imported (its records
    reach the handler transformers installs then).
    """
    for pattern in _WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
    # the "Loading weights" / "Writing model shards" bars at every load and save (read when transformers loads)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    # the datasets library's bars (`map` in TRL's SFTTrainer, ...) off a terminal: read when datasets loads, set
    # here too if it is loaded already (unless the environment asks for them)
    if not on_a_terminal() and os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1") == "1":
        if "datasets" in sys.modules:
            from datasets.utils import disable_progress_bars

            disable_progress_bars()
    # a record reaches the handlers of its library's logger, and those of the root logger where the library
    # propagates (transformers does when the environment sets CI=1)
    root = logging.getLogger()
    for name in ("transformers", "DeepSpeed", "bitsandbytes.backends.cpu.ops"):
        logger = logging.getLogger(name)
        for target in (logger, *logger.handlers, *root.handlers):
            if _DROP not in target.filters:
                target.addFilter(_DROP)
