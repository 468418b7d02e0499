"""The sharing benchmark runs end to end on a tiny model and prints what `auto` decides at each point."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vlm_grpo.policy.sharing_plan import sharing_pays

pytestmark = pytest.mark.once  # the benchmark scripts' smoke runs: `make test` runs them, the floor does not
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_sharing.py"


def test_sharing_benchmark_smoke_prints_both_modes_and_auto_decision():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--steps", "1", "--warmup", "0", "--points", "0", "3",
         "--device", "cpu"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"^ +\d+ +\d+ +\d+ ", line)]
    assert [(int(r[0]), int(r[2])) for r in rows] == [(2, 64), (4, 64)]  # GRID[0] and GRID[3]: G, C
    for G, P, C, saved, auto, full_s, shared_s, full_mib, shared_mib, ratio in rows:
        G, P, C = int(G), int(P), int(C)
        assert (
            P == 20
        )  # 4 image tokens of a 56x56 image and the question, in the chat template (3 newline tokens)
        assert abs(float(saved) - (G - 1) * (P - 1) / (G * (P + C))) < 1e-3
        assert auto == ("share" if sharing_pays(P, C, [G]) else "full")
        assert float(full_s) > 0 and float(shared_s) > 0 and float(full_mib) > 0 and float(shared_mib) > 0
        full_t, shared_t = float(full_s), float(shared_s)  # printed to 3 decimals: the ratio of the printed
        rounding = shared_t / full_t * (0.0005 / full_t + 0.0005 / shared_t) + 0.0005  # times is that close
        assert abs(float(ratio) - shared_t / full_t) <= rounding


def test_sharing_benchmark_refuses_a_point_outside_the_grid():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--points", "99"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "--points must be indices from 0 to 9" in proc.stderr
