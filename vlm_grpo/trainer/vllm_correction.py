"""vLLM importance-sampling correction, as TRL 1.16's `GRPOTrainer._generate_and_score_completions` computes it.

vLLM samples with its own kernels, so the log-prob it gives a sampled token differs from the trainer's. With
`vllm_importance_sampling_correction` (TRL's default), each token's loss is weighted by
`exp(old_logp - sampling_logp)` (or one such ratio per sequence), truncated or masked outside
`[vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max]`; TRL's `_compute_loss` applies the weight
(`inputs["importance_sampling_ratio"]`). `vllm_importance_sampling_cap` is TRL's deprecated name of the upper bound
(`GRPOConfig.__post_init__` copies it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from trl.trainer.utils import nanmax, nanmin

from ..errors import VLMGRPOError

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """The trainer-over-vLLM probability ratio of each sampled token (or sequence), truncated or masked.

    Args:
        old_logps (`torch.Tensor`): `[B, C]` the trainer's log-probs of the sampled tokens before the update.
        sampling_logps (`torch.Tensor`): `[B, C]` vLLM's log-probs of the same tokens (NaN where vLLM gave none).
        mask (`torch.Tensor`): `[B, C]` completion mask.
        mode (`str`): TRL's `vllm_importance_sampling_mode`, one of `MODES`.
        clip_min (`float`, *optional*): lower bound; None is no bound in the mask modes.
        clip_max (`float`, *optional*): upper bound; None is no bound in the mask modes.

    Returns:
        `torch.Tensor`: `[B, C]` for the token modes, `[B, 1]` for the sequence modes.
    """
    if mode not in MODES:
        raise VLMGRPOError(f"vllm_importance_sampling_mode must be one of {', '.join(MODES)}, got {mode!r}.")
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)  # an unscored token: ratio 1
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def local_statistics(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor, mode: str
) -> dict[str, torch.Tensor]:
    """This process's 0-d statistics behind TRL's `sampling/*` metrics, before TRL's gather and reduction.

    Args are those of `importance_sampling_ratio`, plus `ratio`, its result.

    Returns:
        `dict`: `logp_difference/mean`, `logp_difference/max` (over scored completion tokens), and
        `importance_sampling_ratio/{min,mean,max}` (over completion tokens, or sequences in the sequence modes);
        each 0.0 when there is nothing to reduce, as in TRL.
    """
    keep = mask.bool()
    delta = torch.abs(old_logps - sampling_logps)
    delta = delta[keep & ~torch.isnan(delta)]
    flat = ratio.flatten() if mode.startswith("sequence") else ratio[keep]
    zero = torch.tensor(0.0, device=old_logps.device)

    def reduce(values: torch.Tensor, fn) -> torch.Tensor:
        return fn(values) if values.numel() > 0 else zero

    return {
        "logp_difference/mean": reduce(delta, torch.mean),
        "logp_difference/max": reduce(delta, torch.max),
        "importance_sampling_ratio/min": reduce(flat, torch.min),
        "importance_sampling_ratio/mean": reduce(flat, torch.mean),
        "importance_sampling_ratio/max": reduce(flat, torch.max),
    }


def sampling_metrics(gathered: dict[str, torch.Tensor]) -> dict[str, float]:
    """TRL's `sampling/*` metrics from every process's `local_statistics`, gathered (`[num_processes]` each)."""
    return {
        "sampling/sampling_logp_difference/mean": gathered["logp_difference/mean"].mean().item(),
        "sampling/sampling_logp_difference/max": gathered["logp_difference/max"].max().item(),
        "sampling/importance_sampling_ratio/min": nanmin(gathered["importance_sampling_ratio/min"]).item(),
        "sampling/importance_sampling_ratio/mean": gathered["importance_sampling_ratio/mean"]
        .nanmean()
        .item(),
        "sampling/importance_sampling_ratio/max": nanmax(gathered["importance_sampling_ratio/max"]).item(),
    }


def importance_sampling(
    batch: dict[str, Any],
    mode: str,
    clip_min: float,
    clip_max: float,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's importance-sampling ratio of a batch from its old and sampling log-probs, over the model's tokens (tool
    results left out, as TRL), and its `sampling/*` metrics over every process.

    Args:
        batch (`dict`): `old_per_token_logps`, `sampling_per_token_logps`, `completion_mask` and, with tools,
            `tool_mask`, each `[B, C]`.
        mode (`str`): TRL's `vllm_importance_sampling_mode`.
        clip_min (`float`): TRL's `vllm_importance_sampling_clip_min`.
        clip_max (`float`): TRL's `vllm_importance_sampling_clip_max`.
        gather (`Callable`): gathers a tensor over every process (a collective).

    Returns:
        `(ratio [B, C] or [B, 1], metrics)`.
    """
    old, sampling = batch["old_per_token_logps"], batch["sampling_per_token_logps"]
    mask = batch["completion_mask"] * batch.get("tool_mask", 1)  # [B, C]
    ratio = importance_sampling_ratio(old, sampling, mask, mode, clip_min, clip_max)
    local = local_statistics(old, sampling, mask, ratio, mode)
    return ratio, sampling_metrics({k: gather(v) for k, v in local.items()})
