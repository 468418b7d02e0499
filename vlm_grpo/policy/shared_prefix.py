"""Shared-prefix forwards: each group's prompt (image included) runs once, and its KV cache serves the G completions.

GRPO samples G completions per prompt. A full forward of the `[B, P+C]` rows recomputes the same prompt G times:
the vision tower, and every layer over P tokens. Here the prompt runs once per group on its first `P-1` tokens
(`use_cache=True`); the cache is then indexed to the B rows, and a second forward runs only the `C+1` remaining
tokens (the prompt's last token, whose logits score the first completion token, then the completion). Both forwards
are ordinary calls of the (wrapped) model, so gradients reach the prompt part, the vision tower included, through
the cache, and ZeRO-3, DDP and PEFT wrappers see normal forwards. Images that tools returned inside a completion
(multi-turn rollouts) go with the second forward. Under (non-reentrant) gradient checkpointing
the cache is a `ReplayableCache`, which a layer's backward replay leaves unchanged.

Rows of one group are consecutive and share one per-sample image dict object: the trainer encodes the rows that
`vlm_grpo.rollout.batch.same_prompt` calls equal once, and that shared object is how groups are found. Positions that
depend on the images (Qwen's M-RoPE) are computed by the per-model module over the full rows, so both forwards use
exactly the positions of one full forward.

Which passes share is decided once per generation batch (`sharing_plan`), and the batch's rows are shuffled
accordingly (`shuffle_batch`). A turn after a tool result continues each group's prompt from one prefill of it too
(`shared_prefix_continue`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, StaticCache
from transformers.modeling_layers import GradientCheckpointingLayer

from ..models import ModelFamily
from .image_rows import completion_images, prompt_images
from .sharing_plan import SharingPlan

CACHE = "cache" if Version(transformers.__version__) >= Version("5.24.0") else "past_key_values"
"""The name of the KV-cache argument and output of models and `generate` (`past_key_values` before 5.24)."""


@dataclass
class PromptGroups:
    """Runs of consecutive rows holding the same prompt.

    Attributes:
        first (`torch.Tensor`): `[U]` index of the first row of each group.
        index (`torch.Tensor`): `[B]` group number of each row.
    """

    first: torch.Tensor
    index: torch.Tensor

    @property
    def sizes(self) -> list[int]:
        """Rows per group, in order."""
        return torch.bincount(self.index, minlength=len(self.first)).tolist()


def find_groups(prompt_ids: torch.Tensor, image_inputs: Sequence[dict]) -> PromptGroups:
    """Group consecutive rows whose prompt ids are equal and whose prompt's image dict is the same object.

    Args:
        prompt_ids (`torch.Tensor`): `[B, P]` left-padded prompt ids (padding included in the comparison).
        image_inputs (`Sequence[dict]`): the B per-sample image dicts; copies of one prompt share one object (a row
            whose tools returned images shares its prompt's part, see `tool_rollout.ToolImageRow`).
    """
    prompts = [prompt_images(row) for row in image_inputs]
    same = [
        i > 0 and prompts[i] is prompts[i - 1] and torch.equal(prompt_ids[i], prompt_ids[i - 1])
        for i in range(prompt_ids.size(0))
    ]
    starts = [i for i, s in enumerate(same) if not s]
    index = torch.cumsum(torch.tensor([0 if s else 1 for s in same]), 0) - 1  # [B]
    return PromptGroups(first=torch.tensor(starts, dtype=torch.long), index=index)


def shuffle_batch(batch: dict[str, Any], plan: SharingPlan, key: str = "image_inputs") -> dict[str, Any]:
    """Shuffle a generation batch's rows with TRL's one draw, `torch.randperm(B)`.

    When a log-prob pass shares, groups are kept whole and in order, placed in the order the permutation gives
    their first rows, so that micro-batches hold complete groups; otherwise rows move exactly as TRL moves them.
    Either way the global generator advances exactly as in TRL, so later sampling draws what TRL's would.

    Args:
        batch (`dict`): per-row tensors `[B, ...]` and lists of length B; other values (0-d tensors, the plan) stay.
        plan (`SharingPlan`): the batch's plan.
        key (`str`, defaults to "image_inputs"): the list of per-sample image dicts used to find groups.
    """
    permutation = torch.randperm(batch["prompt_ids"].size(0))  # [B], as TRL's `shuffle_sequence_dict`
    rows = permutation
    if plan.any_log_prob_pass:
        groups = find_groups(batch["prompt_ids"], batch[key])
        place = torch.empty_like(permutation)
        place[permutation] = torch.arange(len(permutation))  # where each row lands in TRL's order
        order = sorted(range(len(groups.first)), key=lambda g: int(place[groups.first[g]]))
        rows = torch.cat([torch.nonzero(groups.index == g).flatten() for g in order])  # [B]

    def permute(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.ndim > 0:
            return v[rows.to(v.device)]
        if isinstance(v, list):
            return [v[i] for i in rows.tolist()]
        return v

    return {k: permute(v) for k, v in batch.items()}


class ReplayableCache(DynamicCache):
    """A KV cache that layers under gradient checkpointing may use: replaying a layer never changes it.

    While recording (the prompt pass), each layer stores its keys/values on its first call; a backward replay of a
    checkpointed layer calls `update` again, and gets the new states back without storing them twice. The
    completion pass gets a `read_only_rows` copy, whose `update` returns the stored states followed by the new ones
    and stores nothing, so its replays see the same cache. Returned states are those of a `DynamicCache`.
    """

    def __init__(self, config: Any):
        super().__init__(config=config)
        self.read_only = False
        self._recorded: set[int] = set()

    def read_only_rows(self, rows: torch.Tensor) -> ReplayableCache:
        """A read-only copy holding rows `rows` `[B]` of every layer; this cache stays as it is for its replays."""
        view = copy.copy(self)
        view.layers = [copy.copy(layer) for layer in self.layers]
        view.batch_select_indices(rows)  # every layer [U, ...] -> [B, ...]
        view.read_only = True
        return view

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.read_only:
            layer = self.layers[layer_idx]
            return (
                torch.cat([layer.keys, key_states], dim=-2),  # [b, heads, past + new, d]
                torch.cat([layer.values, value_states], dim=-2),
            )
        if layer_idx in self._recorded:  # backward replay of the prompt pass
            return key_states, value_states
        self._recorded.add(layer_idx)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


@contextmanager
def checkpointed_layers_keep_cache(model: torch.nn.Module) -> Iterator[None]:
    """Let gradient-checkpointed decoder layers use a `ReplayableCache` (transformers drops caches otherwise)."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # back to the class default


def _prefix_cache(
    model: torch.nn.Module,
    base_model: torch.nn.Module,
    family: ModelFamily,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    image_inputs: Sequence[dict],
    groups: PromptGroups,
    positions: torch.Tensor | None,
    cache: ReplayableCache | None = None,
) -> Any:
    """Run each group's prompt but its last token once; return the KV cache indexed to all B rows.

    `cache` (a `ReplayableCache`) is filled when given, and a read-only copy of its rows is returned; otherwise the
    model's own `DynamicCache` is returned.
    """
    first = groups.first.to(prompt_ids.device)
    inputs = family.model_inputs(
        base_model.config,
        prompt_ids[first, :-1],  # [U, P-1]
        prompt_mask[first, :-1],
        [prompt_images(image_inputs[i]) for i in groups.first.tolist()],
    )
    if positions is not None:
        inputs["position_ids"] = positions[..., first, : prompt_ids.size(1) - 1]
    rows = groups.index.to(prompt_ids.device)
    if isinstance(cache, StaticCache):
        model(**inputs, **{CACHE: cache}, use_cache=True, logits_to_keep=1)
        # groups of several rows (else each row is its own group, the cache is theirs)
        if len(first) < len(rows):
            cache.reorder_cache(rows)  # every layer [U, heads, max_cache_len, d] -> [B, ...], new buffers
            for layer in cache.layers:  # compiled decoding (CUDA graphs) keeps their addresses
                torch._dynamo.mark_static_address(layer.keys)
                torch._dynamo.mark_static_address(layer.values)
        return cache
    if cache is None:
        cache = model(**inputs, use_cache=True, logits_to_keep=1)[CACHE]
        cache.batch_select_indices(rows)  # every layer [U, ...] -> [B, ...]
        return cache
    model(**inputs, **{CACHE: cache}, use_cache=True, logits_to_keep=1)
    return cache.read_only_rows(rows)


def shared_prefix_logps(
    model: torch.nn.Module,
    base_model: torch.nn.Module,
    family: ModelFamily,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    image_inputs: Sequence[dict],
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the completions, with each group's prompt computed once.

    Args:
        model (`torch.nn.Module`): the model to call (possibly wrapped by DDP, DeepSpeed or PEFT), patched by TRL's
            `add_fused_lm_head` so that `fused_lm_head=True` returns log-probs.
        base_model (`PreTrainedModel`): the unwrapped transformers model (config, position helpers).
        family (`ModelFamily`): the family's module.
        input_ids (`torch.Tensor`): `[B, P+C]` left-padded prompts followed by right-padded completions.
        attention_mask (`torch.Tensor`): `[B, P+C]`.
        logits_to_keep (`int`): C, the completion length.
        image_inputs (`Sequence[dict]`): the B per-sample image dicts.
        compute_entropy (`bool`, defaults to False): also return per-token entropies.

    Returns:
        `(logps [B, C], entropies [B, C] | None)`, equal to those of one full forward of the rows.
    """
    prompt_len = input_ids.size(1) - logits_to_keep  # P
    groups = find_groups(input_ids[:, :prompt_len], image_inputs)
    positions = family.position_ids(
        base_model, input_ids, attention_mask, image_inputs
    )  # None or [..., B, P+C]
    suffix_ids = input_ids[:, prompt_len - 1 :]  # [B, C+1]: last prompt token, then the completion
    labels = suffix_ids[:, 1:].masked_fill(attention_mask[:, prompt_len:] == 0, -100)  # [B, C]
    shift_labels = torch.cat([labels, labels.new_full((labels.size(0), 1), -100)], dim=1)  # [B, C+1]
    with checkpointed_layers_keep_cache(model):
        cache = _prefix_cache(
            model,
            base_model,
            family,
            input_ids[:, :prompt_len],
            attention_mask[:, :prompt_len],
            image_inputs,
            groups,
            positions,
            ReplayableCache(base_model.config),
        )
        inputs = family.model_inputs(
            base_model.config, suffix_ids, attention_mask, [completion_images(row) for row in image_inputs]
        )  # the images that tools returned inside the completions, if any
        inputs[CACHE] = cache
        if positions is not None:
            inputs["position_ids"] = positions[..., prompt_len - 1 :]
        outputs = model(**inputs, shift_labels=shift_labels, fused_lm_head=True)
    logps = outputs.log_probs[:, :logits_to_keep]  # [B, C]
    entropies = outputs.entropy[:, :logits_to_keep] if compute_entropy else None
    return logps, entropies


def shared_prefix_generate(
    model: torch.nn.Module,
    base_model: torch.nn.Module,
    family: ModelFamily,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    image_inputs: Sequence[dict],
    max_cache_len: int | None = None,
    share: bool = True,
    **generate_kwargs: Any,
) -> torch.Tensor:
    """`model.generate` with each group's prompt prefilled once; the G rows of a group continue from one cache.

    Args:
        model (`PreTrainedModel`): the unwrapped model (inside `unwrap_model_for_generation`), PEFT or not.
        base_model (`PreTrainedModel`): the transformers model under PEFT (or `model` itself).
        family (`ModelFamily`): the family's module.
        prompt_ids (`torch.Tensor`): `[B, P]` left-padded prompt ids, each prompt repeated for its G rows.
        prompt_mask (`torch.Tensor`): `[B, P]`.
        image_inputs (`Sequence[dict]`): the B per-sample image dicts.
        max_cache_len (`int | None`, defaults to None): with a length, the cache is transformers' `StaticCache` of
            that many positions, preallocated once for the B rows (what a compiled decoding step needs); otherwise the
            model's growing `DynamicCache`.
        share (`bool`, defaults to True): prefill each group's prompt once; False prefills every row's (each row its
            own group, as `generate` prefills them), for a static cache on full rows.
        **generate_kwargs: passed to `generate` (e.g. `generation_config`).

    Returns:
        `[B, P+C]` the prompts followed by the sampled completions, as `generate` returns them.
    """
    rows = torch.arange(prompt_ids.size(0))  # [B]
    groups = find_groups(prompt_ids, image_inputs) if share else PromptGroups(first=rows, index=rows)
    positions = family.position_ids(base_model, prompt_ids, prompt_mask, image_inputs, generation=True)
    static = (
        None if max_cache_len is None else StaticCache(config=base_model.config, max_cache_len=max_cache_len)
    )
    cache = _prefix_cache(
        model, base_model, family, prompt_ids, prompt_mask, image_inputs, groups, positions, static
    )
    family.prepare_generation_from_cache(base_model, prompt_ids, prompt_mask, image_inputs)
    return model.generate(
        input_ids=prompt_ids, attention_mask=prompt_mask, **{CACHE: cache}, **generate_kwargs
    )


def shared_prefix_continue(
    model: torch.nn.Module,
    base_model: torch.nn.Module,
    family: ModelFamily,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    continuation_ids: torch.Tensor,
    continuation_mask: torch.Tensor,
    image_inputs: Sequence[dict],
    **generate_kwargs: Any,
) -> torch.Tensor:
    """`model.generate` of the next turn of multi-turn rows, each group's prompt prefilled once.

    Each row is its group's prompt followed by its own continuation (the turns so far and the tools' results, their
    images included). The prompt runs once per group; the cache is indexed to the rows; each row's continuation
    but its last token runs over it, with the images the tools returned; `generate` goes on from there. The rows are
    laid out as `[prompt | continuation]`, each part left-padded on its own, so the attention mask has a hole where
    a continuation is padded; positions count unpadded tokens, as `generate` counts them.

    Args:
        model (`PreTrainedModel`): the unwrapped model (inside `unwrap_model_for_generation`), PEFT or not.
        base_model (`PreTrainedModel`): the transformers model under PEFT (or `model` itself).
        family (`ModelFamily`): the family's module.
        prompt_ids (`torch.Tensor`): `[B, P]` left-padded prompt ids, rows of one group consecutive.
        prompt_mask (`torch.Tensor`): `[B, P]`.
        continuation_ids (`torch.Tensor`): `[B, T]` left-padded continuations, `T >= 1`.
        continuation_mask (`torch.Tensor`): `[B, T]`.
        image_inputs (`Sequence[dict]`): the B rows' image inputs: the prompt's (one object per group), or a
            `tool_rollout.ToolImageRow` for a row whose tools returned images.
        **generate_kwargs: passed to `generate` (e.g. `generation_config`).

    Returns:
        `[B, P+T+N]` the rows followed by the N sampled tokens, as `generate` returns them.
    """
    prompt_len = prompt_ids.size(1)  # P
    input_ids = torch.cat([prompt_ids, continuation_ids], dim=1)  # [B, P+T]
    attention_mask = torch.cat([prompt_mask, continuation_mask], dim=1)  # [B, P+T]
    groups = find_groups(prompt_ids, image_inputs)
    positions = family.position_ids(base_model, input_ids, attention_mask, image_inputs, generation=True)
    # `_prefix_cache` runs all but the last column it is given: here the prompt's P columns
    cache = _prefix_cache(
        model, base_model, family, input_ids[:, : prompt_len + 1], attention_mask[:, : prompt_len + 1],
        image_inputs, groups, positions,
    )  # fmt: skip
    if continuation_ids.size(1) > 1:
        inputs = family.model_inputs(
            base_model.config,
            input_ids[:, prompt_len:-1],  # [B, T-1]
            attention_mask[:, :-1],
            [completion_images(row) for row in image_inputs],
        )
        if positions is not None:
            inputs["position_ids"] = positions[..., prompt_len:-1]
        model(**inputs, **{CACHE: cache}, use_cache=True, logits_to_keep=1)
    family.prepare_generation_from_cache(base_model, input_ids, attention_mask, image_inputs)
    return model.generate(
        input_ids=input_ids, attention_mask=attention_mask, **{CACHE: cache}, **generate_kwargs
    )
