"""The model's `config.json`, found without a download: the model folder, `--model_config`, or a published one.

The planner needs the architecture only (sizes, layers, vocabulary), never the weights. A local model folder or a
`config.json` given with `--model_config` is read as is. For the checkpoints the recipes name, the fields of their
published `config.json` that decide the architecture are written below, so that `vlm-grpo plan recipes/...yaml`
works on a machine that has never downloaded them; `tests/test_plan.py` checks that each builds to the parameter
count its publisher states. A model id that is neither local nor listed asks for `--model_config`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import VLMGRPOError

_QWEN2_5_VL_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, spatial_merge_size=2,
    temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31], in_chans=3,
)  # fmt: skip
_QWEN3_VL_VISION = dict(
    depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, spatial_merge_size=2,
    temporal_patch_size=2, deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304, in_channels=3,
)  # fmt: skip
_QWEN2_VL_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}
_QWEN3_VL_PIXELS = {"min_pixels": 65536, "max_pixels": 16777216}

PUBLISHED: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2-VL-2B-Instruct": dict(
        model_type="qwen2_vl", tie_word_embeddings=True, processor=_QWEN2_VL_PIXELS,
        text_config=dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
        vision_config=dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=1536, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
    ),
    "Qwen/Qwen2.5-VL-3B-Instruct": dict(
        model_type="qwen2_5_vl", tie_word_embeddings=True, processor=_QWEN2_VL_PIXELS,
        text_config=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
        vision_config=dict(_QWEN2_5_VL_VISION, out_hidden_size=2048),
    ),
    "Qwen/Qwen2.5-VL-7B-Instruct": dict(
        model_type="qwen2_5_vl", tie_word_embeddings=False, processor=_QWEN2_VL_PIXELS,
        text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
        vision_config=dict(_QWEN2_5_VL_VISION, out_hidden_size=3584),
    ),
    "Qwen/Qwen3-VL-8B-Instruct": dict(
        model_type="qwen3_vl", tie_word_embeddings=False, processor=_QWEN3_VL_PIXELS,
        text_config=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
        vision_config=dict(_QWEN3_VL_VISION, out_hidden_size=4096),
    ),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": dict(
        model_type="qwen3_vl_moe", tie_word_embeddings=False, processor=_QWEN3_VL_PIXELS,
        text_config=dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                         num_experts_per_tok=8, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, vocab_size=151936, tie_word_embeddings=False),
        vision_config=dict(_QWEN3_VL_VISION, out_hidden_size=2048),
    ),
    "google/gemma-3-4b-it": dict(
        model_type="gemma3", mm_tokens_per_image=256,
        text_config=dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=256, vocab_size=262208, sliding_window=1024),
        vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                           image_size=896, patch_size=14, vision_use_head=False),
    ),
    "OpenGVLab/InternVL3-2B-hf": dict(
        model_type="internvl", tie_word_embeddings=False, downsample_ratio=0.5, projector_hidden_act="gelu",
        text_config=dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151674, tie_word_embeddings=False),
        vision_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                           image_size=[448, 448], patch_size=[14, 14]),
    ),
}  # fmt: skip
"""Architecture fields of published `config.json` files, by hub id (plus `processor`: their image-size settings)."""


def load_model_config(model: str, model_config: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """`(config, processor_settings, source)` of a model, read without weights and without a download.

    Args:
        model (`str`): `model_name_or_path` of the training config: a local folder or a hub id.
        model_config (`str | None`, defaults to None): a `config.json` (or a folder holding one) to use instead.

    Returns:
        `tuple`: the `transformers` config, the image-size settings of its processor (`min_pixels`, `max_pixels`
        where the folder or the published checkpoint has them; `video_min_pixels`, `video_max_pixels` where the
        folder's video processor has them) and where the config came from.

    Raises:
        VLMGRPOError: no config is found, it is not JSON, or its `model_type` is unknown to transformers.
    """
    from transformers import AutoConfig

    path = Path(model_config or model)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise VLMGRPOError(
                f"model folder {path.parent} has no config.json; point --model_config at the model's config.json."
            )
    if path.is_file():
        try:
            fields = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise VLMGRPOError(f"{path}: not valid JSON ({error.msg}, line {error.lineno}).") from error
        return _config(AutoConfig, fields, str(path)), _processor_settings(path.parent), str(path)
    if model_config is not None:
        raise VLMGRPOError(
            f"--model_config {model_config} not found; give the path of the model's config.json."
        )
    if model not in PUBLISHED:
        raise VLMGRPOError(
            f"{model}: no local folder and no published config known for it; download its config.json and pass "
            f"--model_config path/to/config.json (known offline: {', '.join(sorted(PUBLISHED))})."
        )
    fields = dict(PUBLISHED[model])
    processor = fields.pop("processor", {})
    return _config(AutoConfig, fields, model), dict(processor), f"{model} (published config.json)"


def _config(auto_config: Any, fields: dict[str, Any], source: str) -> Any:
    """A transformers config from `config.json` fields; an unknown or missing `model_type` is one line."""
    fields = dict(fields)
    model_type = fields.pop("model_type", None)
    try:
        return auto_config.for_model(model_type, **fields)
    except (ValueError, KeyError) as error:
        raise VLMGRPOError(
            f"{source}: model_type {model_type!r} is not one transformers knows; is this a model's config.json?"
        ) from error


def _processor_settings(folder: Path) -> dict[str, Any]:
    """`min_pixels` / `max_pixels` (`max_tiles`) of a model folder's image processor, and `video_min_pixels` /
    `video_max_pixels` of its video processor, where it sets them: from `preprocessor_config.json` and
    `video_preprocessor_config.json`, or the `image_processor` and `video_processor` entries of
    `processor_config.json` (as transformers 5 saves)."""
    joined = folder / "processor_config.json"
    joined_settings = json.loads(joined.read_text(encoding="utf-8")) if joined.is_file() else {}
    found = {}
    for prefix, file, entry in (
        ("", "preprocessor_config.json", "image_processor"),
        ("video_", "video_preprocessor_config.json", "video_processor"),
    ):
        if (folder / file).is_file():
            settings = json.loads((folder / file).read_text(encoding="utf-8"))
        else:
            settings = joined_settings.get(entry, {})
        size = settings.get("size") or {}
        found[f"{prefix}min_pixels"] = size.get("shortest_edge", settings.get("min_pixels"))
        found[f"{prefix}max_pixels"] = size.get("longest_edge", settings.get("max_pixels"))
        if not prefix:
            found["max_tiles"] = settings.get("max_patches")
    return {key: value for key, value in found.items() if isinstance(value, int)}
