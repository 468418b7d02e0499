"""Per-model modules: one file per vision-language model family, chosen by `config.model_type`."""

from .base import EncodedPrompt, VLMModule
from .registry import MODULES, SUPPORTED_MODEL_TYPES, get_vlm_module

__all__ = ["MODULES", "SUPPORTED_MODEL_TYPES", "EncodedPrompt", "VLMModule", "get_vlm_module"]
