"""Device handling lives in one place: no CUDA-only call anywhere else in the package (NPU users depend on it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vlm_grpo.device import accelerator_type, default_device, resolve_attn_implementation, resolve_dtype

PACKAGE = Path(__file__).resolve().parents[1] / "vlm_grpo"
CUDA_ONLY = re.compile(
    r"\.cuda\(|torch\.cuda\.|device\s*=\s*['\"]cuda|['\"]cuda:\d|\.to\(['\"]cuda|flash_attn"
)


def test_no_cuda_only_calls_outside_device_module():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "device.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if CUDA_ONLY.search(code):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert offenders == []


def test_cpu_resolution():
    assert accelerator_type() == "cpu" and default_device() == torch.device("cpu")
    assert resolve_dtype(None) is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("auto") == "auto"
    assert resolve_attn_implementation(None) == "sdpa"
    assert resolve_attn_implementation("flash_attention_2") == "sdpa"  # no flash-attn on CPU: falls back
    assert resolve_attn_implementation("eager") == "eager"
    with pytest.raises(ValueError, match="use one of auto, bfloat16"):
        resolve_dtype("int3")
    with pytest.raises(ValueError, match="flash_attention_2, sdpa or eager"):
        resolve_attn_implementation("xformers")
