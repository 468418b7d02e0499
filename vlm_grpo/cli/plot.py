"""`vlm-grpo plot`: training curves of a run, read from its `trainer_state.json`, drawn into one PNG.

    vlm-grpo plot runs/demo                       writes runs/demo/training_curves.png
    vlm-grpo plot runs/demo --output curves.png

The newest state wins: `RUN_DIR/trainer_state.json` (written by `trainer.save_state()` at the end of training)
or the `RUN_DIR/checkpoint-*/trainer_state.json` with the largest `global_step`. Panels, against the step:
reward per reward function, total reward, accuracy (every accuracy-style reward: `accuracy`, `iou`,
`choice_accuracy`, `math_accuracy`, `geo3k`), completion length, tool calls (a run with tools), KL and entropy.
Panels that would draw the same series are merged (with one reward, the reward panel is also its per-function and, for an accuracy reward, its
accuracy panel), and a near-constant series is drawn on a sane scale instead of its rounding noise.

When the run evaluated (`eval_data_config` with `eval_strategy` / `eval_steps`), its `eval_*` log entries are drawn
too: each panel's series gets a dashed held-out curve, labelled `(held-out)`, at the steps it was evaluated.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from ..errors import VLMGRPOError, run_cli
from ..rewards.accuracy import ACCURACY_METHODS

ACCURACY_REWARDS = ("accuracy", *ACCURACY_METHODS)
"""Rewards that measure whether the answer is right: `accuracy` and each reward it dispatches to."""

STATE_FILE = "trainer_state.json"
DEFAULT_OUTPUT = "training_curves.png"
EVAL_PREFIX = "eval_"
"""Prefix of the keys of evaluation log entries (`eval_reward`, `eval_rewards/iou/mean`, ...)."""
HELD_OUT = " (held-out)"
"""Suffix of the label of a held-out (evaluation) curve."""
_REWARD_KEY = re.compile(r"^rewards/(.+)/mean$")
MIN_RELATIVE_SPAN = 0.05
"""A panel's y-range spans at least this share of its largest |value| (so rounding noise stays flat)."""


def find_trainer_state(run_dir: str | Path) -> Path:
    """The newest `trainer_state.json` of a run: the run folder's own or a checkpoint's, by `global_step`.

    Args:
        run_dir (`str | Path`): the run's `output_dir`.

    Returns:
        `Path`: the state file; on a tie the run folder's own file wins (it is written last).

    Raises:
        VLMGRPOError: the folder holds no state file, or one cannot be read.
    """
    run_dir = Path(run_dir)
    candidates = [run_dir / STATE_FILE, *sorted(run_dir.glob(f"checkpoint-*/{STATE_FILE}"))]
    best: tuple[int, int, Path] | None = None
    for rank, path in enumerate(candidates):
        if not path.is_file():
            continue
        step = int(_read_state(path).get("global_step") or 0)
        key = (step, -rank, path)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        raise VLMGRPOError(
            f"no {STATE_FILE} in {run_dir} nor in its checkpoint-* folders; pass the output_dir of a training "
            "run (the train entry point saves it at the end, checkpoints save it at every save step)."
        )
    return best[2]


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise VLMGRPOError(f"cannot read {path}: {error}") from None
    if not isinstance(state, dict):
        raise VLMGRPOError(f"{path} is not a trainer state (expected a JSON object).")
    return state


def _logs_step(entry: Any, prefix: str = "") -> bool:
    """Whether `entry` is a log entry of a step: a `step` and a loss or a reward, their keys starting with `prefix`."""
    if not isinstance(entry, dict) or "step" not in entry:
        return False
    keys = [k[len(prefix) :] for k in entry if k.startswith(prefix)]
    return "reward" in keys or "loss" in keys or any(_REWARD_KEY.match(k) for k in keys)


def load_log_history(run_dir: str | Path) -> tuple[Path, list[dict[str, Any]]]:
    """The log entries of the newest state: training entries (a `step` and a `loss` or a reward) and held-out
    evaluation entries (the same with `eval_` keys).

    Args:
        run_dir (`str | Path`): the run's `output_dir`.

    Returns:
        `tuple[Path, list[dict]]`: the state file read and its entries, sorted by step (at a step where the run
        evaluated, the training entry comes first).

    Raises:
        VLMGRPOError: no state file, or it logged no training step.
    """
    path = find_trainer_state(run_dir)
    history = _read_state(path).get("log_history") or []
    training = [e for e in history if _logs_step(e)]
    if not training:
        raise VLMGRPOError(
            f"{path} has no training log entries; train for at least `logging_steps` steps before plotting."
        )
    held_out = [e for e in history if _logs_step(e, EVAL_PREFIX) and not _logs_step(e)]
    return path, sorted(training + held_out, key=lambda e: e["step"])


def _series(entries: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """Steps and values of `key` where it was logged as a finite number."""
    steps, values = [], []
    for entry in entries:
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(float(entry["step"]))
            values.append(float(value))
    return steps, values


def _draw(
    ax: Any,
    entries: list[dict[str, Any]],
    keys: dict[str, str],
    title: str,
    missing: str,
    legend: bool = False,
) -> None:
    """One panel: a line per `keys` item (label -> log key), or the `missing` note when none was logged."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    drawn, low, high = 0, math.inf, -math.inf
    for label, key in keys.items():
        steps, values = _series(entries, key)
        if steps:
            style = (
                {"linestyle": "--", "marker": "s"}
                if key.startswith(EVAL_PREFIX)
                else {"marker": "o" if len(steps) < 30 else None}
            )
            ax.plot(steps, values, markersize=3, label=label, **style)
            drawn += 1
            low, high = min(low, *values), max(high, *values)
    if drawn:
        ax.set_ylim(*y_limits(low, high))
    if drawn == 0:
        ax.text(0.5, 0.5, missing, ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xticks([])
        ax.set_yticks([])
    elif legend or len(keys) > 1:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


def y_limits(low: float, high: float) -> tuple[float, float]:
    """y-range of a panel whose values lie in `[low, high]`: a margin around them, at least `MIN_RELATIVE_SPAN` of
    the largest |value| wide (1 when every value is 0), so that a near-constant series is drawn flat."""
    largest = max(abs(low), abs(high))
    span = max(high - low, MIN_RELATIVE_SPAN * largest) or 1.0
    middle = (low + high) / 2
    return middle - 0.55 * span, middle + 0.55 * span


def plot_title(run_dir: str | Path, state_file: Path) -> str:
    """The figure's title: the run, named by its folder and the one above it, and the checkpoint read when it is
    not the run's final state; never an absolute path.

    Args:
        run_dir (`str | Path`): the run's `output_dir`.
        state_file (`Path`): the `trainer_state.json` read, inside `run_dir`.

    Returns:
        `str`: e.g. `"demo_grounding/model"` or `"runs/rec (checkpoint-40)"`.
    """
    run_dir = Path(run_dir).resolve()
    name = f"{run_dir.parent.name}/{run_dir.name}" if run_dir.parent.name else run_dir.name
    inside = Path(state_file).resolve().parent.relative_to(run_dir).as_posix()
    return name if inside == "." else f"{name} ({inside})"


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Draw the training curves of a run, with its held-out curves when it evaluated, into a PNG.

    Args:
        run_dir (`str | Path`): the run's `output_dir`.
        output (`str | Path | None`, defaults to None): the PNG to write; None means `RUN_DIR/training_curves.png`.

    Returns:
        `Path`: the PNG written.

    Raises:
        VLMGRPOError: no `trainer_state.json` in the run, or no training step logged in it.
    """
    path, entries = load_log_history(run_dir)
    figure = curves_figure(entries, plot_title(run_dir, path))
    output = Path(output) if output is not None else Path(run_dir) / DEFAULT_OUTPUT
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100, format="png")
    return output


def curves_figure(entries: list[dict[str, Any]], title: str) -> Any:
    """The figure of the curves: the panels of `curve_panels` on a grid of two rows.

    Args:
        entries (`list[dict]`): log entries, as `load_log_history` returns them.
        title (`str`): the figure's title (see `plot_title`).

    Returns:
        `matplotlib.figure.Figure`: the figure, with an Agg canvas.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = curve_panels(entries)
    columns = math.ceil(len(panels) / 2)
    figure = Figure(figsize=(5 * columns, 8.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, columns).ravel()
    for ax, (series, panel_title, missing, legend) in zip(axes, panels, strict=False):
        _draw(ax, entries, series, panel_title, missing, legend)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle(title, fontsize="medium")
    return figure


def curve_panels(entries: list[dict[str, Any]]) -> list[tuple[dict[str, str], str, str, bool]]:
    """The panels to draw, in order: `(series label -> log key, title, note when none was logged, legend)`.

    With one reward function, its curve is the total reward's (up to its weight) and, for an accuracy-style reward,
    the accuracy's: one panel shows it. Every series that was also evaluated (an `eval_` key) is followed by its
    held-out series, labelled with `HELD_OUT`.
    """
    keys = sorted({k for e in entries for k in e})
    per_function = {m.group(1): k for k in keys if (m := _REWARD_KEY.match(k))}
    accuracy = {n: k for n, k in per_function.items() if n in ACCURACY_REWARDS}
    panels: list[tuple[dict[str, str], str, str, bool]] = []  # (series, title, note when none, legend)
    if len(per_function) == 1:  # one reward: its curve is the total reward's (up to its weight)
        (name,) = per_function
        kind = "accuracy: " if name in accuracy else ""
        panels.append(({name: per_function[name]}, f"reward ({kind}{name})", "not logged", False))
    else:
        panels.append((per_function, "reward per function", "no per-function reward logged", True))
        panels.append(({"reward": "reward"}, "total reward", "not logged", False))
        panels.append((accuracy, "accuracy", f"no accuracy reward ({', '.join(ACCURACY_REWARDS)})", True))
    panels.append(({"mean": "completions/mean_length"}, "completion length (tokens)", "not logged", False))
    # a run with tools: how often the model calls them, and how often they fail
    if "tools/call_frequency" in keys:
        calls = {
            "calls per completion": "tools/call_frequency",
            "failures per call": "tools/failure_frequency",
        }
        panels.append((calls, "tool calls", "not logged", True))
    panels.append(({"kl": "kl"}, "KL to the reference", "not logged (beta = 0)", False))
    panels.append(({"entropy": "entropy"}, "entropy", "not logged", False))
    logged = set(keys)
    return [
        (_with_held_out(series, logged), title, missing, legend) for series, title, missing, legend in panels
    ]


def _with_held_out(series: dict[str, str], logged: set[str]) -> dict[str, str]:
    """`series` with, after each of its series, the held-out one (`eval_` + key) where that was logged."""
    both = {}
    for label, key in series.items():
        both[label] = key
        if EVAL_PREFIX + key in logged:
            both[label + HELD_OUT] = EVAL_PREFIX + key
    return both


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo plot`; a missing or empty state is a `VLMGRPOError` (one line, status 1)."""
    parser = argparse.ArgumentParser(prog="vlm-grpo plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's output_dir")
    parser.add_argument("--output", default=None, help=f"PNG to write (default RUN_DIR/{DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    output = plot_run(args.run_dir, args.output)
    print(output)


if __name__ == "__main__":
    run_cli("plot", main, sys.argv[1:])
