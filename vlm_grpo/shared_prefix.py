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
`vlm_grpo.rollout.same_prompt` calls equal once, and that shared object is how groups are found. Positions that
depend on the images (Qwen's M-RoPE) are computed by the per-model module over the full rows, so both forwards use
exactly the positions of one full forward.

Which passes share is decided once per generation batch (`SharingPolicy.plan` -> `SharingPlan`), and the batch's
rows are shuffled accordingly (`shuffle_batch`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, GenerationConfig
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_layers import GradientCheckpointingLayer

from .models import ModelFamily
from .tool_rollout import completion_images, prompt_images

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


SHARING_MIN_SAVED = 0.3
"""`share_prompt_prefix: auto` shares when the prompt tokens it saves are at least this share of a pass's tokens."""
SHARING_LARGE_GROUP = 8
"""It also shares when every group has at least this many rows ..."""
SHARING_LARGE_GROUP_MIN_SAVED = 0.05
"""... and the prompt tokens it saves are at least this share of a pass's tokens."""


def saved_share(prompt_len: int, completion_len: int, group_sizes: Sequence[int]) -> float:
    """Share of a pass's tokens that running each group's prompt once saves: `(G-1)(P-1) / G(P+C)` per group."""
    rows = sum(group_sizes)
    if rows == 0:
        return 0.0
    return (rows - len(group_sizes)) * max(prompt_len - 1, 0) / (rows * (prompt_len + completion_len))


def sharing_pays(prompt_len: int, completion_len: int, group_sizes: Sequence[int]) -> bool:
    """Whether running each group's prompt once saves enough of a pass to pay for the second forward call.

    The shared path computes `P-1` prompt tokens once per group instead of once per row, but makes two model calls
    (prompt, then completions) where full rows make one. With G rows per group, it saves `(G-1)(P-1)` of the
    `G(P+C)` tokens of a group. `auto` shares when that is at least `SHARING_MIN_SAVED` of the pass, or at least
    `SHARING_LARGE_GROUP_MIN_SAVED` when every group has `SHARING_LARGE_GROUP` rows or more (the rule
    `benchmarks/bench_sharing.py` measures; see docs).

    Args:
        prompt_len (`int`): P, prompt tokens (padded width).
        completion_len (`int`): C, completion tokens (padded width, or the most that will be sampled).
        group_sizes (`Sequence[int]`): rows per group.
    """
    if not group_sizes:
        return False
    saved = saved_share(prompt_len, completion_len, group_sizes)
    large_groups = min(group_sizes) >= SHARING_LARGE_GROUP
    return saved >= SHARING_MIN_SAVED or (large_groups and saved >= SHARING_LARGE_GROUP_MIN_SAVED)


PASSES = ("generation", "scoring", "training")
"""The passes over a generation batch: sampling, the old/reference log-prob passes (no gradient), and the policy's
forward that the loss backpropagates through."""


@dataclass(frozen=True)
class SharingPlan:
    """Which passes over one generation batch run each group's prompt once; the others run full rows.

    Made once per generation batch by `SharingPolicy.plan` and carried with the batch's micro-batches, so that an
    evaluation in between never changes what a buffered training batch does.

    Attributes:
        generation (`bool`): sampling prefills each group's prompt once.
        scoring (`bool`): the old and reference log-prob passes (no gradient) share.
        training (`bool`): the policy's training forward shares.
        reasons (`dict[str, tuple[str, ...]]`): for each pass that runs full rows, why.
    """

    generation: bool
    scoring: bool
    training: bool
    reasons: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def shares(self, builds_graph: bool, aux_loss: bool = False) -> bool:
        """Whether a log-prob pass shares: the training forward when it builds a graph or returns the aux loss."""
        return self.training if builds_graph or aux_loss else self.scoring

    @property
    def any_log_prob_pass(self) -> bool:
        """Whether some log-prob pass shares: then micro-batches must keep groups whole (see `shuffle_batch`)."""
        return self.scoring or self.training


FULL_ROWS = SharingPlan(False, False, False, {p: ("no plan was made for this batch",) for p in PASSES})
"""The plan of a batch that no rollout planned: every pass runs full rows."""


def generation_obstacle(config: GenerationConfig) -> str | None:
    """Why `generate` with this (merged) generation config cannot continue from a prompt cache; None if it can.

    The shared path hands `generate` a `DynamicCache` of the B rows: any option that builds its own cache, changes
    the number of rows, or runs another decoding loop than sampling or greedy search needs full rows.
    """
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
        return f"generation_kwargs select {mode.value} decoding"
    if (config.num_return_sequences or 1) > 1:
        return "generation_kwargs set num_return_sequences > 1"
    if config.use_cache is False:
        return "generation_kwargs set use_cache: false"
    if config.cache_implementation is not None:
        return f"cache_implementation {config.cache_implementation!r} makes generate build its own cache"
    if config.prefill_chunk_size is not None:
        return "generation_kwargs set prefill_chunk_size (generate prefills the prompt itself)"
    if config.token_healing:
        return "generation_kwargs set token_healing (generate rewrites the prompt's last tokens)"
    return None


VLLM_SAMPLES = "vLLM samples the completions (with its own prefix cache)"


class SharingPolicy:
    """What decides, for every generation batch, which passes share each group's prompt (see `SharingPlan`).

    Fixed for a run: `share_prompt_prefix`, whether the family's cache can be indexed from groups to rows, the
    merged generation config, ZeRO-3 with frozen vision (its log-prob passes run full rows: a shared pass that runs
    no trained vision parameter fails in backward, TRL's fused LM head handing a full-size gradient to the
    partitioned `lm_head`), reentrant gradient checkpointing (it detaches what a layer writes to the KV cache) and
    the router aux loss (it needs every row's router logits). Per batch, under `auto`: `sharing_pays`.

    Args:
        mode (`str`): `share_prompt_prefix`, one of "true", "false", "auto".
        model_type (`str`): the family's `config.model_type`, for the reasons.
        indexable_cache (`bool`): the family's `ModelFamily.indexable_cache`.
        generation_config (`GenerationConfig | None`): the merged config `generate` runs with; None when vLLM samples.
        zero3_frozen_vision (`bool`, defaults to False): ZeRO-3 with the vision tower frozen.
        reentrant_checkpointing (`bool`, defaults to False): gradient checkpointing with `use_reentrant: true`.
        aux_loss (`bool`, defaults to False): the training forward returns the router aux loss.
        bidirectional_images (`bool`, defaults to False): the language model attends bidirectionally among each
            image's tokens (`ModelFamily.bidirectional_image_attention`): images inside completions (tool results)
            then need full rows, as the completion's forward over the cache would see them causally.
    """

    def __init__(
        self,
        mode: str,
        model_type: str,
        indexable_cache: bool,
        generation_config: GenerationConfig | None,
        zero3_frozen_vision: bool = False,
        reentrant_checkpointing: bool = False,
        aux_loss: bool = False,
        bidirectional_images: bool = False,
    ):
        self.mode = mode
        self.bidirectional_images = bidirectional_images
        every = []
        if mode == "false":
            every.append("share_prompt_prefix is false")
        if not indexable_cache:
            every.append(f"{model_type}'s cache cannot be indexed from groups to rows")
        obstacle = VLLM_SAMPLES if generation_config is None else generation_obstacle(generation_config)
        scoring = ["ZeRO-3 with frozen vision"] if zero3_frozen_vision else []
        training = list(scoring)
        if reentrant_checkpointing:
            training.append("reentrant gradient checkpointing")
        if aux_loss:
            training.append("the router aux loss needs every row")
        self.fixed: dict[str, tuple[str, ...]] = {
            "generation": (*every, *([obstacle] if obstacle else [])),
            "scoring": (*every, *scoring),
            "training": (*every, *training),
        }

    def describe(self) -> str | None:
        """One line naming the passes that always run full rows and why, or None when every pass may share."""
        told = {name: [w for w in why if w != VLLM_SAMPLES] for name, why in self.fixed.items()}
        parts = [f"{name}: {'; '.join(why)}" for name, why in told.items() if why]
        if not parts or self.mode == "false":
            return None
        return "share_prompt_prefix: full rows in " + ", ".join(parts) + "."

    def shares_generation(
        self,
        prompt_len: int,
        max_completion_len: int,
        group_sizes: Sequence[int],
        agree: Callable[[bool], bool],
    ) -> bool:
        """Whether sampling this generation batch prefills each group's prompt once (decided before sampling).

        Args are those of `plan`, with the most tokens that can be sampled as the completion width.
        """
        return "generation" not in self._reasons(prompt_len, max_completion_len, group_sizes, agree)

    def plan(
        self,
        prompt_len: int,
        completion_len: int,
        group_sizes: Sequence[int],
        agree: Callable[[bool], bool],
        generation: bool,
        completion_images: bool = False,
    ) -> SharingPlan:
        """The plan of one generation batch, made once its completions are sampled.

        Args:
            prompt_len (`int`): P, the padded prompt width.
            completion_len (`int`): C, the padded completion width.
            group_sizes (`Sequence[int]`): rows per group, in order.
            agree (`Callable[[bool], bool]`): whether a local "sharing pays" holds on every process; all processes
                must take the same decision, as ZeRO-3 gathers parameters collectively in each forward.
            generation (`bool`): what `shares_generation` decided for this batch's sampling.
            completion_images (`bool`, *optional*, defaults to `False`): some completion holds images (tool
                results); with bidirectional image attention the log-prob passes then run full rows. It must be the
                same on every process.
        """
        reasons = self._reasons(prompt_len, completion_len, group_sizes, agree)
        if completion_images and self.bidirectional_images:
            for name in ("scoring", "training"):
                reasons[name] = (*reasons.get(name, ()), "tool results hold images, attended bidirectionally")
        if generation:
            reasons.pop("generation", None)
        else:
            reasons.setdefault("generation", ("decided before sampling",))
        return SharingPlan(
            generation=generation,
            scoring="scoring" not in reasons,
            training="training" not in reasons,
            reasons=reasons,
        )

    def _reasons(
        self, prompt_len: int, completion_len: int, group_sizes: Sequence[int], agree: Callable[[bool], bool]
    ) -> dict[str, tuple[str, ...]]:
        """For each pass that runs full rows, why; the `auto` rule is applied (and agreed on) when it matters."""
        reasons = {name: why for name, why in self.fixed.items() if why}
        if self.mode == "auto" and any(name not in reasons for name in PASSES):
            if not agree(sharing_pays(prompt_len, completion_len, group_sizes)):
                saved = saved_share(prompt_len, completion_len, group_sizes)
                why = f"auto: sharing saves {saved:.0%} of a pass's tokens (or less on another process)"
                reasons = {name: (*reasons.get(name, ()), why) for name in PASSES}
        return reasons


def group_sizes(encoded: Sequence[Any]) -> list[int]:
    """Rows per group of a generation batch whose rows of one prompt share one encoding object."""
    sizes: list[int] = []
    for i, item in enumerate(encoded):
        if i > 0 and item is encoded[i - 1]:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


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
        **generate_kwargs: passed to `generate` (e.g. `generation_config`).

    Returns:
        `[B, P+C]` the prompts followed by the sampled completions, as `generate` returns them.
    """
    groups = find_groups(prompt_ids, image_inputs)
    positions = family.position_ids(base_model, prompt_ids, prompt_mask, image_inputs, generation=True)
    cache = _prefix_cache(model, base_model, family, prompt_ids, prompt_mask, image_inputs, groups, positions)
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
