"""Step time of `VLMGRPOTrainer` with `share_prompt_prefix` false against true, over a grid of shapes.

    python benchmarks/bench_sharing.py --steps 5 --warmup 1

This is the measurement behind `share_prompt_prefix: auto` (`vlm_grpo.policy.sharing_plan.sharing_pays`). At each grid
point (G completions per prompt, C completion tokens, one square image of the given side, full fine-tuning, beta 0)
the same model, data and seed are trained by two processes that take turns step by step (`alternate.py`): full rows,
then shared. Printed per point: the prompt length P, the share of a pass's tokens that sharing saves,
`(G-1)(P-1) / G(P+C)`, what `auto` decides there, both median step times and peak memory, and shared / full.
The model is `bench_grpo.py`'s (`--smoke`: its tiny one, to check the script).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
from pathlib import Path

import bench_grpo
from alternate import run_alternating

from vlm_grpo.policy.sharing_plan import sharing_pays

GRID = (  # G, completion tokens, image side: short prompts (4 to 16 image tokens) around auto's threshold
    (2, 64, 56), (3, 32, 56), (2, 256, 56), (4, 64, 56), (4, 96, 56), (4, 128, 56), (8, 128, 56), (8, 256, 56),
    (16, 64, 56), (4, 64, 112),
)  # fmt: skip
for _G, _length, _side in GRID:
    bench_grpo.SHAPES[f"G{_G}_C{_length}_side{_side}"] = dict(
        name=f"G{_G}_C{_length}_side{_side}", G=_G, length=_length, side=_side, images=1,
        question=bench_grpo.SHAPES["short"]["question"], recipe=False,
    )  # fmt: skip
MODES = ("false", "true")


def build_trainer(mode: str, key: str, opts, dims: dict, model_dir: str, cuda: bool, recorder):
    """Runs in the trainer's own process: `VLMGRPOTrainer` with `share_prompt_prefix=mode` for grid point `key`."""
    opts = copy.copy(opts)
    opts.share = mode
    return bench_grpo.build_trainer("ours", key, opts, dims, model_dir, None, cuda, recorder)


def run_point(key: str, opts, dims: dict, cuda: bool, work: Path) -> None:
    spec = bench_grpo.SHAPES[key]
    G, length = spec["G"], spec["length"]
    model_dir = work / key
    bench_grpo.build_model(model_dir, dims, spec["side"], opts.seed)
    records = run_alternating(list(MODES), build_trainer, (key, opts, dims, str(model_dir), cuda), cuda)
    medians, peaks, prompts = {}, {}, set()
    for mode in MODES:
        rec = records[mode]
        medians[mode] = statistics.median(rec["times"][opts.warmup :])
        peaks[mode] = max(rec["peaks"][opts.warmup :]) / 2**20
        prompts |= {round(tokens / G - length) for tokens in bench_grpo.step_tokens(rec["logs"])}
    (P,) = prompts  # every step: one group of the same prompt
    saved = (G - 1) * (P - 1) / (G * (P + length))
    auto = "share" if sharing_pays(P, length, [G]) else "full"
    print(f"{G:>3}{P:>5}{length:>5}{saved:>8.3f}{auto:>7}{medians['false']:>10.3f}{medians['true']:>10.3f}"
          f"{peaks['false']:>11.1f}{peaks['true']:>11.1f}{medians['true'] / medians['false']:>9.3f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    bench_grpo.add_run_options(parser, "mode")
    parser.add_argument(
        "--points", type=int, nargs="*", default=None, help="indices into GRID (default: all)"
    )
    opts = parser.parse_args()
    # fp32, generate: `bench_grpo.build_trainer` reads them
    opts.bf16, opts.generation = False, "transformers"
    points = range(len(GRID)) if opts.points is None else opts.points
    if not all(0 <= i < len(GRID) for i in points):
        parser.error(f"--points must be indices from 0 to {len(GRID) - 1}")
    cuda, dims = bench_grpo.start_run(parser, opts, "per mode, alternating full/shared")
    print(f"{'G':>3}{'P':>5}{'C':>5}{'saved':>8}{'auto':>7}{'full s':>10}{'shared s':>10}{'full MiB':>11}"
          f"{'shared MiB':>11}{'ratio':>9}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_sharing_") as work:
        for i in points:
            G, length, side = GRID[i]
            run_point(f"G{G}_C{length}_side{side}", opts, dims, cuda, Path(work))


if __name__ == "__main__":
    main()
