"""Run trainers in their own processes, one optimizer step at a time in turn, and record each step.

Each trainer runs in a fresh (spawned) process on that process's main thread, as a user's run does: no two
trainers share a heap, an OpenMP thread pool or the GIL. The processes build their trainers, meet at a
barrier, then take turns: trainer 0 runs a step, hands the turn to trainer 1, waits for it, and so on, so
machine noise hits every trainer alike. A finished trainer drops out of the rotation.

A step is timed from `on_step_begin` to `on_step_end` (generation, forward, backward and optimizer step). Peak
memory is what the training steps hold above the built trainer, measured by the kernel or the CUDA allocator with
nothing sampling and nothing changed in the steps:
  - CPU: before the first step, freed heap pages go back to the system (glibc `malloc_trim(0)`) and the process's
    peak resident set size is reset to the current one (`/proc/self/clear_refs`); the peak is `VmHWM` after a step
    minus `VmRSS` before the first. It counts what the process keeps resident, allocator caches included.
  - CUDA: `torch.cuda.max_memory_allocated()` after a step minus `memory_allocated()` before the first.
A method wrapped with `StepRecorder.timed` (the model's `generate`) has its seconds per step recorded too.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback


class PeakMemory:
    """Peak memory of the training steps above the memory in use before the first (see the module docstring)."""

    METHOD = {
        False: "resident memory (VmHWM) after the steps - VmRSS before the first (after malloc_trim(0), VmHWM reset)",
        True: "torch.cuda.max_memory_allocated after the steps - memory_allocated before the first",
    }

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._trim = None if cuda else ctypes.CDLL("libc.so.6").malloc_trim
        self._base = 0

    @staticmethod
    def _status_kib(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return
        self._trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to VmRSS
        self._base = self._status_kib("VmRSS") * 1024

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self._base
        return self._status_kib("VmHWM") * 1024 - self._base


class Turns:
    """Lets `n` processes run one at a time, in the order of their index; a finished one drops out."""

    def __init__(self, ctx: Any, n: int):
        self.n, self.cond, self.turn = n, ctx.Condition(), ctx.Value("i", 0, lock=False)
        self.done = ctx.Array("b", n, lock=False)

    def _next(self, me: int) -> int | None:
        for k in range(1, self.n):
            other = (me + k) % self.n
            if not self.done[other]:
                return other
        return None

    def wait(self, me: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn.value == me)

    def pass_turn(self, me: int) -> None:
        with self.cond:
            other = self._next(me)
            if other is not None:
                self.turn.value = other
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.turn.value == me)

    def finish(self, me: int) -> None:
        with self.cond:
            self.done[me] = 1
            other = self._next(me)
            if other is not None:
                self.turn.value = other
            self.cond.notify_all()


class StepRecorder(TrainerCallback):
    """Times each optimizer step and its peak memory, keeps the logged metrics, then hands the turn over."""

    def __init__(self, index: int, turns: Turns, cuda: bool):
        self.index, self.turns, self.cuda, self.memory = index, turns, cuda, PeakMemory(cuda)
        keys = ("times", "peaks", "patches", "timed", "logs", "starts")
        self.record: dict[str, list] = {key: [] for key in keys}
        self.vision_rows = 0  # patch rows through the vision tower, counted by a forward hook
        self.timed_seconds = 0.0  # seconds in the calls wrapped by `timed`

    def timed(self, method: Callable) -> Callable:
        """`method` that adds its run time to this step's `timed_seconds` (synchronised on CUDA)."""

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if self.cuda:
                    torch.cuda.synchronize()
                self.timed_seconds += time.perf_counter() - start

        return wrapper

    def count_vision(self, module, args, kwargs) -> None:
        pixels = kwargs.get("hidden_states", args[0] if args else None)
        self.vision_rows += 0 if pixels is None else pixels.shape[0]

    def on_train_begin(self, args, state, control, **kwargs):
        self.memory.begin()

    def on_step_begin(self, args, state, control, **kwargs):
        self.vision_rows, self.timed_seconds = 0, 0.0
        self.record["starts"].append(time.time())
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.cuda:
            torch.cuda.synchronize()
        self.record["times"].append(time.perf_counter() - self.start)
        self.record["peaks"].append(self.memory.peak())
        self.record["patches"].append(self.vision_rows)
        self.record["timed"].append(self.timed_seconds)
        self.turns.pass_turn(self.index)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "num_tokens" in logs:
            self.record["logs"].append(dict(logs))


def _child(
    index: int, build: Callable, build_args: tuple, cuda: bool, turns: Turns, ready: Any, results: Any
) -> None:
    """One process: build its trainer with `build(*build_args, recorder)`, train in turn, send the record back."""
    try:
        recorder = StepRecorder(index, turns, cuda)
        trainer, extra = build(*build_args, recorder)
        ready.wait()
        turns.wait(index)
        trainer.train()
        results.put((index, {**recorder.record, **extra}))
    finally:
        turns.finish(index)


def run_alternating(
    names: list[str], build: Callable, build_args: tuple, cuda: bool, poll_s: float = 0.5
) -> dict[str, dict]:
    """Run `build(name, *build_args, recorder)` trainers in spawned processes, in turn; return each one's record.

    Args:
        names (`list[str]`): the trainers, in the order they take turns.
        build (`Callable`): a module-level function `build(name, *build_args, recorder) -> (trainer, extra)` that
            makes the trainer, adds `recorder` as a callback and returns any extra picklable facts in `extra`.
        build_args (`tuple`): picklable arguments after the name.
        cuda (`bool`): whether the trainers run on CUDA (how steps are synchronised and memory is measured).
        poll_s (`float`, defaults to `0.5`): how often the parent checks that no process has died.

    Returns:
        `dict[str, dict]`: per name, `times`, `peaks` (bytes), `patches`, `logs`, `starts` (wall clock of each
        step's start) and the `extra` facts.

    Raises:
        `SystemExit`: a process failed (its traceback is printed above); the others are stopped.
    """
    ctx = mp.get_context("spawn")
    turns, ready, results = Turns(ctx, len(names)), ctx.Barrier(len(names)), ctx.Queue()
    procs = [
        ctx.Process(
            target=_child, args=(i, build, (name, *build_args), cuda, turns, ready, results), name=name
        )
        for i, name in enumerate(names)
    ]
    for p in procs:
        p.start()
    records: dict[str, dict] = {}
    while len(records) < len(names):
        failed = [p for p in procs if p.exitcode not in (None, 0)]
        if failed:
            for p in procs:
                p.kill()
            raise SystemExit(f"bench: the {failed[0].name} trainer's process failed (exit code "
                             f"{failed[0].exitcode}); its error is printed above")  # fmt: skip
        try:
            index, record = results.get(timeout=poll_s)
        except queue.Empty:  # nothing yet: check the processes again
            continue
        records[names[index]] = record
    for p in procs:
        p.join()
    return records


def step_order(records: dict[str, dict]) -> list[str]:
    """Which trainer ran each step, from the steps' wall-clock start times (shows the alternation)."""
    starts = sorted((t, name) for name, rec in records.items() for t in rec["starts"])
    return [name for _, name in starts]
