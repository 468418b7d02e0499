"""The rollout: a generation batch's dataset rows in, its sampled rows out (`Rollout.sample` -> `RolloutBatch`).

Behind that one call: prompt encoding (each group's prompt once), sampling with transformers' `generate` (`generation`;
its static cache: `policy.fast_generation`) or vLLM (`vllm/`), the user's `rollout_func`, the tool loop and environments
(`tools`, `environments`), and dynamic sampling's refill rounds (`dynamic_sampling`, `prompt_stream`). `batch` holds
what the rollout hands the trainer (`Sampled`) and the padding both use.

The names are imported on first use, so that vLLM's processes can load this package's plugin
(`vllm.cpu_transfer`) without the rollout's own imports.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Rollout": ".rollout",
    "RolloutBatch": ".rollout",
    "RolloutSettings": ".rollout",
    "Sampled": ".batch",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
