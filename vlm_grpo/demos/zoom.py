"""Zoom demo: name the pattern in one quarter of an image that only a `zoom` tool shows (multi-turn GRPO, tool images).

Each scene is a 128x128 image: a light background and, in each of its four 64x64 quarters, a 48x48 mark filled with
one of three black-and-white patterns (`rows`, `columns`, `checks`; each a 4x4 tile with 8 dark pixels), drawn at
random for each quarter. The question names a quarter ("top left", ...), and each pattern is the answer equally often.
The model is shown the scene at 32x32 (each 4x4 block averaged): every pattern then becomes the same grey, pixel for
pixel, so the shown image tells nothing of the patterns, and answering from it alone is right a third of the time.
The environment `ZoomScene` gives each row one tool, `zoom(region)`, which returns that quarter at full resolution
(64x64), where the pattern is plain; its description numbers the quarters (1 top left, 2 top right, 3 bottom left, 4
bottom right).

The model is the tiny Qwen3-VL with its published chat template (its tool section and JSON tool calls). A random
model writes no tool call, so a warm start comes first: each warm-start conversation calls `zoom` on the quarter
the question names and answers a pattern, each scene and question once with every pattern, so it teaches the call
and the answer's form, and nothing of the patterns (held-out accuracy stays at chance: greedy, it gives one pattern
whatever the image). GRPO then trains on `accuracy` (the final answer) plus `zoomed_right` (0.5 for a first call on
the quarter the question names): what the model learns of the patterns, it learns from the tool's images, through
GRPO. `--no-tool` runs the same model, data and budget without the tool, as the baseline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .zoom_scene import PATTERNS, QUARTER, ZoomScene, question, vocabulary, write_data

REWARDS: tuple[Any, ...] = ("accuracy", {"name": "vlm_grpo.demos.zoom_scene.zoomed_right", "weight": 0.5})
"""GRPO's rewards with the tool: the final answer's `accuracy` (`choice_accuracy` on the last assistant turn) and, at
half weight, a first call on the quarter the question names. Without the tool, `accuracy` alone."""
GRPO_SETTINGS: dict[str, Any] = dict(
    per_device_train_batch_size=96,
    num_generations=8,
    max_completion_length=64,
    max_tool_calling_iterations=1,
    learning_rate=1e-3,
    lr_scheduler_type="cosine",
    warmup_steps=10,
    logging_steps=10,
    log_samples_steps=40,
)
"""GRPO settings of this demo (`common.grpo_config` fills in the rest): 12 prompts x 8 completions a step, one tool
call per completion, 64 tokens for the call, the tool's result and the answer. A constant 2e-3 broke the model
after about 95 steps (every completion 64 tokens of noise); a cosine decay from 2e-3 kept it in `.venv`, but at the
lowest supported versions seed 0 still broke at step 50 and seed 1's calls left the quarter asked about. From 1e-3
the answers take off at steps 60-100, as before, and no run broke (docs/demos.md, "Zoom"); the 10 warm-up steps
keep the first steps from breaking it. 12 prompts a step, not 8: with 8 (a third less time, and four patterns) the
three seeds met the target in `.venv`, but at the lowest supported versions seed 1 reached 0.8125 only and seed 2
stopped calling the tool at step 70 (held-out 0.250; docs/demos.md, "Zoom")."""
MAX_STEPS = 200
"""GRPO steps, over which the learning rate decays: with three patterns every seed's training reward stands at
1.35-1.45 (of 1.5) from step 170 on, and every held-out pattern is answered right. With a fourth pattern (`lines`) 300
were needed, and a run took over five minutes (docs/demos.md, "Zoom")."""
WARM_EPOCHS = 32
WARM_LEARNING_RATE = 3e-3
WARM_BATCH_SIZE = 16
"""The warm start's epochs, learning rate and batch size: a randomly initialised model learns the call with a large
learning rate (at 16 epochs seed 2's first calls went to the quarter asked about half the time only). It trains on
the CPU, as GRPO does here."""
TARGET = 0.8
"""The held-out accuracy with the tool that a run should reach (without it, chance, a third, is the ceiling)."""
DOCUMENTED: tuple[float, ...] = (1.0, 1.0, 1.0)
"""Held-out accuracy after GRPO with the tool for seeds 0, 1, 2, as docs/demos.md gives them."""


def demo_model(out_dir: Path, seed: int) -> str:
    """The demo's tiny Qwen3-VL (published template and tool tags), embeddings untied, images up to 64x64.

    The tool section the template writes for `ZoomScene.zoom` is read from a first build, and its words join the
    vocabulary, so that the prompt stays short.
    """
    from transformers import AutoProcessor

    from ..testing import ROLE_WORDS
    from ..testing.qwen import build_qwen

    def build(words: list[str]) -> str:
        return build_qwen(
            "qwen3_vl", out_dir, base_words=ROLE_WORDS, words=words, seed=seed, image_size=QUARTER,
            tie_word_embeddings=False,
        )  # fmt: skip

    processor = AutoProcessor.from_pretrained(build(vocabulary()))
    message = [{"role": "user", "content": question(1)}]
    tools = [ZoomScene().zoom]
    section = processor.apply_chat_template(message, tools=tools, add_generation_prompt=True, tokenize=False)
    return build(vocabulary(section))


def warm_calls(rows: Any, tool: bool = True) -> list[dict[str, Any] | None]:
    """The warm start's calls (`multi_turn.warm_start_with_tools`' `calls`): `zoom` on the quarter each row's question
    asks about. The answers after them are random patterns (`write_data`'s `warm_answers`): the call is taught, the
    patterns are not. Without the `tool`, no call: the prompt, then the random answer.

    Args:
        rows (`datasets.Dataset`): the warm-start rows (their `region` column).
        tool (`bool`, *optional*, defaults to `True`): call `zoom`.
    """
    if not tool:
        return [None] * len(rows)
    return [{"name": "zoom", "arguments": {"region": region}} for region in rows["region"]]


def _row_tool(row: dict[str, Any]) -> Any:
    """The `zoom` tool of one held-out row: its environment, reset with the row's scene."""
    scene = ZoomScene()
    scene.reset(row["scene"])
    return scene.zoom


def evaluate_zoom(
    model_dir: str | Path, eval_yaml: Path, output: Path, label: str, tool: bool = True
) -> dict[str, Any]:
    """Greedy held-out evaluation: accuracy, calls per row and first calls on the right quarter.

    Args:
        model_dir (`str | Path`): the model.
        eval_yaml (`Path`): the held-out data config.
        output (`Path`): where the JSON report goes.
        label (`str`): the stage, for the printed line.
        tool (`bool`, *optional*, defaults to `True`): offer the `zoom` tool.
    """
    from ..data import load_data_config
    from ..rewards.choice import choice_accuracy
    from .multi_turn import answer_with_tool

    start = time.perf_counter()
    rows = load_data_config(eval_yaml, seed=0)
    answers = answer_with_tool(model_dir, list(rows), _row_tool if tool else None)
    right = choice_accuracy(
        [a["answer"] for a in answers], solution=list(rows["solution"]), options=list(rows["options"])
    )  # as GRPO's `accuracy` reads the final answer
    calls = [a["call"] for a in answers]
    zoomed = [c is not None and c["arguments"].get("region") == row["region"] for c, row in zip(calls, rows)]
    report = {
        "accuracy": sum(right) / len(rows),
        "n": len(rows),
        "call_rate": sum(c is not None for c in calls) / len(rows),
        "zoomed_right": sum(zoomed) / len(rows),
        "answers": [{"call": a["call"], "answer": a["answer"]} for a in answers],
        "seconds": time.perf_counter() - start,
    }
    output.write_text(json.dumps(report, indent=1))
    print(
        f"held-out {label}: accuracy {report['accuracy']:.3f}, tool calls {report['call_rate']:.3f}, "
        f"first call on the quarter asked about {report['zoomed_right']:.3f} (n={len(rows)})",
        flush=True,
    )
    return report


def run_zoom(
    output_dir: str = "runs/demo-zoom",
    max_steps: int = MAX_STEPS,
    seed: int = 0,
    tool: bool = True,
    **overrides: Any,
) -> dict:
    """Build, evaluate, warm-start, evaluate, train with GRPO, evaluate: the zoom demo end to end.

    Args:
        output_dir (`str`, *optional*, defaults to `"runs/demo-zoom"`): where everything goes.
        max_steps (`int`, *optional*, defaults to `MAX_STEPS`): GRPO steps.
        seed (`int`, *optional*, defaults to `0`): seed of data, model and training.
        tool (`bool`, *optional*, defaults to `True`): offer the `zoom` tool; without it, the same model, data and
            budget answer from the shown image alone (the warm start teaches the answer's form, GRPO trains on
            `accuracy`).
        **overrides (`Any`): `VLMGRPOConfig` fields replacing the demo's GRPO settings; `data_sizes` (`n_train`,
            `n_warm`, `n_eval`) and `warm_epochs` (default `WARM_EPOCHS`) are taken too.

    Returns:
        `dict`: the held-out reports (`start`, `warm`, `after`), the seconds of the warm start and of GRPO, the paths
        of the curves and samples page, and the `verdict`.

    Raises:
        `Preempted`: SIGTERM or SIGUSR1 stopped the demo; the message says where the last checkpoint is.
    """
    from ..data import load_data_config
    from ..runtime.preemption import PreemptionCallback
    from .common import _stop_if_signalled, finish, grpo_config, train_grpo
    from .multi_turn import warm_start_with_tools

    out = Path(output_dir)
    data_sizes = overrides.pop("data_sizes", None) or {}
    warm_epochs = overrides.pop("warm_epochs", WARM_EPOCHS)
    settings = {**GRPO_SETTINGS, **({} if tool else {"max_completion_length": 4})}
    stop = PreemptionCallback()
    with stop.handle_signals():
        data = write_data(out / "data", seed=seed, **data_sizes)
        model_dir = demo_model(out / "model-init", seed)
        stage = dict(eval_yaml=data["eval"], tool=tool)
        result: dict[str, Any] = {
            "start": evaluate_zoom(model_dir, output=out / "eval_start.json", label="start", **stage)
        }
        _stop_if_signalled(stop, "stopped before training; no checkpoint was written")
        rows = load_data_config(data["warm"], seed=seed)
        result["warm_seconds"] = warm_start_with_tools(
            model_dir, rows, warm_calls(rows, tool), data["warm_answers"], out / "model-warm",
            environment_factory=ZoomScene if tool else None, epochs=warm_epochs,
            learning_rate=WARM_LEARNING_RATE, batch_size=WARM_BATCH_SIZE, seed=seed, device="cpu",
        )  # fmt: skip
        warmed = f"stopped after the warm start, saved to {out / 'model-warm'}"
        _stop_if_signalled(stop, warmed, str(out / "model-warm"))
        result["warm"] = evaluate_zoom(
            out / "model-warm", output=out / "eval_warm.json", label="after warm start", **stage
        )
        _stop_if_signalled(stop, warmed, str(out / "model-warm"))
        args = grpo_config(out / "model", max_steps, seed, **{**settings, **overrides})
        result["train_seconds"] = train_grpo(
            out / "model-warm",
            data["train"],
            REWARDS if tool else REWARDS[:1],
            args,
            environment_factory="vlm_grpo.demos.zoom_scene.ZoomScene" if tool else None,
        )
        trained = f"stopped after GRPO, whose model is saved to {out / 'model'}"
        _stop_if_signalled(
            stop, f"{trained}; the held-out evaluation after GRPO was not run", str(out / "model")
        )
        result["after"] = evaluate_zoom(
            out / "model", output=out / "eval_after.json", label="after GRPO", **stage
        )
        result.update(finish(out / "model"))
    result["max_steps"] = max_steps
    result["verdict"] = verdict(result["after"]["accuracy"], seed, tool, max_steps)
    return result


def verdict(accuracy: float, seed: int, tool: bool, max_steps: int = MAX_STEPS) -> str:
    """How a run's held-out accuracy after GRPO compares with the documented one of its seed and with the target
    (>= `TARGET` with the tool; without it, chance is the ceiling: one pattern in three), as `common.verdict_text`
    says it: the documented figures are those of the default run (`MAX_STEPS` GRPO steps), and a shorter run that
    falls short of the target has not reached it in its steps, not missed it.

    Args:
        accuracy (`float`): the run's held-out accuracy after GRPO.
        seed (`int`): the run's seed.
        tool (`bool`): the run offered the `zoom` tool.
        max_steps (`int`, *optional*, defaults to `MAX_STEPS`): the GRPO steps the run trained.
    """
    from .common import verdict_text

    if not tool:
        chance = 1 / len(PATTERNS)
        return f"without the tool the shown image does not tell the patterns apart: chance is {chance:.3f}"
    documented = DOCUMENTED[seed] if seed < len(DOCUMENTED) else None
    return verdict_text(accuracy >= TARGET, f">= {TARGET:g}", seed, documented, MAX_STEPS, max_steps)
