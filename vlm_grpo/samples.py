"""Sample logs of a run (prompts, completions, rewards, advantages) and `vlm-grpo samples`, their HTML view.

The trainer writes `RUN_DIR/samples/step_{step:06d}.jsonl` with `write_samples`, one JSON line per prompt group:

    {"step": 10, "prompt": "What color is the square ?", "images": ["data/0001.png"], "solution": "red",
     "completions": ["red", "blue"], "rewards": {"accuracy": [1.0, 0.0]}, "advantages": [0.71, -0.71]}

`images` holds file paths ("" for an image that had no file); a reward is null where it does not apply.

    vlm-grpo samples runs/demo                      writes runs/demo/samples.html
    vlm-grpo samples runs/demo --output view.html
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SAMPLES_DIR = "samples"
DEFAULT_OUTPUT = "samples.html"
MAX_IMAGE_SIDE = 256
_FILE_NAME = re.compile(r"^step_(\d+)\.jsonl$")
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h2 { border-bottom: 2px solid #888; margin-top: 2em; }
.group { border: 1px solid #ccc; border-radius: 6px; padding: 0.8em; margin: 1em 0; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 0.9em; }
.prompt { background: #f4f4f4; padding: 0.5em; }
img { margin: 0.3em; border: 1px solid #aaa; vertical-align: top; }
.note { display: inline-block; margin: 0.3em; padding: 0.3em; color: #a00; border: 1px dashed #a00; }
table { border-collapse: collapse; margin-top: 0.5em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
td.num { text-align: right; font-family: monospace; }
"""


def samples_path(run_dir: str | Path, step: int) -> Path:
    """Where the samples of training step `step` go: `RUN_DIR/samples/step_{step:06d}.jsonl`."""
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
        path (`str | Path`): the JSONL file, usually `samples_path(output_dir, global_step)`.
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


def read_samples(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of `RUN_DIR/samples/step_*.jsonl`, ordered by step (file order within a step).

    Args:
        run_dir (`str | Path`): the run's `output_dir`.

    Returns:
        `list[dict]`: the records; empty when the run logged no samples.

    Raises:
        ValueError: `run_dir` is not a folder, or a line is not a JSON object with a `completions` list (the
            message names the file and the line number).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run folder {run_dir} does not exist; pass the output_dir of a training run.")
    files = [
        (int(m.group(1)), f)
        for f in (run_dir / SAMPLES_DIR).glob("step_*.jsonl")
        if (m := _FILE_NAME.match(f.name))
    ]
    records = []
    for _, file in sorted(files):
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{file}, line {number}: not valid JSON ({error.msg}); fix or delete it."
                ) from None
            if not isinstance(record, dict) or not isinstance(record.get("completions"), list):
                raise ValueError(
                    f"{file}, line {number}: not a sample record (a JSON object with a `completions` list); "
                    "fix or delete it."
                )
            records.append(record)
    return records


def image_data_uri(path: str | Path, max_side: int = MAX_IMAGE_SIDE) -> str:
    """The image at `path` as a PNG data URI, shrunk so that its long side is at most `max_side` pixels.

    Args:
        path (`str | Path`): image file.
        max_side (`int`, defaults to 256): longest side in pixels after resizing (smaller images are kept).

    Raises:
        OSError: the file is missing or not an image PIL can read (`PIL.UnidentifiedImageError`).
    """
    from PIL import Image

    with Image.open(path) as image:
        image.thumbnail((max_side, max_side))
        if image.mode not in ("RGB", "RGBA", "L", "LA"):
            image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _image_html(path: str, run_dir: Path, cache: dict[str, str]) -> str:
    """An inline `<img>` for one image path, or a visible note when it has no file or cannot be read."""
    from PIL import Image

    if not path:
        return '<span class="note">embedded image (no file saved)</span>'
    if path not in cache:
        candidates = [Path(path)] + ([run_dir / path] if not Path(path).is_absolute() else [])
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            cache[path] = f'<span class="note">missing: {html.escape(path)}</span>'
        else:
            try:
                uri = image_data_uri(found)
                cache[path] = f'<img src="{uri}" alt="{html.escape(path, quote=True)}">'
            except (OSError, ValueError, Image.DecompressionBombError) as error:
                cache[path] = (
                    f'<span class="note">unreadable: {html.escape(path)} ({html.escape(str(error))})</span>'
                )
    return cache[path]


def _number(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.4g}"
    return "&ndash;"


def _group_html(record: dict[str, Any], run_dir: Path, cache: dict[str, str]) -> str:
    """One prompt group: prompt, images, solution and the completions table."""
    rewards = record.get("rewards") or {}
    advantages = record.get("advantages") or []
    parts = ['<div class="group">', f'<pre class="prompt">{html.escape(str(record.get("prompt", "")))}</pre>']
    images = record.get("images") or []
    if images:
        parts.append("<div>" + "".join(_image_html(str(p or ""), run_dir, cache) for p in images) + "</div>")
    solution = record.get("solution")
    solution_text = "&ndash;" if solution is None else html.escape(str(solution))
    parts.append(f"<p><b>solution:</b> {solution_text}</p>")
    header = "".join(f"<th>{html.escape(str(name))}</th>" for name in rewards)
    parts.append(f"<table><tr><th>#</th><th>completion</th>{header}<th>advantage</th></tr>")
    for i, completion in enumerate(record["completions"]):
        cells = "".join(
            f'<td class="num">{_number(values[i] if i < len(values) else None)}</td>'
            for values in (v if isinstance(v, list) else [] for v in rewards.values())
        )
        advantage = _number(advantages[i] if i < len(advantages) else None)
        parts.append(
            f"<tr><td>{i}</td><td><pre>{html.escape(str(completion))}</pre></td>{cells}"
            f'<td class="num">{advantage}</td></tr>'
        )
    parts.append("</table></div>")
    return "\n".join(parts)


def render_html(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write a static, self-contained HTML page of a run's samples (images embedded as data URIs).

    Args:
        run_dir (`str | Path`): the run's `output_dir`.
        output (`str | Path | None`, defaults to None): the page to write; None means `RUN_DIR/samples.html`.

    Returns:
        `Path`: the page written.

    Raises:
        ValueError: no sample files in the run, or a malformed line (see `read_samples`).
    """
    run_dir = Path(run_dir)
    records = read_samples(run_dir)
    if not records:
        raise ValueError(
            f"no samples in {run_dir / SAMPLES_DIR} (expected step_*.jsonl files); the trainer writes them "
            "while training, so train with sample logging on first."
        )
    title = f"Samples of {run_dir}"
    body = [f"<h1>{html.escape(title)}</h1>"]
    cache: dict[str, str] = {}
    step = object()
    for record in records:
        if record.get("step") != step:
            step = record.get("step")
            body.append(f"<h2>step {html.escape(str(step))}</h2>")
        body.append(_group_html(record, run_dir, cache))
    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
    output = Path(output) if output is not None else run_dir / DEFAULT_OUTPUT
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    return output


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo samples`; a missing or malformed sample log exits with status 2 and one line."""
    parser = argparse.ArgumentParser(prog="vlm-grpo samples", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's output_dir")
    parser.add_argument(
        "--output", default=None, help=f"HTML page to write (default RUN_DIR/{DEFAULT_OUTPUT})"
    )
    args = parser.parse_args(argv)
    try:
        output = render_html(args.run_dir, args.output)
    except ValueError as error:
        print(f"vlm-grpo samples: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(output)


if __name__ == "__main__":
    main()
