"""Dynamic sampling (DAPO): groups whose completions all score alike are replaced by groups of fresh prompts.

A group whose G rewards have zero spread has zero advantage: it costs a generation and an update and teaches nothing.
With `dynamic_sampling: true`, each generation batch is scored as soon as it is sampled; its informative groups are
kept and the others dropped, and extra rounds sample fresh prompts (a group each) until every process holds the
generation batch's number of informative groups, for at most `dynamic_sampling_max_rounds` extra rounds. At the cap,
`dynamic_sampling_at_cap` decides: `"fill"` completes the batch with dropped groups, as DAPO's reference does;
`"keep"` trains on the informative groups alone (a smaller batch, the same size on every process).

Every process runs the same number of rounds and ends with the same number of groups: both are agreed by a
collective after each round, so ZeRO-3 and DDP never wait on a process that sampled differently. The fresh prompts
come from `PromptStream`, a seeded stream of dataset indices beside the data loader's; its position is saved in every
checkpoint, so a resumed run draws the prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .advantages import group_advantages

STATE_FILE = "prompt_stream.json"
"""The stream's position, in each checkpoint folder."""


class PromptStream:
    """Dataset indices for the extra rounds: a new seeded permutation of the dataset for each pass over it.

    Args:
        size (`int`): number of prompts in the dataset.
        seed (`int`): seed of the permutations (pass e of the data uses `seed + e`).
    """

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.taken = 0  # indices handed out so far, over every pass

    def take(self, count: int) -> list[int]:
        """The next `count` indices of the stream."""
        out = []
        while len(out) < count:
            epoch, offset = divmod(self.taken, self.size)
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch))
            chunk = order[offset : offset + count - len(out)].tolist()
            out += chunk
            self.taken += len(chunk)
        return out

    def save(self, folder: str | Path) -> None:
        """Write the position to `folder/prompt_stream.json`."""
        (Path(folder) / STATE_FILE).write_text(json.dumps({"taken": self.taken, "seed": self.seed}))

    def load(self, folder: str | Path) -> None:
        """Restore the position saved in `folder` (a checkpoint written without dynamic sampling has none)."""
        path = Path(folder) / STATE_FILE
        if path.is_file():
            self.taken = int(json.loads(path.read_text())["taken"])


@dataclass
class Round:
    """The local rows of one generation round, scored.

    Attributes:
        inputs (`list[dict]`): dataset rows, G consecutive rows per prompt.
        sampled (`Any`): what the trainer sampled for these rows (it selects rows of it with `select`).
        rewards (`torch.Tensor`): `[n, F]` reward of each function for each local row (NaN: not applicable).
    """

    inputs: list[dict[str, Any]]
    sampled: Any
    rewards: torch.Tensor


@dataclass
class Collected:
    """The informative groups of a generation batch, in rounds; then the groups it trains on.

    Attributes:
        kept (`list[tuple[Round, int]]`): informative groups, as (round, group index in that round).
        dropped (`list[tuple[Round, int]]`): groups with zero reward spread.
        rounds (`int`): generation rounds run.
        prompts (`int`): prompts sampled on this process.
        filled (`int`): dropped groups used to complete the batch at the cap.
    """

    kept: list[tuple[Round, int]] = field(default_factory=list)
    dropped: list[tuple[Round, int]] = field(default_factory=list)
    rounds: int = 0
    prompts: int = 0
    filled: int = 0


def zero_spread(rewards: torch.Tensor, weights: torch.Tensor, num_generations: int) -> list[bool]:
    """Per group of G consecutive rows, whether its weighted rewards have zero spread (the GRPO advantage is 0)."""
    _, _, is_std_zero = group_advantages(rewards, weights, num_generations)  # [n]
    return is_std_zero.view(-1, num_generations)[:, 0].tolist()


class DynamicSampling:
    """Rounds of sampling and scoring until a generation batch holds enough informative groups.

    Args:
        num_generations (`int`): G.
        max_rounds (`int`): most extra rounds per generation batch.
        at_cap (`str`): "fill" or "keep" (see the module doc).
        micro_batches (`int`): micro-batches a generation batch is cut into; "keep" trains on a number of groups that
            fills them equally.
        weights (`torch.Tensor`): `[F]` reward weights.
    """

    def __init__(self, num_generations: int, max_rounds: int, at_cap: str, micro_batches: int, weights):
        self.g, self.max_rounds, self.at_cap = num_generations, max_rounds, at_cap
        self.micro_batches, self.weights = micro_batches, weights

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
        for group, flat in enumerate(zero_spread(current.rewards, self.weights, self.g)):
            (collected.dropped if flat else collected.kept).append((current, group))

    def chosen(
        self, collected: Collected, needed: int, agree_min: Callable[[int], int]
    ) -> list[tuple[Round, int]]:
        """The groups to train on: `needed` informative ones, or at the cap what `at_cap` says."""
        if agree_min(len(collected.kept)) >= needed:
            return collected.kept[:needed]
        if self.at_cap == "keep":
            count = agree_min(len(collected.kept))
            count -= count % self.micro_batches  # whole groups in equal micro-batches
            if count > 0:
                return collected.kept[:count]
        groups = collected.kept[:needed]
        collected.filled = needed - len(groups)
        return groups + collected.dropped[: collected.filled]


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


def metrics(collected: Collected, sum_all: Callable[[float], float]) -> dict[str, float]:
    """`dynamic_sampling/*` metrics of one generation batch, summed over processes."""
    return {
        "dynamic_sampling/groups_dropped": sum_all(len(collected.dropped) - collected.filled),
        "dynamic_sampling/groups_filled": sum_all(collected.filled),
        "dynamic_sampling/rounds": float(collected.rounds),
        "dynamic_sampling/prompts": sum_all(collected.prompts),
    }
