"""Per-phase timings, throughput and length statistics, and the sample records of a step.

Metric names follow verl / MindSpeed-MM so curves compare across tools:

- `timing_s/{gen,old_log_prob,ref,reward,adv,update_actor,step}`: seconds per optimizer step and phase;
- `perf/total_num_tokens` (prompt + completion tokens of the step, all devices), `perf/time_per_step`,
  `perf/throughput` (tokens per second per device);
- `prompt_length/{mean,min,max}`, `response_length/{mean,min,max}` (tokens, all devices).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..data.video_frames import stored_video

ROLLOUT_PHASES = ("gen", "old_log_prob", "ref", "reward", "adv")


class PhaseTimer:
    """Accumulates wall-clock seconds per phase until `pop` hands them over.

    Example:
        >>> timer = PhaseTimer()
        >>> with timer("gen"):
        ...     pass
        >>> sorted(timer.pop())
        ['gen']
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Time the body of the `with` block as `phase` (added to earlier time of the same phase)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def add(self, seconds: dict[str, float]) -> None:
        """Add seconds per phase timed elsewhere (the rollout's own timer)."""
        for phase, value in seconds.items():
            self.seconds[phase] += value

    def pop(self) -> dict[str, float]:
        """Return the accumulated seconds per phase and start over."""
        seconds, self.seconds = dict(self.seconds), defaultdict(float)
        return seconds


def length_stats(prefix: str, lengths: Sequence[int | float]) -> dict[str, float]:
    """`{prefix/mean, prefix/min, prefix/max}` of `lengths` (empty -> zeros)."""
    if not lengths:
        return {f"{prefix}/mean": 0.0, f"{prefix}/min": 0.0, f"{prefix}/max": 0.0}
    return {
        f"{prefix}/mean": float(sum(lengths)) / len(lengths),
        f"{prefix}/min": float(min(lengths)),
        f"{prefix}/max": float(max(lengths)),
    }


def step_metrics(phases: dict[str, float], step_seconds: float, total_tokens: int, world_size: int) -> dict:
    """Timing and throughput metrics of one optimizer step.

    Args:
        phases (`dict[str, float]`): seconds per rollout phase (gen, old_log_prob, ref, reward, adv).
        step_seconds (`float`): wall-clock seconds of the whole step, rollout included.
        total_tokens (`int`): prompt + completion tokens processed in the step, summed over devices.
        world_size (`int`): number of devices.
    """
    rollout = sum(phases.values())
    metrics = {f"timing_s/{name}": phases.get(name, 0.0) for name in ROLLOUT_PHASES}  # 0.0: phase did not run
    metrics["timing_s/update_actor"] = max(step_seconds - rollout, 0.0)
    metrics["timing_s/step"] = step_seconds
    metrics["perf/total_num_tokens"] = float(total_tokens)
    metrics["perf/time_per_step"] = step_seconds
    metrics["perf/throughput"] = total_tokens / max(step_seconds, 1e-9) / max(world_size, 1)
    return metrics


def prompt_text(prompt: list[dict[str, Any]] | str) -> str:
    """The text of a conversational prompt (every text part, roles prefixed), or the prompt itself."""
    if isinstance(prompt, str):
        return prompt
    lines = []
    for message in prompt:
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [p.get("text") or "" for p in content or []]
        lines.append(f"{message['role']}: " + " ".join(p for p in parts if p))
    return "\n".join(lines)


def sample_records(
    step: int,
    examples: Sequence[dict[str, Any]],
    completions: Sequence[str],
    rewards: dict[str, Sequence[float]],
    advantages: Sequence[float],
    num_generations: int,
    tool_images: Sequence[list[str]] | None = None,
    logged: dict[str, Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """One record per prompt group (G consecutive rows), in the layout `vlm_grpo.runtime.sample_log.write_samples` writes.

    Args:
        step (`int`): training step.
        examples (`Sequence[dict]`): the dataset rows of all devices, G consecutive rows per prompt.
        completions (`Sequence[str]`): decoded completions, aligned with `examples`.
        rewards (`dict[str, Sequence[float]]`): per reward name, one value per completion (NaN = not applicable).
        advantages (`Sequence[float]`): one per completion.
        num_generations (`int`): G.
        tool_images (`Sequence[list[str]]`, *optional*, defaults to `None`): the paths of the images each completion's
            tools returned, aligned with `examples`; a record gets `tool_images` (one list per completion) when given.
        logged (`dict[str, Sequence]`, *optional*, defaults to `None`): the rewards' `log_extra` columns, aligned with
            `examples`; a record gets `logged` (per column, one value per completion) when any is given.
    """
    records = []
    for start in range(0, len(examples), num_generations):
        rows = slice(start, start + num_generations)
        example = examples[start]
        images = example.get("image_paths")
        if images is None:
            images = [getattr(img, "filename", "") or "" for img in example.get("images") or []]
        records.append(
            {
                "step": step,
                "prompt": prompt_text(example["prompt"]),
                "images": list(images),
                "solution": example.get("solution"),
                "completions": list(completions[rows]),
                "rewards": {name: list(values[rows]) for name, values in rewards.items()},
                "advantages": list(advantages[rows]),
            }
        )
        if logged:
            records[-1]["logged"] = {name: list(values[rows]) for name, values in logged.items()}
        if example.get("videos"):
            records[-1]["videos"] = [stored_video(video) for video in example["videos"]]
        if tool_images is not None:
            records[-1]["tool_images"] = [list(paths) for paths in tool_images[rows]]
    return records
