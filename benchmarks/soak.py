"""Soak measurement: resident memory of a long GRPO run on the colour demo's model.

    .venv/bin/python benchmarks/soak.py --steps 2000 --output_dir runs/soak

Builds the colour demo's data and tiny Qwen2-VL (`vlm_grpo.demos.colour`, offline), trains it in this process
with the demo's GRPO settings (`vlm_grpo.demos.common.grpo_config`: 32 completions per step, sample logs every 100
steps) through `vlm_grpo.train.build_trainer`, and samples the process's resident set size (RSS, from
`/proc/self/statm`) at the end of every `--sample_every` steps. It prints RSS every `--report_every` steps and
ends with one line: RSS at `--from_step` and at the last step, and the growth between them (goal: below 5%).
The samples are written to `OUTPUT_DIR/rss.json`. This is a measurement, not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

from transformers import TrainerCallback

from vlm_grpo.config import VLMModelConfig
from vlm_grpo.demos.colour import QUESTION, REWARDS, write_task
from vlm_grpo.demos.common import grpo_config
from vlm_grpo.testing import ROLE_WORDS, build_tiny_model
from vlm_grpo.train import ScriptArguments, build_trainer

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    """The resident set size of this process now, in MiB (Linux: the second field of `/proc/self/statm`)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class RSSSampler(TrainerCallback):
    """Record `(step, RSS MiB)` at the end of every `every` optimizer steps, and print every `report` steps.

    Args:
        every (`int`, defaults to 10): sampling interval in steps.
        report (`int`, defaults to 200): printing interval in steps (with the growth since `from_step`).
        from_step (`int`, defaults to 200): the step growth is measured from.
    """

    def __init__(self, every: int = 10, report: int = 200, from_step: int = 200):
        self.every, self.report, self.from_step = every, report, from_step
        self.samples: list[tuple[int, float]] = []
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every == 0 or step == 1:
            self.samples.append((step, rss_mib()))
        if step % self.report == 0:
            elapsed, now = time.perf_counter() - self.start, rss_mib()
            growth = ""
            if step > self.from_step:
                base = rss_at(self.samples, self.from_step)[1]
                growth = f"  growth since step {self.from_step}: {(now - base) / base * 100:+.2f}%"
            print(f"step {step:5d}  RSS {now:8.1f} MiB  {elapsed:7.0f} s{growth}", flush=True)
        return control


def rss_at(samples: list[tuple[int, float]], step: int) -> tuple[int, float]:
    """The first sample taken at or after `step`."""
    return next((s, m) for s, m in samples if s >= step)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="GRPO steps (default 2000)")
    parser.add_argument(
        "--from_step", type=int, default=200, help="growth is measured from here (default 200)"
    )
    parser.add_argument("--sample_every", type=int, default=10)
    parser.add_argument("--report_every", type=int, default=200)
    parser.add_argument("--output_dir", default="runs/soak")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    out = Path(args.output_dir)
    train_yaml, _ = write_task(out / "data", seed=args.seed)
    model_dir = build_tiny_model(
        "qwen2_vl", out / "model-init", seed=args.seed, base_words=ROLE_WORDS, words=QUESTION.split()
    )
    training_args = grpo_config(out / "model", args.steps, args.seed)
    sampler = RSSSampler(args.sample_every, args.report_every, args.from_step)
    trainer = build_trainer(
        ScriptArguments(data_config=str(train_yaml), rewards=list(REWARDS)),
        training_args,
        VLMModelConfig(model_name_or_path=str(model_dir), dtype="float32"),
        callbacks=[sampler],
    )
    print(f"before training: RSS {rss_mib():.1f} MiB", flush=True)
    trainer.train()

    (from_step, start), (end_step, end) = rss_at(sampler.samples, args.from_step), sampler.samples[-1]
    growth = (end - start) / start * 100
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "steps": args.steps,
        "from_step": from_step,
        "rss_from_mib": round(start, 1),
        "end_step": end_step,
        "rss_end_mib": round(end, 1),
        "growth_percent": round(growth, 2),
        "peak_rss_mib": round(peak, 1),
        "seconds": round(time.perf_counter() - sampler.start, 1),
        "samples": sampler.samples,
    }
    (out / "rss.json").write_text(json.dumps(result))
    print(
        f"RSS step {from_step}: {start:.1f} MiB, step {end_step}: {end:.1f} MiB, growth {growth:+.2f}% "
        f"(goal < 5%); peak {peak:.1f} MiB; {result['seconds']:.0f} s",
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
