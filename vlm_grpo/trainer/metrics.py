"""What a rollout logs: TRL's length and reward metrics, and the step's samples written to `output_dir/samples/`.

The metrics are computed from tensors already gathered over every process, as TRL 1.16's
`GRPOTrainer._generate_and_score_completions` computes them, plus length percentiles (see `monitoring`).
"""

from __future__ import annotations

import torch
from trl.trainer.utils import nanstd

from ..runtime.monitoring import length_stats


def length_metrics(
    prompt_lengths: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor
) -> dict[str, float]:
    """Prompt and completion length metrics, as TRL logs them, plus length percentiles.

    Args:
        prompt_lengths (`torch.Tensor`): `[N]` prompt lengths of every row, all processes.
        lengths (`torch.Tensor`): `[N]` completion lengths (float).
        truncated (`torch.Tensor`): `[N]` whether each completion ended on neither eos nor pad.
    """
    metrics = {
        **length_stats("prompt_length", prompt_lengths.tolist()),
        **length_stats("response_length", lengths.tolist()),
    }
    terminated = lengths[~truncated] if (~truncated).any() else torch.zeros(1, device=lengths.device)
    for name, values in (("", lengths), ("_terminated", terminated)):
        metrics[f"completions/mean{name}_length"] = values.mean().item()
        metrics[f"completions/min{name}_length"] = values.min().item()
        metrics[f"completions/max{name}_length"] = values.max().item()
    metrics["completions/clipped_ratio"] = truncated.float().mean().item()
    return metrics


def reward_metrics(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, names: list[str], is_std_zero: torch.Tensor
) -> dict[str, float]:
    """Each function's mean and std, and the weighted sum of raw rewards (NaN where none applies), as TRL logs.

    Args:
        rewards_per_func (`torch.Tensor`): `[N, F]` rewards of every row, all processes.
        weights (`torch.Tensor`): `[F]` reward weights.
        names (`list[str]`): the F reward functions' names.
        is_std_zero (`torch.Tensor`): `[N]` whether each row's group had rewards of zero spread.
    """
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)  # [N]
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    metrics = {}
    for i, name in enumerate(names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    metrics["reward"] = torch.nanmean(rewards).item()
    metrics["reward_std"] = nanstd(rewards).item()
    metrics["frac_reward_zero_std"] = is_std_zero.float().mean().item()
    return metrics
