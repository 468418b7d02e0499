"""Third-party notices a user cannot act on, silenced on the command line only (library use keeps them).

Deprecation warnings raised inside the libraries' own calls, a setting the trainer makes on purpose (gradient
checkpointing turns the generation cache off during training), DeepSpeed's note that it runs on the CPU,
bitsandbytes' note about an optional kernel, and transformers' load and save progress bars.
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


def quiet_third_party() -> None:
    """Silence the known notices of transformers, DeepSpeed and bitsandbytes that a user cannot act on.

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
    # a record reaches the handlers of its library's logger, and those of the root logger where the library
    # propagates (transformers does when the environment sets CI=1)
    root = logging.getLogger()
    for name in ("transformers", "DeepSpeed", "bitsandbytes.backends.cpu.ops"):
        logger = logging.getLogger(name)
        for target in (logger, *logger.handlers, *root.handlers):
            if _DROP not in target.filters:
                target.addFilter(_DROP)
