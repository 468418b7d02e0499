"""Asynchronous rollouts' scheduling and accounting (`vlm_grpo.rollout.asynchronous.AsyncRollouts`).

A real `AsyncRollouts` thread runs against a stand-in for the server-side sampler that sleeps a random time per batch
(the stand-in is what a `Rollout` in server mode looks like to the thread: `sample(rows, mode, version)`, the engine's
`vllm.version`, a `vllm.sync`), while a loop plays the trainer with random training times: it sends the weights,
takes each batch and trains on it. Nothing is lost or trained twice: the counts of rows sampled, trained, set aside by
dynamic sampling, dropped as stale and left unused always add up, every batch the trainer takes is the one it asked for, and no batch trains more
than `max_staleness` steps after the weights it was sampled with. The real run, on a vLLM server, is
`tests/test_vllm_server.py::test_async_rollouts_train_on_batches_the_server_sampled_ahead`.
"""

from __future__ import annotations

import random
import threading
import time
from types import SimpleNamespace

import pytest

from vlm_grpo import VLMGRPOConfig
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.rollout.asynchronous import AsyncRollouts, generation_batches
from vlm_grpo.rollout.prompt_stream import prompt_key


class Engine:
    """What the thread reads of the vLLM sampler: the version of the weights it holds, and the weight sync."""

    def __init__(self):
        self.version = 0

    def sync(self, version: int, profile=None) -> None:
        time.sleep(0.001)
        self.version = version


class DelayedRollout:
    """Samples a batch in a random time; records every sampling (rows, the version it used)."""

    def __init__(self, seed: int, fail_at: int | None = None, set_aside: bool = False):
        self.vllm, self.random = Engine(), random.Random(seed)
        self.fail_at, self.set_aside = fail_at, set_aside
        self.sampled: list[tuple[list[str], int]] = []
        self.busy = threading.Lock()  # two samplings at once would be a bug

    def profile(self, name: str):
        return SimpleNamespace(__enter__=lambda: None, __exit__=lambda *a: None)

    def sample(self, rows, mode, version, clear_features=True):
        assert self.busy.acquire(blocking=False), "two batches sampled at once"
        try:
            if self.fail_at is not None and len(self.sampled) == self.fail_at:
                raise ValueError("the server fell over")
            time.sleep(self.random.uniform(0.0, 0.01))
            assert version == self.vllm.version and not clear_features
            self.sampled.append(([prompt_key(r) for r in rows], version))
            # dynamic sampling's refill rounds: rows of groups without signal, set aside
            aside = [{"prompt": "refill"}] * self.random.choice([0, 2, 4]) if self.set_aside else None
            dropped = None if aside is None else (SimpleNamespace(inputs=aside), None)
            sampled = SimpleNamespace(inputs=rows)
            return SimpleNamespace(rows=rows, version=version, sampled=sampled, dropped=dropped)
        finally:
            self.busy.release()


def data(batches: int, rows: int = 4) -> list[list[dict]]:
    return [[{"prompt": f"prompt {b}.{r}"} for r in range(rows)] for b in range(batches)]


def train(rollouts: AsyncRollouts, batches: list[list[dict]], sync_every: int, seed: int) -> list:
    """Play the trainer: for each batch, send the weights (every `sync_every` steps), take it, train a random time."""
    rng, taken = random.Random(seed + 1), []
    for step, rows in enumerate(batches):
        if step % sync_every == 0:
            rollouts.sync(step)
        batch = rollouts.take(rows, step)
        assert batch.rows == rows  # the batch the trainer asked for
        taken.append((step, batch.version))
        time.sleep(rng.uniform(0.0, 0.01))
    return taken


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_staleness", [1, 2])
@pytest.mark.parametrize("set_aside", [False, True], ids=["plain", "dynamic-sampling"])
def test_every_row_is_trained_once_within_max_staleness(seed, max_staleness, set_aside):
    """Weights sent before every batch: nothing is dropped, and each batch is at most `max_staleness` steps old; the
    rows dynamic sampling's rounds set aside are counted as such, beside those trained."""
    batches = data(12)
    rollout = DelayedRollout(seed, set_aside=set_aside)
    rollouts = AsyncRollouts(rollout, iter(batches + data(3, rows=2)), max_staleness)
    taken = train(rollouts, batches, sync_every=1, seed=seed)
    rollouts.close()
    counts = rollouts.counts
    assert counts.trained == 12 * 4 and counts.dropped == 0
    assert counts.sampled == counts.trained + counts.filtered + counts.dropped + counts.unused
    assert (counts.filtered > 0) == set_aside, counts
    assert all(0 <= step - version <= max_staleness for step, version in taken), taken
    assert max(step - version for step, version in taken) >= 1  # it did sample ahead
    assert rollouts._thread is None and not any(t.name == "async-rollouts" for t in threading.enumerate())


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_older_than_max_staleness_is_dropped_and_sampled_again(seed):
    """Weights sent every 3 steps with `max_staleness: 1`: a batch sampled more than one step before the trainer's
    step is dropped, counted, and sampled again once the server has the current weights."""
    batches = data(9)
    rollout = DelayedRollout(seed, set_aside=True)
    rollouts = AsyncRollouts(rollout, iter(batches), max_staleness=1)
    taken = train(rollouts, batches, sync_every=3, seed=seed)
    rollouts.close()
    counts = rollouts.counts
    assert all(step - version <= 1 for step, version in taken), taken  # what trained was never too stale
    assert counts.dropped >= 4 and counts.dropped % 2 == 0  # a stale batch's rows, those set aside included
    total = counts.trained + counts.filtered + counts.dropped + counts.unused
    assert counts.sampled == total and counts.trained == 9 * 4
    rows = {tuple(keys) for keys, _ in rollout.sampled}
    assert len(rows) == 9  # every batch was sampled, the dropped ones twice
    metrics = rollouts.metrics()
    assert metrics["async/rows_dropped_stale"] == counts.dropped


def test_the_thread_waits_for_room_and_the_trainer_for_batches():
    """A slow trainer: the thread waits for room (generator idle); a slow sampler: the trainer waits."""
    batches = data(4)
    rollouts = AsyncRollouts(DelayedRollout(0), iter(batches), max_staleness=1)
    for step, rows in enumerate(batches):
        rollouts.sync(step)
        rollouts.take(rows, step)
        time.sleep(0.05)
    metrics = rollouts.metrics()
    rollouts.close()
    assert metrics["async/generator_idle_s"] > 0.05 and metrics["async/staleness_max"] <= 1


def test_a_sampling_error_reaches_the_trainer_and_the_thread_ends():
    batches = data(4)
    rollouts = AsyncRollouts(DelayedRollout(0, fail_at=1), iter(batches), max_staleness=1)
    rollouts.take(batches[0], 0)
    with pytest.raises(ValueError, match="the server fell over"):
        rollouts.take(batches[1], 0)
    rollouts.close()
    assert not any(t.name == "async-rollouts" for t in threading.enumerate())


def test_a_resumed_run_starts_sampling_at_the_trainers_batch():
    """The data's earlier batches are passed over without sampling (a run resumed further on)."""
    batches = data(6)
    rollout = DelayedRollout(0)
    rollouts = AsyncRollouts(rollout, iter(batches), max_staleness=1)
    train(rollouts, batches[3:], sync_every=1, seed=0)
    rollouts.close()
    assert rollout.sampled[0][0] == [prompt_key(r) for r in batches[3]]


def test_generation_batches_are_the_loaders_distinct_batches_epoch_after_epoch():
    class Loader:  # TRL's loader repeats each generation batch for the micro-steps it feeds
        def __init__(self):
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

        def __iter__(self):
            e = self.epochs[-1]
            return iter([f"{e}a", f"{e}a", f"{e}b", f"{e}b"])

    loader = Loader()
    stream = generation_batches(loader, every=2)
    assert [next(stream) for _ in range(5)] == ["0a", "0b", "1a", "1b", "2a"]
    assert loader.epochs == [0, 1, 2]


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "a vLLM server (use_vllm: true, vllm_mode: server"),
        ({"use_vllm": True, "vllm_mode": "colocate"}, "one engine shares the trainer's devices"),
        ({"use_vllm": True, "vllm_mode": "server", "vllm_importance_sampling_correction": False},
         "set vllm_importance_sampling_correction: true"),
        ],
    ids=["no-vllm", "colocate", "no-correction"],
)  # fmt: skip
def test_async_rollouts_are_refused_where_they_cannot_run(options, message, tmp_path):
    with pytest.raises(VLMGRPOError, match=message.replace("(", r"\(")):
        VLMGRPOConfig(output_dir=str(tmp_path), use_cpu=True, async_rollouts=True, **options)
