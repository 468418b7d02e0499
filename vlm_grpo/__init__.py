"""vlm_grpo: GRPO post-training for vision-language models on top of TRL.

Public face: `VLMGRPOTrainer`, `VLMGRPOConfig`, `VLMModelConfig`, `get_model_family`. Heavy imports (torch,
transformers, TRL) happen on first use, so `vlm_grpo.data` and `vlm_grpo.rewards` stay light.
"""

import logging
from importlib import import_module
from typing import Any

__version__ = "0.1.0"


class _OptionalKernelNotice(logging.Filter):
    """Drops bitsandbytes' notice that its optional CPU 4-bit kernel could not be loaded from `kernels-community`.

    bitsandbytes (imported by peft) tries the optional `kernels` package on every import on an AVX512-BF16 CPU and
    logs a warning that reads like a broken install when it is absent; it then uses its own implementation, so
    nothing is lost. Only that message is dropped; every other bitsandbytes record passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelNotice())

_EXPORTS = {
    "VLMGRPOTrainer": "vlm_grpo.trainer",
    "VLMGRPOConfig": "vlm_grpo.config",
    "VLMModelConfig": "vlm_grpo.config",
    "get_model_family": "vlm_grpo.models",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vlm_grpo' has no attribute {name!r}")
