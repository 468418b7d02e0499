"""The benchmark script runs end to end on a tiny model: both trainers, in turn, each in its own process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_grpo.py"


def test_benchmark_smoke_alternates_processes_and_prints_ratios():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--steps", "2", "--warmup", "0", "--shape", "short", "--device", "cpu"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "each trainer in its own process" in out
    # strictly alternating, as read from the steps' start times
    assert "step order: stock ours stock ours\n" in out
    assert "WARNING: " not in out  # every completion has the forced length (DeepSpeed logs "[WARNING]")
    rows = {m[1]: m[2].split() for m in re.finditer(r"^(stock|ours) +(.*)$", out, re.M)}
    for name in ("stock", "ours"):
        median, generate, tokens, peak = (float(rows[name][k]) for k in (0, 3, 4, 6))
        assert median > 0 and peak > 0
        assert 0 < generate < median  # the timed `generate` is part of the step
        assert tokens == 4 * (20 + 64)  # G=4 samples of a 20-token prompt and 64 completion tokens
        # 4 samples x 16 patch rows (one 56x56 image), in generation and in the training pass
        assert rows[name][-1] == "128"
    ratio = float(re.search(r"^ratio short_prompt: ([0-9.]+)$", out, re.M)[1])
    assert abs(ratio - float(rows["ours"][0]) / float(rows["stock"][0])) < 0.01
