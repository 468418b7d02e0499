"""`benchmarks/bench_tools.py` (multi-turn rollouts with an image tool, stock TRL against ours),
`benchmarks/decode_profile.py` (where a decoding step goes) and `benchmarks/decode_cache.py` (transformers' static
cache and compiled decoding) run end to end on tiny models."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.once  # the benchmark scripts' smoke runs: `make test` runs them, the floor does not
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *args) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_tools_benchmark_runs_both_trainers_on_the_same_rollouts():
    out = run("bench_tools.py", "--smoke", "--steps", "1", "--warmup", "0", "--device", "cpu")
    rows = {m[1]: m[2].split() for m in re.finditer(r"^(stock|ours) +(.*)$", out, re.M)}
    assert set(rows) == {"stock", "ours"}
    # median, min, max, generate, tok/step, calls/row, mean length, ViT patches/step
    stock, ours = ([float(x) for x in rows[name]] for name in ("stock", "ours"))
    assert stock[4:7] == ours[4:7]  # the same tokens, tool calls and lengths: the same rollouts
    assert ours[5] > 0  # rows called the tool
    assert ours[7] < stock[7]  # the prompt's image through the vision tower once per group, not once per row
    assert re.search(r"^ratio tools: \d+\.\d\d$", out, re.M)


def test_decode_profile_splits_every_decoding_step():
    out = run("decode_profile.py", "--smoke", "--repeats", "1", "--tokens", "8", "--device", "cpu")
    steps = re.search(r"decode ([\d.]+) s over (\d+) steps \(([\d.]+) ms per step\)", out)
    assert steps and int(steps[2]) == 8
    parts = {
        m[1].strip(): (float(m[2]), float(m[3]))
        for m in re.finditer(r"^([^\n\d]+?) +([-\d.]+) +([-\d.]+)%$", out, re.M)
    }
    assert set(parts) == {
        "model forward (no cache update)", "cache update", "logits processing", "sampling",
        "inputs and bookkeeping", "other (loop, eos, dispatch)",
    }  # fmt: skip
    assert all(ms > 0 for name, (ms, _) in parts.items() if name != "other (loop, eos, dispatch)")
    assert abs(sum(ms for ms, _ in parts.values()) - float(steps[3])) < 0.05 * float(steps[3])
    assert abs(sum(share for _, share in parts.values()) - 100) < 1


def test_decode_cache_times_each_cache_kind_on_the_same_draws():
    out = run("decode_cache.py", "--smoke", "--repeats", "1", "--tokens", "8", "--device", "cpu")
    rows = {
        m[1]: (float(m[2]), float(m[3]), float(m[4]), float(m[5]), m[6])
        for m in re.finditer(
            r"^(dynamic|static|compiled) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)x  (.+)$", out, re.M
        )
    }
    assert set(rows) == {"dynamic", "static", "compiled"}
    assert all(warm > 0 and generate > 0 and ms > 0 for warm, generate, ms, _, _ in rows.values())
    assert rows["dynamic"][3] == 1.0 and rows["dynamic"][4] == "equal"
    assert rows["static"][4] == "equal"  # the same draws give the same tokens with the preallocated cache
    assert rows["compiled"][0] > rows["compiled"][1]  # the warm-up call compiles
