"""Which passes over a generation batch share each group's prompt: decided once per batch, carried with it.

`SharingPolicy` holds what is fixed for a run (`share_prompt_prefix`, whether the family's cache can be indexed to
rows, the generation config, ZeRO-3 with frozen vision, reentrant checkpointing, the router aux loss); its `plan`
makes each generation batch's `SharingPlan`, applying the `auto` rule (`sharing_pays`) where it matters. The
shared-prefix forwards themselves are in `shared_prefix`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig
from transformers.generation.configuration_utils import GenerationMode

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
        zero3_vision_trains (`bool`, defaults to False): ZeRO-3 over several processes with the vision tower trained:
            images inside completions then need full rows too, since the completion's forward over the cache would
            run the vision tower a second time on the processes that hold such images only (ZeRO-3 gathers its
            parameters collectively), where a full row runs it once on every process (see `vision_dummy`).
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
        zero3_vision_trains: bool = False,
    ):
        self.mode = mode
        self.bidirectional_images = bidirectional_images
        self.zero3_vision_trains = zero3_vision_trains
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

    def shares_later_turns(self, generation: bool) -> bool:
        """Whether the turns after a tool result continue each group's prompt from one prefill of it: where the first
        turn's sampling did (`generation`, from `shares_generation`), unless an image's tokens attend to each other
        (a tool's image in a row's continuation would see the prompt's cache causally).

        Args:
            generation (`bool`): whether this batch's first turn was sampled from one prefill of each prompt.
        """
        return generation and not self.bidirectional_images

    def completion_images_need_full_rows(self) -> str | None:
        """Why the log-prob passes of a batch whose completions hold images (tool results) run full rows, or None."""
        if self.bidirectional_images:
            return "tool results hold images, attended bidirectionally"
        if self.zero3_vision_trains:
            return "tool results hold images, and ZeRO-3 trains the vision tower over several processes"
        return None

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
                results); where `completion_images_need_full_rows` says so, the log-prob passes then run full rows.
                It must be the same on every process.
        """
        reasons = self._reasons(prompt_len, completion_len, group_sizes, agree)
        why = self.completion_images_need_full_rows()
        if completion_images and why:
            for name in ("scoring", "training"):
                reasons[name] = (*reasons.get(name, ()), why)
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
