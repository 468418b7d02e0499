"""`vlm-grpo demo`: a tiny VLM learns a task with GRPO, on a CPU, in minutes, with no download.

    vlm-grpo demo                                   colour of a square, 4 options (runs/demo)
    vlm-grpo demo --task grounding                  box of the one object, iou + rec_format (runs/demo-grounding)
    vlm-grpo demo --task brand                      brand of a logo among 56 numbered options (runs/demo-brand)
    vlm-grpo demo --task math                       total of two segment lengths in \\boxed{}, geo3k (runs/demo-math)
    vlm-grpo demo --task zoom                       pattern of a mark only a zoom tool shows, multi-turn (runs/demo-zoom)
    vlm-grpo demo --task zoom --no-tool             the same model and budget, answering without the tool
    vlm-grpo demo --task motion                     how a shape moves in a video clip, 5 options (runs/demo-motion)

Each task builds its tiny Qwen2-VL (the zoom task a tiny Qwen3-VL, whose template calls tools) and its synthetic data offline (`vlm_grpo/demos/`), evaluates on held-out
images, and prints the scores at the start, after the supervised warm start (tasks whose answer format a random
model cannot write: grounding, math, brand) and after GRPO, with the time of each phase. The GRPO run's folder
`OUTPUT_DIR/model` holds the trained model, `training_curves.png` and `samples.html`.

SIGTERM or SIGUSR1 (a scheduler's preemption, `timeout`) stops a demo as it stops `vlm-grpo train`: the training
stage finishes its step and writes a checkpoint, the demo says where it is and exits with status 75
(`vlm_grpo.runtime.preemption.EXIT_PREEMPTED`) without evaluating a model it did not finish.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

TASKS: dict[str, tuple[str, str]] = {
    "colour": ("vlm_grpo.demos.colour:run_colour", "runs/demo"),
    "grounding": ("vlm_grpo.demos.grounding:run_grounding", "runs/demo-grounding"),
    "brand": ("vlm_grpo.demos.brand:run_brand", "runs/demo-brand"),
    "math": ("vlm_grpo.demos.segments:run_segments", "runs/demo-math"),
    "zoom": ("vlm_grpo.demos.zoom:run_zoom", "runs/demo-zoom"),
    "motion": ("vlm_grpo.demos.motion:run_motion", "runs/demo-motion"),
}
"""Demo tasks by name: the function that runs one (`module:function`, `vlm_grpo.demos.common.run_task` on the
task's `DemoTask`; imported once the arguments are checked, since torch, transformers and TRL come with it) and its
default output folder (the task's `TASK.output_dir`)."""


def task_function(task: str) -> Callable[..., dict[str, Any]]:
    """The function that runs the demo task `task` (one of `TASKS`), imported."""
    module, _, name = TASKS[task][0].partition(":")
    return getattr(import_module(module), name)


def run_demo(output_dir: str = "runs/demo", max_steps: int = 500, seed: int = 0) -> dict[str, Any]:
    """The colour demo (`vlm_grpo.demos.colour.run_colour`), kept under its historical name."""
    return task_function("colour")(output_dir, max_steps=max_steps, seed=seed)


def summary(task: str, result: dict[str, Any], seconds: float) -> str:
    """One line: the held-out score at each stage, the verdict (`vlm_grpo.demos.common.verdict_text`: the documented
    score, which run it is for, and the target) and the end-to-end time.

    Args:
        task (`str`): the task's name.
        result (`dict`): what the task's run function returned.
        seconds (`float`): end-to-end seconds.
    """
    stages = [("start", result.get("start") or result.get("before")), ("warm start", result.get("warm"))]
    stages.append(("after GRPO", result.get("after")))
    scores = ", ".join(f"{name} {report['accuracy']:.3f}" for name, report in stages if report)
    verdict = f" ({result['verdict']})" if result.get("verdict") else ""
    return f"{task}: held-out accuracy {scores}{verdict}; {seconds:.0f} s end to end"


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo demo`."""
    parser = argparse.ArgumentParser(prog="vlm-grpo demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=list(TASKS), default="colour")
    parser.add_argument("--output_dir", default=None, help="default: runs/demo (colour), runs/demo-TASK")
    parser.add_argument(
        "--max_steps",
        type=int,
        default=None,
        help="GRPO steps; default: the task's own, the run whose scores docs/demos.md gives and the target is for",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dynamic_sampling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replace groups whose advantages are all zero (DAPO); default: the task's own (on for colour, "
        "grounding and motion)",
    )
    parser.add_argument(
        "--async_rollouts",
        action="store_true",
        help="sample the next batches on a local vLLM server (trl vllm-serve on a core of its own) while this one "
        "trains; needs vLLM",
    )
    parser.add_argument(
        "--tool",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="zoom only: offer the zoom tool (default); --no-tool trains the same model to answer without it",
    )
    args = parser.parse_args(argv)
    if args.tool is not None and args.task != "zoom":
        parser.error(f"--tool/--no-tool is an option of --task zoom, not of --task {args.task}")
    kwargs: dict[str, Any] = {"seed": args.seed}
    if args.tool is not None:
        kwargs["tool"] = args.tool
    if args.max_steps is not None:
        kwargs["max_steps"] = args.max_steps
    if args.dynamic_sampling is not None:
        kwargs["dynamic_sampling"] = args.dynamic_sampling
    if args.async_rollouts:
        from ..rollout.vllm.local_server import local_server_setup

        local_server_setup()  # vLLM here, and a core for it, before anything is built
        kwargs["async_rollouts"] = True
    func = task_function(args.task)
    from ..runtime.preemption import EXIT_PREEMPTED, Preempted

    start = time.perf_counter()
    try:
        result = func(args.output_dir or TASKS[args.task][1], **kwargs)
    except Preempted as stopped:
        sys.stderr.write(f"vlm-grpo demo: {stopped} (exit status {EXIT_PREEMPTED}).\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_PREEMPTED) from None
    print(summary(args.task, result, time.perf_counter() - start))
