"""The sample log of a run: where the trainer writes each logged step's prompt groups, and how.

Every `log_samples_steps` steps the trainer writes `RUN_DIR/samples/step_{step:06d}.jsonl` with `write_samples`,
one JSON line per prompt group:

    {"step": 10, "prompt": "What color is the square ?", "images": ["data/0001.png"], "solution": "red",
     "completions": ["red", "blue"], "rewards": {"accuracy": [1.0, 0.0]}, "advantages": [0.71, -0.71]}

`step` is the step the rollout trains as, counted from 1 like the console, `trainer_state.json`'s `log_history` and
the curves: its completions come from the model as it was after `step - 1` optimizer steps. With
`log_samples_steps: N` the logged steps are 1, N, 2N, ... (the steps the console logs when `logging_steps` is N);
the first one shows the model before any update.
A rollout that serves several optimizer steps (`num_iterations` > 1, or `steps_per_generation` >
`gradient_accumulation_steps`) is numbered by the first of them, and logged when that step is one of those.

`images` holds file paths ("" for an image that had no file); a reward is null where it does not apply. A step whose
tools returned images also has `tool_images`: per completion, the paths (relative to the run's folder) of those
images, saved under `samples/images/`, in the order of the `[image]` marks in the completion's text. A group whose
prompt holds videos also has `videos`, each as the dataset stores it (`{"path": file or null, "frames": [files]}`).
`vlm_grpo.cli.samples` reads these files back and renders them as an HTML page.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SAMPLES_DIR = "samples"
"""The folder of the sample log inside the run's `output_dir`."""

SAMPLE_FILE = re.compile(r"^step_(\d+)\.jsonl$")
"""The name of one step's file in `SAMPLES_DIR`; group 1 is the step."""


def samples_path(run_dir: str | Path, step: int) -> Path:
    """Where the samples of training step `step` (1-based) go: `RUN_DIR/samples/step_{step:06d}.jsonl`."""
    return Path(run_dir) / SAMPLES_DIR / f"step_{step:06d}.jsonl"


def _jsonable(value: Any) -> Any:
    """`value` with non-finite floats turned into None (JSON has no NaN) and tuples into lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_samples(path: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Write prompt-group records as JSON lines (parent folders are created, an existing file is replaced).

    Args:
        path (`str | Path`): the JSONL file, usually `samples_path(output_dir, step)`.
        records (`Iterable[dict]`): one dict per prompt group with the keys `step`, `prompt`, `images`,
            `solution`, `completions`, `rewards` and `advantages` (see the module docstring). NaN rewards are
            written as null.

    Returns:
        `Path`: the file written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(_jsonable(dict(r)), ensure_ascii=False) for r in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
