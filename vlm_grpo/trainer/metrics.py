"""What a training step logs of its rollout: TRL's length and reward metrics and its completions table.

The metrics are computed from tensors already gathered over every process, as TRL 1.16's
`GRPOTrainer._generate_and_score_completions` computes them, plus length percentiles (see `runtime.monitoring`). The
step's samples are written by `runtime.sample_log`.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather, gather_object
from trl.trainer.utils import nanstd

from ..data.rows import reward_prompts, row_images
from ..rollout.batch import is_truncated
from ..runtime.monitoring import length_stats


def lengths_of(
    encoded: list[Any],
    completion_ids: list[list[int]],
    tool_mask: list[list[int]] | None,
    eos_token_ids: list[int],
    pad_token_id: int,
    device: torch.device,
) -> tuple[int, dict[str, float]]:
    """`(tokens, metrics)` of a batch's rows over every process (a collective): the prompt and completion tokens
    (with tools, the model's tokens only, as TRL counts them) and `length_metrics`.

    Args:
        encoded (`list[EncodedPrompt]`): this process's rows' prompts.
        completion_ids (`list[list[int]]`): their completions.
        tool_mask (`list[list[int]]`, *optional*): with tools, 1 on the model's tokens.
        eos_token_ids (`list[int]`): a completion that ends on neither these nor pad is truncated.
        pad_token_id (`int`): the tokenizer's pad id.
        device (`torch.device`): where the gathered tensors go.
    """
    prompt_lengths = gather(torch.tensor([len(e.input_ids) for e in encoded], device=device))  # [N]
    counted = [len(i) for i in completion_ids] if tool_mask is None else [sum(m) for m in tool_mask]
    lengths = gather(torch.tensor(counted, device=device)).float()  # [N]
    truncated = [is_truncated(i, eos_token_ids, pad_token_id) for i in completion_ids]
    truncated = gather(torch.tensor(truncated, device=device))  # [N]
    tokens = int(prompt_lengths.sum().item() + lengths.sum().item())
    return tokens, length_metrics(prompt_lengths, lengths, truncated)


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


def log_completions(trainer: Any, mode: str, sampled: Any, rewards_per_func, advantages) -> dict[str, list]:
    """The completions table (TRL's `_logs`), the rewards' own `log_extra` columns and `log_metric` values, as TRL's
    `_generate_and_score_completions` records them; every process calls it. Returns the `log_extra` columns of every
    process's rows (for the sample log).

    Args:
        trainer (`VLMGRPOTrainer`): whose `_logs`, `_metrics` and pending reward logs are written.
        mode (`str`): "train" or "eval".
        sampled (`Sampled`): this process's rows (dataset rows and completions; their prompts as the rewards received
            them).
        rewards_per_func (`torch.Tensor`): `[N, F]` rewards of every process's rows.
        advantages (`torch.Tensor`): `[N]` advantages of every process's rows.
    """
    inputs, completions, prompts = sampled.inputs, sampled.completions, reward_prompts(sampled.inputs)
    logs, pending_extra, pending_metrics = (
        trainer._logs,
        trainer._pending_extra_logs,
        trainer._pending_metrics,
    )
    logs["prompt"].extend(gather_object(prompts))
    logs["completion"].extend(gather_object(completions))
    for i, name in enumerate(trainer.reward_func_names):
        logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
    logs["advantages"].extend(advantages.tolist())
    # Sorted keys: every process must gather the same names in the same order.
    columns: dict[str, list] = {}
    for column in sorted(set(gather_object(list(pending_extra)))):
        columns[column] = gather_object(pending_extra.get(column, [None] * len(prompts)))
        logs["extra"][column].extend(columns[column])
    pending_extra.clear()
    for name in sorted(set(gather_object(list(pending_metrics)))):
        values = pending_metrics.get(name, [])
        local = torch.tensor(
            [sum(values), len(values)], dtype=torch.float32, device=trainer.accelerator.device
        )
        total, count = trainer.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        trainer._metrics[mode][name].append(total / count)
    pending_metrics.clear()
    if trainer.log_multimodal and ("images" in inputs[0] or "image" in inputs[0]):  # alike on every process
        logs["images"].extend(gather_object([row_images(x) or None for x in inputs]))
    return columns
