"""Choose the per-model module from `config.model_type`: adding a family is one file plus one line here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from ..errors import VLMGRPOError, one_line
from .base import ModelFamily
from .gemma3 import Gemma3Family
from .gemma4 import Gemma4Family
from .glm4v import Glm4vFamily
from .internvl import InternVLFamily
from .qwen2_vl import Qwen2VLFamily
from .qwen3_5 import Qwen3_5Family
from .qwen3_vl_moe import Qwen3VLMoeFamily

FAMILY_CLASSES: tuple[type[ModelFamily], ...] = (
    Qwen2VLFamily,
    InternVLFamily,
    Gemma3Family,
    Qwen3VLMoeFamily,
    Qwen3_5Family,
    Gemma4Family,
    Glm4vFamily,
)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for cls in FAMILY_CLASSES for t in cls.model_types)


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def _check_model_folder(path: str) -> None:
    """A local model path must be a folder with a `config.json`; a hub id (`org/name`) is left to transformers.

    A path is local when it exists, starts with `.` or `/`, cannot be a hub id, or its first part is a folder here
    (`runs/demo` with a `runs/` folder in the working directory).
    """
    folder = Path(path)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise VLMGRPOError(
                f"model folder {path} has no config.json; point model_name_or_path at a saved model."
            )
        return
    under_local_folder = len(folder.parts) > 1 and Path(folder.parts[0]).is_dir()
    if folder.exists() or not _HUB_ID.match(path) or path.startswith(".") or under_local_folder:
        raise VLMGRPOError(f"model folder {path} not found; check model_name_or_path.")


def _model_type(model_or_config_or_path: Any, trust_remote_code: bool) -> str:
    obj = model_or_config_or_path
    if isinstance(obj, str):
        _check_model_folder(obj)
        config_file = Path(obj) / "config.json"
        if (
            not trust_remote_code
            and config_file.is_file()
            and "auto_map" in json.loads(config_file.read_text())
        ):
            raise VLMGRPOError(
                f"{obj} ships its own model code (auto_map in config.json), which runs only with "
                "trust_remote_code: true in the YAML (or --trust_remote_code true); set it only if you trust "
                "that code. For InternVL, use the transformers-native checkpoints instead: the ones named -hf or "
                "-HF (e.g. OpenGVLab/InternVL3-2B-hf, OpenGVLab/InternVL3_5-8B-HF, OpenGVLab/InternVL3_5-30B-A3B-HF)."
            )
        try:
            obj = AutoConfig.from_pretrained(obj, trust_remote_code=trust_remote_code)
        except OSError as error:
            if Path(obj).is_dir():  # a local folder whose config cannot be read: not a path mistake
                raise
            raise VLMGRPOError(
                f"model {obj} is no local folder, and fetching it from the Hugging Face hub failed "
                f"({one_line(error)}); check model_name_or_path, or the network for a hub id."
            ) from error
    config = obj if isinstance(obj, PretrainedConfig) else getattr(obj, "config", None)
    if not isinstance(config, PretrainedConfig):
        raise TypeError(
            f"get_model_family expects a model, a PretrainedConfig or a path, got {type(model_or_config_or_path)}."
        )
    return config.model_type


def get_model_family(model_or_config_or_path: Any, trust_remote_code: bool = False) -> ModelFamily:
    """Return the module serving this model's `config.model_type`.

    Args:
        model_or_config_or_path (`PreTrainedModel | PeftModel | PretrainedConfig | str`): the model, its config,
            or a local folder / hub id holding its config.
        trust_remote_code (`bool`, defaults to False): needed only to read a config shipped as remote code.

    Raises:
        ValueError: the model type is not supported; the message lists the supported ones.
    """
    model_type = _model_type(model_or_config_or_path, trust_remote_code)
    for cls in FAMILY_CLASSES:
        if model_type in cls.model_types:
            return cls(model_type)
    raise VLMGRPOError(
        f"Unsupported model_type {model_type!r}. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}. "
        "To add a family, write a ModelFamily subclass in vlm_grpo/models/ and add it to FAMILY_CLASSES in registry.py."
    )
