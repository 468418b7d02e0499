"""Small pieces of a rollout that do not depend on the model: images of a row, the same-prompt rule, padding.

The trainer (`VLMGRPOTrainer._generate_and_score_completions`), evaluation (`vlm_grpo.cli.evaluate`) and the vLLM
payload (`vlm_grpo.rollout.vllm.payload`) share them, so that each rule exists once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from trl.trainer.utils import pad

if TYPE_CHECKING:
    from ..models import EncodedPrompt


def pad_rows(
    rows: Sequence[Sequence[float]] | Sequence[torch.Tensor],
    padding_value: float,
    padding_side: str,
    pad_to_multiple_of: int | None = None,
    dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad variable-length rows into one tensor, and the matching 0/1 mask.

    Args:
        rows (`Sequence`): B rows of token ids (or per-token values).
        padding_value (`float`): the value written into the padding.
        padding_side (`str`): "left" (prompts) or "right" (completions).
        pad_to_multiple_of (`int | None`, defaults to None): widen to a multiple of this (TRL's `pad_to_multiple_of`).
        dtype (`torch.dtype`, defaults to `torch.long`): dtype of rows given as lists.

    Returns:
        `(values [B, L], mask [B, L])`.
    """
    tensors = [r if isinstance(r, torch.Tensor) else torch.tensor(list(r), dtype=dtype) for r in rows]
    values = pad(tensors, padding_value, padding_side, pad_to_multiple_of=pad_to_multiple_of)  # [B, L]
    ones = [torch.ones(len(t), dtype=torch.long) for t in tensors]
    mask = pad(ones, 0, padding_side, pad_to_multiple_of=pad_to_multiple_of)  # [B, L]
    return values, mask


def is_truncated(
    completion_ids: Sequence[int], eos_token_ids: Sequence[int], pad_token_id: int | None
) -> bool:
    """Whether a completion stopped at the length limit: it does not end on an eos (or pad) token, as in TRL."""
    return not completion_ids or completion_ids[-1] not in (*eos_token_ids, pad_token_id)


@dataclass
class Sampled:
    """What one generation round sampled, per local row (G consecutive rows per prompt).

    Attributes:
        inputs (`list[dict]`): the dataset rows (with environments, their prompts after `reset()`).
        encoded (`list[EncodedPrompt]`): their encoded prompts; the rows of one group share one object.
        completion_ids (`list[list[int]]`): each row's completion, cut after its first eos; with tools, every turn
            (the model's, and the tool results between them).
        sampling_logps (`list[list[float]] | None`): with vLLM, the sampled tokens' log-probs.
        completions (`list[list[dict]]`): the decoded completions, conversational (with tools, every message).
        shared_generation (`bool`): whether sampling prefilled each group's prompt once.
        tool_mask (`list[list[int]] | None`): with tools, 1 on the model's tokens and 0 on tool results (TRL's).
        tool_images (`list[list[PIL.Image.Image]] | None`): with tools, the images each row's tools returned.
        tool_calls (`list[tuple[int, int, int]] | None`): with tools, each row's calls, failed calls and timeouts.
        environments (`list | None`): with `environment_factory`, each row's environment instance (the rewards get
            them, as in TRL).
        failures (`list[str | None] | None`): with environments, why a row failed (its `reset()` raised), else None.
    """

    inputs: list[dict[str, Any]]
    encoded: list[EncodedPrompt]
    completion_ids: list[list[int]]
    sampling_logps: list[list[float]] | None
    completions: list[list[dict[str, Any]]]
    shared_generation: bool
    tool_mask: list[list[int]] | None = None
    tool_images: list[list[Any]] | None = None
    tool_calls: list[tuple[int, int, int]] | None = None
    environments: list[Any] | None = None
    failures: list[str | None] | None = None

    def select(self, rows: Sequence[int]) -> Sampled:
        """These rows, in this order."""
        picked = {
            f.name: None if getattr(self, f.name) is None else [getattr(self, f.name)[i] for i in rows]
            for f in fields(self)
            if f.name != "shared_generation"
        }
        return Sampled(**picked, shared_generation=self.shared_generation)

    @staticmethod
    def concat(parts: Sequence[Sampled]) -> Sampled:
        """The rows of `parts`, one after the other (the first part's `shared_generation`)."""
        chained = {
            f.name: None
            if getattr(parts[0], f.name) is None
            else [x for part in parts for x in getattr(part, f.name)]
            for f in fields(Sampled)
            if f.name != "shared_generation"
        }
        return Sampled(**chained, shared_generation=parts[0].shared_generation)


def pad_batch(
    encoded: list[EncodedPrompt],
    completion_ids_list: list[list[int]],
    sampling_logps_list: list[list[float | None]] | None,
    pad_token_id: int,
    pad_to_multiple_of: int | None,
    mask_truncated_after: Sequence[int] | None,
    device: torch.device,
    tool_mask_list: list[list[int]] | None = None,
    completion_images: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """Padded `[B, P]` prompts and `[B, C]` completions with masks, as TRL pads them, on `device`.

    `mask_truncated_completions` masks a truncated row out of the loss as TRL does (its `completion_mask` zero),
    except for a row whose completion holds images (tool results): its completion stays attended, so that the image's
    tokens keep their place in the positions the model computes from the attention mask (M-RoPE indexes the image
    runs it finds there; TRL fails on such a row), and its `tool_mask`, which only the loss reads, is zero instead.

    Args:
        encoded (`list[EncodedPrompt]`): the rows' encoded prompts.
        completion_ids_list (`list[list[int]]`): the rows' completions.
        sampling_logps_list (`list[list[float | None]]`, *optional*): with vLLM, the sampled tokens' log-probs
            (None where vLLM gave NaN); padded into `sampling_per_token_logps`.
        pad_token_id (`int`): the tokenizer's pad id.
        pad_to_multiple_of (`int`, *optional*): TRL's `pad_to_multiple_of`.
        mask_truncated_after (`Sequence[int]`, *optional*): with `mask_truncated_completions`, the eos ids: a
            completion that ends on neither eos nor pad is masked out entirely.
        device (`torch.device`): where the tensors go.
        tool_mask_list (`list[list[int]]`, *optional*, defaults to `None`): with tools, each row's TRL `tool_mask`
            (0 on tool results), padded with 1 into `tool_mask` as TRL pads it.
        completion_images (`Sequence[bool]`, *optional*, defaults to `None`): with tools, whether each row's
            completion holds images.

    Returns:
        `dict`: `prompt_ids`, `prompt_mask`, `completion_ids`, `completion_mask`, `image_inputs` (per row),
        `sampling_per_token_logps` with vLLM and `tool_mask` with tools.
    """
    multiple = pad_to_multiple_of
    prompt_ids, prompt_mask = pad_rows(
        [e.input_ids for e in encoded], pad_token_id, "left", multiple
    )  # [B, P]
    completion_ids, completion_mask = pad_rows(completion_ids_list, pad_token_id, "right", multiple)  # [B, C]
    tool_mask = None
    if tool_mask_list is not None:
        tool_mask = pad_rows(tool_mask_list, 1, "right", multiple)[0]  # [B, C]
    if mask_truncated_after is not None:
        truncated = torch.tensor(
            [is_truncated(c, mask_truncated_after, pad_token_id) for c in completion_ids_list]
        )  # [B]
        attended = torch.tensor(completion_images or [False] * len(completion_ids_list))  # [B]
        completion_mask = completion_mask * (~truncated | attended).unsqueeze(1).int()
        if tool_mask is not None:
            tool_mask = tool_mask * (~truncated).unsqueeze(1).int()
    batch = {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "image_inputs": [e.image_inputs for e in encoded],
    }
    if tool_mask is not None:
        batch["tool_mask"] = tool_mask.to(device)
    if sampling_logps_list is not None:  # vLLM replaces a NaN log-prob with None
        rows = [[float("nan") if x is None else x for x in r] for r in sampling_logps_list]
        logps, _ = pad_rows(rows, 0.0, "right", multiple, dtype=torch.float32)  # [B, C]
        batch["sampling_per_token_logps"] = logps.to(device)
    return batch


def across_processes(
    accelerator: Any, value: float | bool, reduce: Callable[[torch.Tensor], torch.Tensor]
) -> float:
    """`reduce` (`torch.min`, `max`, `sum`, `all`, `any`) of a number over every process; every process must call it.

    Args:
        accelerator (`Accelerator`): the trainer's.
        value (`float | bool`): this process's number.
        reduce (`Callable[[torch.Tensor], torch.Tensor]`): how the gathered numbers become one.
    """
    gathered = accelerator.gather(torch.tensor([value], device=accelerator.device))
    return reduce(gathered).item()
