"""The rollout: a generation batch's dataset rows in, its sampled rows out (`Rollout.sample` -> `RolloutBatch`).

Behind that one call: prompt encoding (each group's prompt once), sampling with transformers' `generate`
(`generation`, `fast_generation`) or vLLM (`vllm/`), the user's `rollout_func`, the tool loop and environments
(`tools`, `environments`), and dynamic sampling's refill rounds (`dynamic_sampling`, `prompt_stream`). `batch` holds
what the rollout hands the trainer (`Sampled`) and the padding both use.
"""

from .batch import Sampled
from .rollout import Rollout, RolloutBatch, RolloutSettings

__all__ = ["Rollout", "RolloutBatch", "RolloutSettings", "Sampled"]
