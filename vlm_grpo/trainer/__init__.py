"""The GRPO step: `VLMGRPOTrainer` (rollout, rewards, advantages, old and reference log-probs, loss) and what it
keeps across steps (checkpoints, the buffered rollout, metrics).

`VLMGRPOTrainer` is imported on first use, so that the checkpoint helpers stay light for the command line.
"""

from importlib import import_module
from typing import Any

__all__ = ["VLMGRPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "VLMGRPOTrainer":
        return import_module(".trainer", __name__).VLMGRPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
