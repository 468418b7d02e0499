"""`vlm-grpo demo`: a tiny VLM learns a task with GRPO, on a CPU, in minutes, with no download.

    vlm-grpo demo                                   colour of a square, 4 options (runs/demo)
    vlm-grpo demo --task grounding                  box of the one object, iou + rec_format (runs/demo-grounding)
    vlm-grpo demo --task brand                      brand of a logo among 56 numbered options (runs/demo-brand)
    vlm-grpo demo --task math                       total of two segment lengths in \\boxed{}, geo3k (runs/demo-math)

Each task builds its tiny Qwen2-VL and its synthetic data offline (`vlm_grpo/demos/`), evaluates on held-out
images, and prints the scores at the start, after the supervised warm start (tasks whose answer format a random
model cannot write: grounding, math, brand) and after GRPO, with the time of each phase. The GRPO run's folder
`OUTPUT_DIR/model` holds the trained model, `training_curves.png` and `samples.html`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from ..demos import brand, colour, grounding, segments

TASKS: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {
    "colour": (colour.run_colour, colour.TASK.output_dir),
    "grounding": (grounding.run_grounding, grounding.TASK.output_dir),
    "brand": (brand.run_brand, brand.TASK.output_dir),
    "math": (segments.run_segments, segments.TASK.output_dir),
}
"""Demo tasks by name: the function that runs one (`vlm_grpo.demos.common.run_task` on the task's `DemoTask`)
and its default output folder."""


def run_demo(output_dir: str = "runs/demo", max_steps: int = 500, seed: int = 0) -> dict[str, Any]:
    """The colour demo (`vlm_grpo.demos.colour.run_colour`), kept under its historical name."""
    return colour.run_colour(output_dir, max_steps=max_steps, seed=seed)


def summary(task: str, result: dict[str, Any], seconds: float) -> str:
    """One line: the held-out score at each stage and the end-to-end time.

    Args:
        task (`str`): the task's name.
        result (`dict`): what the task's run function returned.
        seconds (`float`): end-to-end seconds.
    """
    stages = [("start", result.get("start") or result.get("before")), ("warm start", result.get("warm"))]
    stages.append(("after GRPO", result.get("after")))
    scores = ", ".join(f"{name} {report['accuracy']:.3f}" for name, report in stages if report)
    return f"{task}: held-out accuracy {scores}; {seconds:.0f} s end to end"


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo demo`."""
    parser = argparse.ArgumentParser(prog="vlm-grpo demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=list(TASKS), default="colour")
    parser.add_argument("--output_dir", default=None, help="default: runs/demo (colour), runs/demo-TASK")
    parser.add_argument("--max_steps", type=int, default=None, help="GRPO steps; default: the task's own")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dynamic_sampling", action="store_true", help="replace groups whose rewards all agree (DAPO)"
    )
    args = parser.parse_args(argv)
    func, default_dir = TASKS[args.task]
    kwargs: dict[str, Any] = {"seed": args.seed}
    if args.max_steps is not None:
        kwargs["max_steps"] = args.max_steps
    if args.dynamic_sampling:
        kwargs["dynamic_sampling"] = True
    start = time.perf_counter()
    result = func(args.output_dir or default_dir, **kwargs)
    print(summary(args.task, result, time.perf_counter() - start))
