"""Per-model modules: one file per vision-language model family, chosen by `config.model_type`."""

from .base import EncodedPrompt, ModelFamily
from .registry import FAMILY_CLASSES, SUPPORTED_MODEL_TYPES, get_model_family

__all__ = ["FAMILY_CLASSES", "SUPPORTED_MODEL_TYPES", "EncodedPrompt", "ModelFamily", "get_model_family"]
