"""Group-relative advantages: the arithmetic core of GRPO, as TRL 1.16 computes it, in one small function."""

from __future__ import annotations

import torch
from trl.trainer.utils import nanstd


def group_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted reward per completion, minus its group's mean, optionally over the group's (or batch's) std.

    Args:
        rewards_per_func (`torch.Tensor`): `[N, F]` reward of each of F functions for N = groups * G completions,
            consecutive rows forming a group; NaN where a function does not apply.
        weights (`torch.Tensor`): `[F]` weight per reward function.
        num_generations (`int`): G, completions per prompt.
        scale_rewards (`str`, defaults to "group"): "group" (divide by the group std), "batch" (by the batch std)
            or "none".
        multi_objective_aggregation (`str`, defaults to "sum_then_normalize"): "sum_then_normalize" (weight, sum,
            then normalise per group) or "normalize_then_sum" (normalise each function per group, weight, sum, then
            normalise over the batch), as TRL's option of that name.

    Returns:
        `(advantages [N], rewards [N], is_std_zero [N])`. Rows where every function returned None get reward NaN
        and advantage 0: they carry no learning signal.
    """
    unscorable = torch.isnan(rewards_per_func).all(dim=1)  # [N]
    if multi_objective_aggregation == "normalize_then_sum":
        return _normalize_then_sum(rewards_per_func, weights, num_generations, unscorable)
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)  # [N]
    rewards[unscorable] = torch.nan
    grouped = rewards.view(-1, num_generations)  # [N/G, G]
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)  # [N]
    if scale_rewards in ("group", "none"):
        std = (
            nanstd(grouped, dim=1).repeat_interleave(num_generations) if num_generations > 1 else rewards * 0
        )
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else rewards * 0
    else:
        raise ValueError(f"scale_rewards={scale_rewards!r} is not one of 'group', 'batch', 'none'.")
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(advantages, nan=0.0), rewards, is_std_zero


def _normalize_then_sum(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int, unscorable: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each function's rewards normalised within its group, weighted and summed, then normalised over the batch."""
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))  # [N/G, G, F]
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # [N/G, 1, F]
    std = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    normalized = ((grouped - mean) / (std + 1e-4)).view(-1, rewards_per_func.size(1))  # [N, F]
    rewards = (normalized * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)  # [N]
    rewards[unscorable] = torch.nan
    batch_std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (batch_std + 1e-4)
    is_std_zero = torch.isclose(batch_std, torch.zeros_like(batch_std))
    return torch.nan_to_num(advantages, nan=0.0), rewards, is_std_zero
