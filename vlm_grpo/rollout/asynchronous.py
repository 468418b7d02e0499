"""Asynchronous rollouts: the next generation batches are sampled on the vLLM server while this one trains.

`AsyncRollouts` runs the rollout (`Rollout.sample`) on a background thread, over the training data in the order the
trainer will ask for it, up to `max_staleness` generation batches ahead of the one being trained. The trainer takes
each batch when its step needs it (`take`); meanwhile the thread samples the next. The thread only talks to the
server (generation is vLLM's, in another process or on other devices), so the trainer's devices train while the
server samples.

Versions and staleness. The policy's version is the trainer's optimizer step count; each batch carries the version of
the weights the server held when it was sampled. The trainer sends its weights to the server (every
`weight_sync_steps` optimizer steps) right before it takes a batch, and a batch may only start sampling once the batch
`max_staleness` places before it has been taken: with weights sent every step, a batch trains at most
`max_staleness` steps after the weights it was sampled with. A batch older than that (weights sent less often) is
dropped, counted, and sampled again with the current weights. No weight sync runs while a batch is being sampled
(one lock), so that every row of a batch comes from one version.

Correction. The PPO ratio's old policy is the trainer's weights when the batch trains (the old log-prob pass always
runs); TRL's `vllm_importance_sampling_correction` weights each completion by the ratio of those to the server's
sampling log-probs, with its modes and cap, which is what corrects the off-policy samples.

Dynamic sampling runs in the thread with the rest of the rollout: a batch's refill rounds sample fresh prompts (from
the same `PromptStream`) with the batch's version, and score them with the trainer's rewards (which never run while
the trainer's own step reads what they log).

Accounting: every row sampled is trained, set aside by dynamic sampling (a group without signal, `filtered`), or
dropped as stale (`counts`), batches the run never reached (sampled ahead when it stops) included, as `unused`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .prompt_stream import prompt_key
from .rollout import Rollout, RolloutBatch

logger = logging.getLogger(__name__)


@dataclass
class Ahead:
    """A generation batch sampled ahead.

    Attributes:
        keys (`list[str]`): its rows' prompts (`prompt_key`), to match the batch the trainer asks for.
        batch (`RolloutBatch | None`): what the rollout made of it (None when sampling failed).
        version (`int`): the policy version the server sampled it with.
        error (`BaseException | None`): what sampling raised, re-raised in the trainer.
    """

    keys: list[str]
    batch: RolloutBatch | None
    version: int
    error: BaseException | None = None


@dataclass
class Counts:
    """Rows of an asynchronous run, so far: `sampled == trained + filtered + dropped + unused + queued` holds at every
    take.

    Attributes:
        sampled (`int`): rows the server sampled, dynamic sampling's refill rounds included (stale ones sampled again
            count twice).
        trained (`int`): rows handed to the trainer.
        filtered (`int`): rows dynamic sampling set aside (groups without signal that the batch did not train on).
        dropped (`int`): rows too stale to train, sampled again.
        unused (`int`): rows sampled ahead of a batch the run did not reach.
    """

    sampled: int = 0
    trained: int = 0
    filtered: int = 0
    dropped: int = 0
    unused: int = 0


@dataclass
class Waits:
    """Seconds spent waiting since the last report: the trainer for a batch, the thread for room to sample."""

    trainer: float = 0.0
    generator: float = 0.0
    staleness: list[int] = field(default_factory=list)


class AsyncRollouts:
    """Samples generation batches ahead on a background thread (see the module doc).

    Args:
        rollout (`Rollout`): the rollout, with a `VLLMSampler` in server mode.
        batches (`Iterator[list[dict]]`): the training data's generation batches, in the trainer's order.
        max_staleness (`int`): how many batches may be sampled ahead of the one training (and how many optimizer
            steps a batch's weights may lag).
    """

    def __init__(self, rollout: Rollout, batches: Iterator[list[dict[str, Any]]], max_staleness: int):
        self.rollout, self.batches, self.max_staleness = rollout, batches, max_staleness
        self.lock = threading.Lock()  # held while a batch samples, and while the weights go to the server
        self.counts, self.waits = Counts(), Waits()
        self._ready: queue.Queue[Ahead | None] = queue.Queue()
        self._room = threading.Semaphore(max_staleness)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------ trainer side
    def take(self, inputs: list[dict[str, Any]], version: int) -> RolloutBatch:
        """The sampled batch of the trainer's generation batch `inputs`, at policy `version` (the optimizer steps
        taken); when sampled more than `max_staleness` versions before, the server gets the current weights and samples
        it again. The first call starts the thread at `inputs`.

        Args:
            inputs (`list[dict]`): the generation batch the trainer's data loader gave (this process's rows).
            version (`int`): the trainer's optimizer steps taken.
        """
        keys = [prompt_key(x) for x in inputs]
        if self._thread is None:
            self._start(keys)
        started = time.perf_counter()
        ahead = self._ready.get()
        self.waits.trainer += time.perf_counter() - started
        self._room.release()  # the batch max_staleness places on may start sampling
        if ahead is None:
            raise RuntimeError("asynchronous rollouts: the training data ended before the trainer's")
        if ahead.error is not None:
            raise ahead.error
        if ahead.keys != keys:
            raise RuntimeError(
                "asynchronous rollouts: the batch sampled ahead is not the one the trainer asks for (its data loader "
                "and the rollout's drew other rows)"
            )
        batch, staleness = ahead.batch, version - ahead.version
        if staleness > self.max_staleness:  # weights sent less often than batches trained: sample it again
            self.counts.dropped += sum(rows_of(batch))
            with self.lock:  # once the server has the current weights
                self.rollout.vllm.sync(version, self.rollout.profile)
                batch = self.rollout.sample(inputs, "train", version, clear_features=False)
            self.counts.sampled += sum(rows_of(batch))
            staleness = 0
        trained, set_aside = rows_of(batch)
        self.counts.trained += trained
        self.counts.filtered += set_aside
        self.waits.staleness.append(staleness)
        return batch

    def sync(self, version: int) -> None:
        """Send the policy's weights (`version`) to the server once no batch is sampling."""
        with self.lock:
            self.rollout.vllm.sync(version, self.rollout.profile)

    def metrics(self) -> dict[str, float]:
        """`async/*` since the last call: the staleness of the batches taken, the seconds the trainer waited for a batch
        and the thread for room to sample, and the rows dropped as stale (so far)."""
        waits, self.waits = self.waits, Waits()
        staleness = waits.staleness or [0]
        return {
            "async/staleness_mean": sum(staleness) / len(staleness),
            "async/staleness_max": float(max(staleness)),
            "async/trainer_wait_s": waits.trainer,
            "async/generator_idle_s": waits.generator,
            "async/rows_dropped_stale": float(self.counts.dropped),
        }

    def close(self) -> None:
        """Stop the thread once its batch is sampled, and count the batches sampled ahead that were not taken."""
        if self._thread is None:
            return
        self._stop.set()
        self._room.release()
        self._thread.join()
        while not self._ready.empty():
            ahead = self._ready.get()
            if ahead is not None and ahead.batch is not None:
                self.counts.unused += sum(rows_of(ahead.batch))
        self._thread = None

    # ------------------------------------------------------------------------------------------ thread side
    def _start(self, first: list[str]) -> None:
        """Start sampling at the trainer's first generation batch (a resumed run starts further on)."""
        self._thread = threading.Thread(target=self._run, args=(first,), name="async-rollouts", daemon=True)
        self._thread.start()

    def _run(self, first: list[str]) -> None:
        try:
            rows = self._advance_to(first)
            while rows is not None:
                started = time.perf_counter()
                self._room.acquire()
                self.waits.generator += time.perf_counter() - started
                if self._stop.is_set():
                    return
                self._ready.put(self._sample(rows))
                rows = next(self.batches, None)
            self._ready.put(None)
        except BaseException as error:  # re-raised in the trainer by `take`
            self._ready.put(Ahead([], None, -1, error))

    def _advance_to(self, first: list[str]) -> list[dict[str, Any]] | None:
        """The data's generation batches up to the trainer's first one, skipped without sampling."""
        for rows in self.batches:
            if [prompt_key(x) for x in rows] == first:
                return rows
        return None

    def _sample(self, rows: list[dict[str, Any]]) -> Ahead:
        with self.lock:
            version = self.rollout.vllm.version
            batch = self.rollout.sample(rows, "train", version, clear_features=False)
        self.counts.sampled += sum(rows_of(batch))
        return Ahead([prompt_key(x) for x in rows], batch, version)


def rows_of(batch: RolloutBatch) -> tuple[int, int]:
    """The rows a sampled batch trains on, and those dynamic sampling set aside (none without it)."""
    return len(batch.sampled.inputs), 0 if batch.dropped is None else len(batch.dropped[0].inputs)


def generation_batches(loader: Any, every: int) -> Iterator[list[dict[str, Any]]]:
    """The distinct generation batches of TRL's training data loader, epoch after epoch: its sampler repeats each
    generation batch for the `every` micro-steps it feeds (`steps_per_generation * num_iterations`).

    Args:
        loader (`DataLoader`): a training data loader built as the trainer's (same sampler and seed, same order).
        every (`int`): micro-steps per generation batch.
    """
    epoch = 0
    while True:
        for step, rows in enumerate(_epoch(loader, epoch)):
            if step % every == 0:
                yield rows
        epoch += 1


def _epoch(loader: Any, epoch: int) -> Iterator[Any]:
    """One pass over `loader`, its sampler told the epoch as the trainer tells it."""
    loader.set_epoch(epoch)
    return iter(loader)
