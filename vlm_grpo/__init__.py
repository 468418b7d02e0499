"""vlm_grpo: GRPO post-training for vision-language models on top of TRL.

Public face: `VLMGRPOTrainer`, `VLMGRPOConfig`, `VLMModelConfig`, `get_vlm_module`. Heavy imports (torch,
transformers, TRL) happen on first use, so `vlm_grpo.data` and `vlm_grpo.rewards` stay light.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "VLMGRPOTrainer": "vlm_grpo.trainer",
    "VLMGRPOConfig": "vlm_grpo.config",
    "VLMModelConfig": "vlm_grpo.config",
    "get_vlm_module": "vlm_grpo.models",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vlm_grpo' has no attribute {name!r}")
