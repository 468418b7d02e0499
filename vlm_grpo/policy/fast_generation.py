"""Fast generation: transformers' `generate` with a preallocated (static) KV cache and a compiled decoding step.

Generation is most of a GRPO step, and its per-token cost is where a small-batch decoding loop spends its time: on a
GPU a step of the growing (`DynamicCache`) loop is launch-bound, tens of milliseconds for a few milliseconds of weight
reads (`docs/performance.md`). With `fast_generation` on, the rows' prompts are prefilled into transformers'
`StaticCache` (each group's prompt once when generation shares it, else each row's), sized once for the batch, and
`generate` decodes from it with its own compiled forward (`CompileConfig`: CUDA graphs on a GPU). The tokens are
those of the growing cache for the same random draws, within float rounding of the logits
(`tests/test_fast_generation.py`).

Compilation is paid once per shape: the cache's length is the prompt plus `max_new_tokens` rounded up to a multiple of
`CACHE_BUCKET`, so prompts of different lengths reuse one compiled step, and only a new batch size or a longer bucket
compiles again.

`fast_generation`: "false" never; "true" always where it can run; "auto" (default) on the devices where it was
measured to pay (`PAYS_ON`, `benchmarks/bench_grpo.py --fast_generation`): CUDA GPUs, where the recipe step of
Qwen2.5-VL-3B took 2.8 s instead of 9.8 s; not the CPU, where it was measured no faster. Where it cannot run it falls
back to the growing cache, with one log line saying why (`FastGeneration.reason`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import CompileConfig, GenerationConfig

from .sharing_plan import generation_obstacle

PAYS_ON: frozenset[str] = frozenset({"cuda"})
"""Device types where `fast_generation: auto` turns it on: where a benchmark measured it faster than the growing cache
(an H200: 3.5 times faster steps, docs/performance.md#fast-generation; the CPU did not gain)."""
CACHE_BUCKET = 256
"""Cache lengths are rounded up to a multiple of this, so that prompts of different lengths share a compiled step."""


@dataclass(frozen=True)
class FastGeneration:
    """Whether a run's transformers generation decodes from a static cache with a compiled step; made once per run.

    Attributes:
        enabled (`bool`): the fast path runs.
        reason (`str`): why it runs or not, for the log.
        compile_config (`CompileConfig | None`): what `generate` compiles its decoding forward with, when enabled.
    """

    enabled: bool
    reason: str
    compile_config: CompileConfig | None = None

    def max_cache_len(self, prompt_length: int, max_new_tokens: int) -> int | None:
        """The static cache's length for `[B, prompt_length]` prompts and `max_new_tokens` new tokens (None: off)."""
        if not self.enabled:
            return None
        needed = prompt_length + max_new_tokens
        return -(-needed // CACHE_BUCKET) * CACHE_BUCKET

    def generation_config(self, config: GenerationConfig) -> GenerationConfig:
        """`config` (TRL's, which disables compilation) with the compiled decoding step, when enabled."""
        if not self.enabled:
            return config
        fast = copy.deepcopy(config)
        fast.disable_compile = False
        fast.compile_config = self.compile_config
        return fast


def decide_fast_generation(
    mode: str,
    device: torch.device,
    generation_config: GenerationConfig | None,
    quantized: bool,
    zero3: bool,
) -> FastGeneration:
    """The run's `FastGeneration`.

    Args:
        mode (`str`): `fast_generation`, one of "true", "false", "auto".
        device (`torch.device`): where generation runs.
        generation_config (`GenerationConfig | None`): the merged config `generate` runs with; None when vLLM samples.
        quantized (`bool`): the model's weights are quantized (bitsandbytes): transformers compiles none of them.
        zero3 (`bool`): DeepSpeed ZeRO-3 partitions the weights, gathered anew for every generation.
    """
    if generation_config is None:
        return FastGeneration(False, "fast_generation: vLLM samples the completions")
    if mode == "false":
        return FastGeneration(False, "fast_generation: false: generate decodes with the growing cache")
    if mode == "auto" and device.type not in PAYS_ON:
        measured = "were measured no faster" if device.type == "cpu" else "have not been measured to pay yet"
        return FastGeneration(
            False,
            f"fast_generation: auto: off on {device.type}, where a static cache and a compiled step {measured} "
            "(docs/performance.md#fast-generation); set fast_generation: true to use them",
        )
    obstacle = generation_obstacle(generation_config)
    if obstacle is None and quantized:
        obstacle = "the weights are quantized, and transformers compiles no quantized model"
    if obstacle is None and zero3:
        obstacle = (
            "ZeRO-3 gathers the weights anew for every generation, which a compiled step is not checked with"
        )
    if obstacle is not None:
        return FastGeneration(
            False, f"fast_generation: {mode}, but {obstacle}: generate runs as it is configured"
        )
    # inductor with CUDA graphs ("reduce-overhead", transformers' default) on a GPU; static shapes, so that each
    # batch size and cache bucket compiles once and nothing recompiles as the cache fills
    compile_config = CompileConfig(dynamic=False)
    if device.type != "cuda":
        compile_config = CompileConfig(dynamic=False, mode="default")
        compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told
    return FastGeneration(
        True,
        f"fast_generation: {mode}: prompts prefilled into a static cache, decoding compiled ({device.type})",
        compile_config,
    )
