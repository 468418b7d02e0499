"""Wall time of every command's `--help` and of one input error per command, the first time (a fresh cache folder).

    python benchmarks/startup.py            # median of 3 runs per line
    python benchmarks/startup.py --runs 5

Each run is a fresh `python -m vlm_grpo ...` process (the interpreter running this script) with `XDG_CACHE_HOME` set
to a new empty folder, in a scratch working directory holding the two small YAML files the input errors need; the
time includes the interpreter's start. Each line: the median, the slowest run, the exit status (0 for `--help`, 1 for
an input error) and the first line of what the command printed on stderr. These are what must come back in about a
second: nothing heavy (torch, transformers, TRL, datasets) is imported before the arguments and inputs are checked
(`tests/test_cli.py` checks the imports; this script only times them).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = (
    ("train --help", ["train", "--help"]),
    ("train --help-all", ["train", "--help-all"]),
    ("train: missing training config", ["train", "nope.yaml"]),
    ("train: unknown key", ["train", "bad.yaml"]),
    ("eval --help", ["eval", "--help"]),
    ("eval: missing data config", ["eval", "--model", "runs/tiny", "--data", "nope.yaml"]),
    ("demo --help", ["demo", "--help"]),
    ("demo: unknown task", ["demo", "--task", "nope"]),
    ("plot --help", ["plot", "--help"]),
    ("plot: missing run", ["plot", "runs/nope"]),
    ("samples --help", ["samples", "--help"]),
    ("samples: missing run", ["samples", "runs/nope"]),
    ("export --help", ["export", "--help"]),
    ("export: missing adapter", ["export", "--model", "m", "--adapter", "runs/nope", "--out", "merged"]),
    ("plan --help", ["plan", "--help"]),
    ("plan: unknown key", ["plan", "bad.yaml"]),
    ("tiny-model --help", ["tiny-model", "--help"]),
    ("tiny-model: unknown family", ["tiny-model", "qwen9", "runs/tiny"]),
)
"""`(label, arguments of vlm-grpo)`: each command's `--help` and one input error."""


def time_once(args: list[str], workdir: Path) -> tuple[float, int, str]:
    """`(seconds, exit status, first stderr line)` of one `python -m vlm_grpo ARGS` with a fresh cache folder."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache, "HF_HUB_OFFLINE": "1"}
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "vlm_grpo", *args], capture_output=True, text=True, cwd=workdir, env=env
        )
        seconds = time.perf_counter() - start
    return seconds, result.returncode, (result.stderr.strip().splitlines() or [""])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=3, help="runs per line; the median is printed (default 3)"
    )
    opts = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
          f"median of {opts.runs} runs, each a fresh process with a fresh XDG_CACHE_HOME")  # fmt: skip
    print(f"{'command':<34} {'median':>8} {'slowest':>8}  exit  stderr")
    with tempfile.TemporaryDirectory() as workdir:
        (Path(workdir) / "bad.yaml").write_text("model_name_or_path: runs/tiny\nlearnin_rate: 1.0e-5\n")
        for label, args in CASES:
            runs = [time_once(args, Path(workdir)) for _ in range(opts.runs)]
            seconds = [s for s, _, _ in runs]
            _, code, line = runs[-1]
            print(
                f"{label:<34} {statistics.median(seconds):>7.2f}s {max(seconds):>7.2f}s  {code:>4}  {line[:70]}"
            )


if __name__ == "__main__":
    main()
