"""Dynamic sampling (DAPO): groups whose advantages are all zero are replaced by groups of fresh prompts.

A group whose advantages are all zero costs a generation and an update and teaches nothing. With
`dynamic_sampling: true`, each generation batch is scored as soon as it is sampled; its informative groups are kept
and the others dropped, and extra rounds sample fresh prompts (a group each) until every process holds the
generation batch's number of informative groups, for at most `dynamic_sampling_max_rounds` extra rounds. A refill
round never draws a prompt already sampled in the same generation batch (kept or dropped).

A group is dropped exactly when the rewards its advantages are computed from agree within float rounding
(`no_signal`): its weighted sums (`sum_then_normalize`), or each function's rewards (`normalize_then_sum`), differ by
at most `REWARD_RTOL` of their own magnitude, so that only rounding counts as no signal, whatever the rewards' scale
(a length penalty of 1e-7 on rewards near zero is a signal, and TRL trains on it); every pattern of None rewards
agrees with the advantages training computes (an unscorable row, or a group's only scorable row, has advantage zero).

At the cap, `dynamic_sampling_at_cap` decides:
- `"error"` stops with a one-line error giving the share of groups without signal, as DAPO's reference (verl's
  `recipe/dapo`, `max_num_gen_batches`) does;
- `"fill"` completes the batch with dropped groups (zero advantage: only the KL term, with `beta > 0`, moves them);
- `"keep"` trains on every informative group, completed with dropped groups only up to the next count whose rows
  split equally into the generation batch's micro-batches (`keep_count`); a smaller batch, the same size on every
  process.

Every process runs the same number of rounds and ends with the same number of groups: both are agreed by a
collective after each round, so ZeRO-3 and DDP never wait on a process that sampled differently. The fresh prompts
come from `PromptStream`, a seeded stream of dataset indices beside the data loader's; its position is saved in every
checkpoint, so a resumed run draws the prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..advantages import group_advantages
from ..errors import VLMGRPOError

REWARD_RTOL = 4 * torch.finfo(torch.float32).eps
"""Rewards of a group that differ by at most this share of their magnitude agree (float rounding, about 5e-7)."""


@dataclass
class Round:
    """The local rows of one generation round, scored.

    Attributes:
        inputs (`list[dict]`): dataset rows, G consecutive rows per prompt.
        sampled (`Any`): what the trainer sampled for these rows (it selects rows of it with `select`).
        rewards (`torch.Tensor`): `[n, F]` reward of each function for each local row (NaN: not applicable).
        extra (`dict[str, list]`): the columns reward functions logged with `log_extra` while scoring this round,
            one value per row.
        logged (`dict[str, list[float]]`): the values reward functions logged with `log_metric` while scoring it.
    """

    inputs: list[dict[str, Any]]
    sampled: Any
    rewards: torch.Tensor
    extra: dict[str, list] = field(default_factory=dict)
    logged: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Collected:
    """The informative groups of a generation batch, in rounds; then the groups it trains on.

    Attributes:
        kept (`list[tuple[Round, int]]`): informative groups, as (round, group index in that round).
        dropped (`list[tuple[Round, int]]`): groups whose advantages are all zero.
        rounds (`int`): generation rounds run.
        prompts (`int`): prompts sampled on this process.
        filled (`int`): dropped groups used to complete the batch.
        note (`str | None`): at the cap, one line saying what the batch trains on.
    """

    kept: list[tuple[Round, int]] = field(default_factory=list)
    dropped: list[tuple[Round, int]] = field(default_factory=list)
    rounds: int = 0
    prompts: int = 0
    filled: int = 0
    note: str | None = None


def no_signal(
    rewards: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    multi_objective_aggregation: str = "sum_then_normalize",
) -> list[bool]:
    """Per group of G consecutive rows, whether the rewards its advantages come from agree within float rounding.

    With `sum_then_normalize` a row's advantage is its weighted reward minus its group's mean (scaled by a positive
    std): zero for the whole group exactly when the group's weighted sums agree. With `normalize_then_sum` each
    function is normalised within the group, so every function's rewards must agree. Rounding is measured against
    the rewards' own magnitude (`REWARD_RTOL`), not an absolute tolerance, so that a small but real spread is kept.
    Unscorable rows (every reward None) are left out, as their advantage is zero in TRL; a group with at most one
    scorable row has no signal.

    Args:
        rewards (`torch.Tensor`): `[n, F]` rewards, NaN where a function returned None.
        weights (`torch.Tensor`): `[F]` reward weights.
        num_generations (`int`): G.
        multi_objective_aggregation (`str`, *optional*, defaults to `"sum_then_normalize"`): the run's option.
    """
    if multi_objective_aggregation == "normalize_then_sum":
        columns = rewards.view(-1, num_generations, rewards.size(1))  # [n/G, G, F]
    else:
        summed = group_advantages(rewards, weights, num_generations, "none", multi_objective_aggregation)[
            1
        ]  # [n]
        columns = summed.view(-1, num_generations, 1)  # [n/G, G, 1]
    return [all(_agree(group[:, f]) for f in range(group.size(1))) for group in columns]


def _agree(values: torch.Tensor) -> bool:
    """Whether the scorable `values` `[G]` (NaN: none) agree within `REWARD_RTOL` of their magnitude."""
    scorable = values[~torch.isnan(values)]
    if scorable.numel() <= 1:
        return True
    spread = (scorable.max() - scorable.min()).item()
    return spread <= REWARD_RTOL * scorable.abs().max().item()


def keep_count(informative: int, needed: int, num_generations: int, micro_batches: int) -> int:
    """Groups `"keep"` trains on: every informative group, rounded up to a count whose rows split equally into
    the micro-batches (the added groups are dropped ones), at most `needed`.

    Args:
        informative (`int`): the fewest informative groups any process holds.
        needed (`int`): groups of a full generation batch.
        num_generations (`int`): G, rows per group.
        micro_batches (`int`): `steps_per_generation`, micro-batches the generation batch is cut into.
    """
    unit = micro_batches // math.gcd(num_generations, micro_batches)  # fewest groups whose rows split equally
    return min(needed, -(-informative // unit) * unit)


class DynamicSampling:
    """Rounds of sampling and scoring until a generation batch holds enough informative groups.

    Args:
        num_generations (`int`): G.
        max_rounds (`int`): most extra rounds per generation batch.
        at_cap (`str`): "error", "fill" or "keep" (see the module doc).
        micro_batches (`int`): micro-batches a generation batch is cut into; "keep" trains on a number of groups that
            fills them equally.
        weights (`torch.Tensor`): `[F]` reward weights.
        multi_objective_aggregation (`str`, *optional*, defaults to `"sum_then_normalize"`): the run's option.
    """

    def __init__(
        self,
        num_generations: int,
        max_rounds: int,
        at_cap: str,
        micro_batches: int,
        weights: torch.Tensor,
        multi_objective_aggregation: str = "sum_then_normalize",
    ):
        self.g, self.max_rounds, self.at_cap = num_generations, max_rounds, at_cap
        self.micro_batches, self.weights = micro_batches, weights
        self.aggregation = multi_objective_aggregation

    def collect(
        self,
        first: Round,
        sample_round: Callable[[int], Round],
        agree_min: Callable[[int], int],
        agree_max: Callable[[int], int],
    ) -> Collected:
        """Sort the first round's groups, and run extra rounds until every process has enough informative ones.

        Args:
            first (`Round`): the generation batch as the data loader gave it, sampled and scored.
            sample_round (`Callable[[int], Round]`): samples and scores that many fresh groups on this process.
            agree_min (`Callable[[int], int]`): the least of a count over all processes (a collective).
            agree_max (`Callable[[int], int]`): the greatest of a count over all processes (a collective).
        """
        needed = len(first.inputs) // self.g
        collected = Collected()
        current = first
        while True:
            self._sort(current, collected)
            collected.rounds += 1
            collected.prompts += len(current.inputs) // self.g
            if agree_min(len(collected.kept)) >= needed or collected.rounds > self.max_rounds:
                break
            current = sample_round(agree_max(max(needed - len(collected.kept), 0)))
        return collected

    def _sort(self, current: Round, collected: Collected) -> None:
        flat = no_signal(current.rewards, self.weights, self.g, self.aggregation)
        for group, dropped in enumerate(flat):
            (collected.dropped if dropped else collected.kept).append((current, group))

    def chosen(
        self,
        collected: Collected,
        needed: int,
        agree_min: Callable[[int], int],
        sum_all: Callable[[int], int] | None = None,
    ) -> list[tuple[Round, int]]:
        """The groups to train on: `needed` informative ones, or at the cap what `at_cap` says.

        Args:
            collected (`Collected`): what `collect` gathered.
            needed (`int`): groups of a full generation batch.
            agree_min (`Callable[[int], int]`): the least of a count over all processes (a collective).
            sum_all (`Callable[[int], int]`, *optional*, defaults to `None`): the sum of a count over all processes
                (a collective), for the error's figures; None on one process.

        Raises:
            `VLMGRPOError`: at the cap with `at_cap="error"`, on every process alike.
        """
        informative = agree_min(len(collected.kept))
        if informative >= needed:
            return collected.kept[:needed]
        if self.at_cap == "error":
            raise VLMGRPOError(self._cap_message(collected, needed, sum_all or (lambda n: n)))
        count = needed
        if self.at_cap == "keep" and informative > 0:
            count = keep_count(informative, needed, self.g, self.micro_batches)
        groups = collected.kept[: min(count, len(collected.kept))]
        collected.filled = count - len(groups)
        collected.note = (
            f"dynamic_sampling at the cap ({collected.rounds} rounds): {informative} of {needed} groups informative "
            f"on the poorest process; {self.at_cap} trains on {count} groups"
            + (f", {count - informative} of them without signal" if count > informative else "")
            + (" (keep with no informative group fills the whole batch)" if self.at_cap == "keep" and not informative
               else " (rounded up so the micro-batches split equally)" if self.at_cap == "keep" and count > informative
               else "")
            + "."
        )  # fmt: skip
        return groups + collected.dropped[: collected.filled]

    def _cap_message(self, collected: Collected, needed: int, sum_all: Callable[[int], int]) -> str:
        flat, sampled = sum_all(len(collected.dropped)), sum_all(collected.prompts)
        return (
            f"dynamic_sampling: after {collected.rounds} rounds (1 + dynamic_sampling_max_rounds "
            f"{self.max_rounds}) a generation batch still lacks informative groups: {flat} of {sampled} sampled "
            f"groups ({flat / max(sampled, 1):.0%}) had no reward spread, and every process needs {needed}. "
            "Raise dynamic_sampling_max_rounds, give prompts the model sometimes solves (all-solved or all-failed "
            "groups teach nothing), or set dynamic_sampling_at_cap: fill or keep to train on a padded or smaller "
            "batch."
        )


def group_rows(groups: Sequence[tuple[Round, int]], num_generations: int) -> list[tuple[Round, list[int]]]:
    """The chosen groups as runs of rows per round, in order: `[(round, [row, ...]), ...]`."""
    runs: list[tuple[Round, list[int]]] = []
    for part, group in groups:
        rows = list(range(group * num_generations, (group + 1) * num_generations))
        if runs and runs[-1][0] is part:
            runs[-1] = (part, runs[-1][1] + rows)
        else:
            runs.append((part, rows))
    return runs


def unused(
    collected: Collected, runs: Sequence[tuple[Round, list[int]]], num_generations: int
) -> list[tuple[Round, int]]:
    """The dropped groups that the batch does not train on (not used to fill it)."""
    used = {(id(part), row) for part, rows in runs for row in rows}
    return [(part, g) for part, g in collected.dropped if (id(part), g * num_generations) not in used]


def kept_and_dropped(
    collected: Collected, runs: Sequence[tuple[Round, list[int]]], num_generations: int
) -> tuple[Any, torch.Tensor, tuple[Any, torch.Tensor]]:
    """The rows the batch trains on with their rewards `[n, F]`, and the unused dropped rows with theirs `[m, F]`.

    Args:
        collected (`Collected`): the generation batch's groups.
        runs (`Sequence[tuple[Round, list[int]]]`): the chosen groups as runs of rows (see `group_rows`).
        num_generations (`int`): completions per prompt.
    """
    first = runs[0][0].sampled
    chosen = first.concat([part.sampled.select(rows) for part, rows in runs])
    rewards = torch.cat([part.rewards[rows] for part, rows in runs])  # [n, F]
    dropped = group_rows(unused(collected, runs, num_generations), num_generations)
    parts = [part.sampled.select(rows) for part, rows in dropped] or [first.select([])]
    dropped_rewards = [part.rewards[rows] for part, rows in dropped] or [rewards[:0]]
    return chosen, rewards, (first.concat(parts), torch.cat(dropped_rewards))


def chosen_logs(runs: Sequence[tuple[Round, list[int]]]) -> tuple[dict[str, list], dict[str, list[float]]]:
    """What reward functions logged for the rows the batch trains on, in their order.

    `log_extra` columns keep the chosen rows' values (None for rows of a round whose rewards did not log the
    column), so they line up with the completions table. `log_metric` values are those of the rounds that
    contribute rows (a value describes a whole reward call, which cannot be split by row).

    Args:
        runs (`Sequence[tuple[Round, list[int]]]`): the chosen groups as runs of rows (see `group_rows`).
    """
    columns = sorted({name for part, _ in runs for name in part.extra})
    extra = {name: [] for name in columns}
    for part, rows in runs:
        for name in columns:
            values = part.extra.get(name)
            if values is not None and len(values) != len(part.inputs):
                raise VLMGRPOError(
                    f"log_extra column {name!r}: {len(values)} values for a reward call over {len(part.inputs)} "
                    "completions; log one value per completion."
                )
            extra[name] += [values[i] for i in rows] if values is not None else [None] * len(rows)
    logged: dict[str, list[float]] = {}
    for part in {id(part): part for part, _ in runs}.values():
        for name, values in part.logged.items():
            logged.setdefault(name, []).extend(values)
    return extra, logged


def metrics(collected: Collected, sum_all: Callable[[float], float]) -> dict[str, float]:
    """`dynamic_sampling/*` metrics of one generation batch, summed over processes."""
    return {
        "dynamic_sampling/groups_dropped": sum_all(len(collected.dropped) - collected.filled),
        "dynamic_sampling/groups_filled": sum_all(collected.filled),
        "dynamic_sampling/rounds": float(collected.rounds),
        "dynamic_sampling/prompts": sum_all(collected.prompts),
    }
