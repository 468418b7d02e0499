"""Judged completions per second of the `judge` reward: requests sent concurrently vs one at a time.

    .venv/bin/python benchmarks/bench_judge.py --completions 512 --latency 0.05 --concurrency 1 16 64

(`--smoke` checks the script in seconds.)

The judge is `vlm_grpo.testing.judge_server` on 127.0.0.1, answering each request after a fixed `--latency` (a
served judge's time per reply, here without the GPU's own limit on how many it decodes at once). Each measurement
scores `--completions` distinct completions in one reward call, as TRL awaits it, with a fresh judge (nothing cached).
Printed per concurrency: completions per second and the seconds one step of that many completions waits on the judge.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from vlm_grpo.rewards import build_rewards
from vlm_grpo.testing.judge_server import judge_server


def judged_per_second(url: str, completions: list[str], concurrency: int) -> float:
    """Completions per second of one reward call over `completions` at `concurrency`."""
    spec = {
        "name": "judge",
        "url": url,
        "model": "judge",
        "template": "{completion}",
        "concurrency": concurrency,
    }
    (reward,), _ = build_rewards([spec])
    start = time.perf_counter()
    values = asyncio.run(reward(prompts=["q"] * len(completions), completions=completions))
    elapsed = time.perf_counter() - start
    if any(v is None for v in values):
        raise SystemExit("the judge left completions unscored")
    return len(completions) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--completions", type=int, default=512, help="completions per reward call (one step)")
    parser.add_argument("--latency", type=float, default=0.05, help="the judge's seconds per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--smoke", action="store_true", help="16 completions, 20 ms, concurrency 1 and 4")
    args = parser.parse_args()
    if args.smoke:
        args.completions, args.latency, args.concurrency = 16, 0.02, [1, 4]
    completions = [f"completion number {i}" for i in range(args.completions)]
    print(f"judge latency {args.latency * 1000:.0f} ms, {args.completions} distinct completions per call")
    with judge_server(delay=args.latency) as server:
        for concurrency in args.concurrency:
            rate = judged_per_second(server.url, completions, concurrency)
            print(f"completions/s concurrency {concurrency}: {rate:.1f}")
            print(f"  seconds per step of {args.completions} completions: {args.completions / rate:.2f}")


if __name__ == "__main__":
    main()
