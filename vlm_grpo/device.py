"""Device, dtype and attention-implementation resolution for CUDA, Ascend NPU and CPU, in one place.

Nothing else in `vlm_grpo` calls a backend-specific API: code asks this module which accelerator is present,
which dtype to load weights in and which attention kernel to use.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

logger = logging.getLogger(__name__)


def npu_available() -> bool:
    """Return True when `torch_npu` is installed and an Ascend NPU is visible."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers the `npu` device with torch)

    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def accelerator_type() -> str:
    """Return the accelerator of this process: `"cuda"`, `"npu"` or `"cpu"`."""
    if torch.cuda.is_available():
        return "cuda"
    if npu_available():
        return "npu"
    return "cpu"


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """Resolve a user dtype to a `torch.dtype` (or `"auto"`).

    Args:
        dtype (`str | torch.dtype | None`): `"auto"`, `"bfloat16"`, `"float16"`, `"float32"`, a `torch.dtype`,
            or None. None means bf16 on CUDA/NPU and fp32 on CPU.

    Returns:
        `torch.dtype | str`: the dtype to load weights in, or `"auto"` (the checkpoint's own dtype).
    """
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype is None:
        return torch.float32 if accelerator_type() == "cpu" else torch.bfloat16
    names = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
    }
    if dtype not in names:
        raise ValueError(f"dtype={dtype!r} is not supported: use one of auto, bfloat16, float16, float32.")
    return names[dtype]


def resolve_attn_implementation(requested: str | None) -> str:
    """Pick the attention kernel, falling back when the requested one cannot run here.

    Args:
        requested (`str | None`): `"flash_attention_2"`, `"sdpa"`, `"eager"` or None (best available).

    Returns:
        `str`: `flash_attention_2` only on CUDA with `flash_attn` installed; otherwise `sdpa` (or `eager` when
        explicitly requested).
    """
    has_flash = accelerator_type() == "cuda" and importlib.util.find_spec("flash_attn") is not None
    if requested in (None, "flash_attention_2"):
        if has_flash:
            return "flash_attention_2"
        if requested == "flash_attention_2":
            logger.warning("flash_attention_2 needs CUDA and the flash-attn package; falling back to sdpa.")
        return "sdpa"
    if requested not in ("sdpa", "eager"):
        raise ValueError(
            f"attn_implementation={requested!r} is not supported: use flash_attention_2, sdpa or eager."
        )
    return requested


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak memory allocated by torch on `device` since the last reset (0 on CPU, where torch does not track it)."""
    device = torch.device(device)
    if device.type in ("cuda", "npu"):
        return getattr(torch, device.type).max_memory_allocated(device)
    return 0


def default_device() -> torch.device:
    """The device a single process (evaluation, benchmarks) runs on: the first CUDA/NPU device, else the CPU."""
    kind = accelerator_type()
    return torch.device(f"{kind}:0" if kind != "cpu" else "cpu")
