"""`vlm-grpo samples`: a run's sample log (see `vlm_grpo.runtime.sample_log`) read back and rendered as one HTML page.

vlm-grpo samples runs/demo                      writes runs/demo/samples.html
vlm-grpo samples runs/demo --output view.html
vlm-grpo samples runs/demo --last 1 --max_groups 4    the last logged step, its first 4 prompt groups
vlm-grpo samples runs/demo --oldest_first       the first logged step at the top

A page lists the logged steps newest first (`--oldest_first` reverses it), numbered as the console and the curves
number them (the first step is 1). It shows the first `--max_groups` prompt groups of each step (default 8; under a
step with more, a line says how many of how many are shown), and embeds each image as a PNG, or, when the PNG is
large, as the smaller of a 256-colour PNG and a JPEG: a page of a few steps stays small enough to keep in git. A
video is shown as a strip of frames spread over it (its first and last included).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import VLMGRPOError, run_cli
from ..runtime.sample_log import SAMPLE_FILE, SAMPLES_DIR

DEFAULT_OUTPUT = "samples.html"
MAX_GROUPS = 8
"""Prompt groups shown per logged step by default (the first ones of the step's file)."""
IMAGE_SIDE = 384
VIDEO_FRAME_SIDE = 160
"""Long side in pixels of each frame in a video's strip of frames."""
"""Long side of every inline image, in pixels: larger ones are shrunk, small ones enlarged (nearest pixel)."""
IMAGE_BYTES = 12_000
"""Largest PNG embedded as it is; a larger image is embedded as the smaller of a 256-colour PNG (synthetic
images stay sharp) and a JPEG of quality `JPEG_QUALITY` (photographs stay small)."""
JPEG_QUALITY = 80
SOLUTION_COLOR = (0, 160, 0)
BOX_COLORS = ((30, 90, 230), (230, 140, 0), (150, 40, 200), (0, 170, 170), (200, 0, 120), (120, 80, 30))
"""Colours of the predicted boxes of completions 0, 1, 2, ... (cycled); the solution box is green."""
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h2 { border-bottom: 2px solid #888; margin-top: 2em; }
.group { border: 1px solid #ccc; border-radius: 6px; padding: 0.8em; margin: 1em 0; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 0.9em; }
.prompt { background: #f4f4f4; padding: 0.5em; }
img { margin: 0.3em; border: 1px solid #aaa; vertical-align: top; image-rendering: pixelated; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; border: 1px solid #444; }
.note { display: inline-block; margin: 0.3em; padding: 0.3em; color: #a00; border: 1px dashed #a00; }
table { border-collapse: collapse; margin-top: 0.5em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
td.num { text-align: right; font-family: monospace; }
"""


def read_samples(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of `RUN_DIR/samples/step_*.jsonl`, ordered by step (file order within a step).

    Args:
        run_dir (`str | Path`): the run's `output_dir`.

    Returns:
        `list[dict]`: the records; empty when the run logged no samples.

    Raises:
        VLMGRPOError: `run_dir` is not a folder, or a line is not a JSON object with a `completions` list (the
            message names the file and the line number).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise VLMGRPOError(f"run folder {run_dir} does not exist; pass the output_dir of a training run.")
    files = [
        (int(m.group(1)), f)
        for f in (run_dir / SAMPLES_DIR).glob("step_*.jsonl")
        if (m := SAMPLE_FILE.match(f.name))
    ]
    records = []
    for _, file in sorted(files):
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise VLMGRPOError(
                    f"{file}, line {number}, column {error.colno}: not valid JSON ({error.msg}); fix or delete it."
                ) from None
            if not isinstance(record, dict) or not isinstance(record.get("completions"), list):
                raise VLMGRPOError(
                    f"{file}, line {number}: not a sample record (a JSON object with a `completions` list); "
                    "fix or delete it."
                )
            records.append(record)
    return records


def image_data_uri(
    path: str | Path, side: int = IMAGE_SIDE, boxes: Sequence[tuple[Sequence[float], tuple]] = ()
) -> str:
    """The image at `path` as a data URI (see `encode_image`), scaled so that its long side is `side` pixels, boxes
    drawn on it.

    Args:
        path (`str | Path`): image file.
        side (`int`, *optional*, defaults to `384`): long side in pixels after scaling (small images are enlarged
            pixel by pixel, so that a 56-pixel image stays readable).
        boxes (`Sequence[tuple[box, colour]]`, *optional*, defaults to `()`): boxes `[x1, y1, x2, y2]` in pixels of
            the original image, each drawn as a rectangle of its RGB colour.

    Raises:
        OSError: the file is missing or not an image PIL can read (`PIL.UnidentifiedImageError`).
    """
    from PIL import Image, ImageDraw

    with Image.open(path) as image:
        scale = side / max(image.size)
        shown = _scaled(image.convert("RGBA" if "A" in image.getbands() else "RGB"), side)
    draw = ImageDraw.Draw(shown)
    for box, colour in boxes:
        x1, y1, x2, y2 = (v * scale for v in box)
        draw.rectangle([min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)], outline=colour, width=3)
    return encode_image(shown)


def _saved(image: Any, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, **options)
    return buffer.getvalue()


def encode_image(image: Any) -> str:
    """A PIL image as a data URI: PNG when that takes at most `IMAGE_BYTES`, otherwise the smaller of a 256-colour
    PNG and (for an image with no transparency) a JPEG of quality `JPEG_QUALITY`.

    Args:
        image (`PIL.Image.Image`): an RGB or RGBA image.

    Returns:
        `str`: `data:image/png;base64,...` or `data:image/jpeg;base64,...`.
    """
    from PIL import Image

    encoded = [("png", _saved(image, format="PNG"))]
    if len(encoded[0][1]) > IMAGE_BYTES:
        palette = image.quantize(256, method=Image.Quantize.FASTOCTREE)
        encoded = [("png", _saved(palette, format="PNG", optimize=True))]
        if image.mode == "RGB":
            encoded.append(("jpeg", _saved(image, format="JPEG", quality=JPEG_QUALITY)))
    kind, data = min(encoded, key=lambda item: len(item[1]))
    return f"data:image/{kind};base64," + base64.b64encode(data).decode("ascii")


def record_boxes(record: dict[str, Any]) -> tuple[list[float] | None, list[list[float] | None]]:
    """`(solution box, predicted box per completion)` of a grounding record; `(None, [])` for other records.

    A record is a grounding one when its solution is a box `[x1, y1, x2, y2]` (a list, or text holding one, as the
    `iou` reward reads it); each completion's box is the one `iou` scores (None when it wrote none).
    """
    from ..rewards.text import answer_or_text, find_box, strip_answer_tag

    solution = strip_answer_tag(record.get("solution"))
    if isinstance(solution, str):
        solution = find_box(solution)
    numbers = isinstance(solution, list) and len(solution) == 4
    if not numbers or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in solution):
        return None, []
    predicted = []
    for completion in record["completions"]:
        answer = answer_or_text(str(completion))
        predicted.append(find_box(answer) if answer is not None else None)
    return [float(v) for v in solution], predicted


def _image_html(path: str, run_dir: Path, cache: dict[str, str], boxes: Sequence = ()) -> str:
    """An inline `<img>` for one image path (with `boxes` drawn), or a visible note when it cannot be read."""
    from PIL import Image

    if not path:
        return '<span class="note">embedded image (no file saved)</span>'
    if boxes:  # drawn for this group only
        cache = {}
    if path not in cache:
        found = _found(path, run_dir)
        name = html.escape(
            Path(path).name, quote=True
        )  # the file name only: a page never shows machine paths
        if found is None:
            cache[path] = f'<span class="note">missing: {name}</span>'
        else:
            try:
                cache[path] = f'<img src="{image_data_uri(found, boxes=boxes)}" alt="{name}">'
            except (OSError, ValueError, Image.DecompressionBombError) as error:
                cache[path] = f'<span class="note">unreadable: {name} ({html.escape(str(error))})</span>'
    return cache[path]


def _video_html(video: dict[str, Any], run_dir: Path) -> str:
    """A strip of frames spread over one video (`vlm_grpo.data.video_frames.preview_frames`), or a visible note when it cannot
    be read."""
    from PIL import Image

    from ..data.video_frames import preview_frames, video_name

    name = html.escape(Path(video_name(video)).name, quote=True)  # the file name only: no machine paths
    local = {
        "path": _found(video.get("path"), run_dir) if video.get("path") else None,
        "frames": [_found(frame, run_dir) for frame in video.get("frames") or []],
    }
    if (video.get("path") and local["path"] is None) or None in local["frames"]:
        return f'<span class="note">missing: {name}</span>'
    try:
        frames = preview_frames(local)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        return f'<span class="note">unreadable: {name} ({html.escape(str(error))})</span>'
    shown = "".join(
        f'<img src="{encode_image(_scaled(Image.fromarray(frame), VIDEO_FRAME_SIDE))}" alt="{name}">'
        for frame in frames
    )
    return f'<div class="video" title="{name}">{shown}<span class="note">video: {name}</span></div>'


def _found(path: str, run_dir: Path) -> Path | None:
    """`path` as given, or relative to the run's folder; None where neither is a file."""
    candidates = [Path(path)] + ([run_dir / path] if not Path(path).is_absolute() else [])
    return next((c for c in candidates if c.is_file()), None)


def _scaled(image: Any, side: int) -> Any:
    """`image` scaled so that its long side is `side` pixels (enlarged pixel by pixel, reduced smoothly)."""
    from PIL import Image

    scale = side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.NEAREST if scale > 1 else Image.Resampling.LANCZOS)


def _swatch(colour: tuple[int, int, int]) -> str:
    """A small square of `colour`: the key from a drawn box to its row."""
    return f'<span class="swatch" style="background: rgb{tuple(colour)}"></span>'


def _number(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.4g}"
    return "&ndash;"


TOOL_IMAGE_MARK = "[image]"
"""Where a completion's text (`vlm_grpo.trainer.metrics.completion_text`) holds an image a tool returned."""


def _with_tool_images(text: str, paths: Sequence[str], run_dir: Path, cache: dict[str, str]) -> str:
    """A completion's escaped `text` with its tools' images (`paths`) inline, one at each `[image]` mark in order;
    images without a mark (none expected) follow the text."""
    pieces = text.split(TOOL_IMAGE_MARK)
    out = [pieces[0]]
    for k, piece in enumerate(pieces[1:]):
        out.append(_image_html(paths[k], run_dir, cache) if k < len(paths) else TOOL_IMAGE_MARK)
        out.append(piece)
    out += [_image_html(path, run_dir, cache) for path in paths[len(pieces) - 1 :]]
    return "".join(out)


def _group_html(record: dict[str, Any], run_dir: Path, cache: dict[str, str]) -> str:
    """One prompt group: prompt, images, solution and the completions table."""
    rewards = record.get("rewards") or {}
    advantages = record.get("advantages") or []
    parts = ['<div class="group">', f'<pre class="prompt">{html.escape(str(record.get("prompt", "")))}</pre>']
    images = record.get("images") or []
    solution_box, predicted = record_boxes(record) if len(images) == 1 else (None, [])
    colours = [BOX_COLORS[i % len(BOX_COLORS)] for i in range(len(predicted))]
    boxes = [(solution_box, SOLUTION_COLOR)] if solution_box else []
    boxes += [(box, colour) for box, colour in zip(predicted, colours, strict=True) if box is not None]
    if images:
        parts.append(
            "<div>" + "".join(_image_html(str(p or ""), run_dir, cache, boxes) for p in images) + "</div>"
        )
    for video in record.get("videos") or []:
        parts.append(_video_html(video, run_dir))
    solution = record.get("solution")
    solution_text = "&ndash;" if solution is None else html.escape(str(solution))
    key = f"{_swatch(SOLUTION_COLOR)}" if solution_box else ""
    parts.append(f"<p><b>solution:</b> {key}{solution_text}</p>")
    header = "".join(f"<th>{html.escape(str(name))}</th>" for name in rewards)
    parts.append(f"<table><tr><th>#</th><th>completion</th>{header}<th>advantage</th></tr>")
    tool_images = record.get("tool_images") or []
    for i, completion in enumerate(record["completions"]):
        cells = "".join(
            f'<td class="num">{_number(values[i] if i < len(values) else None)}</td>'
            for values in (v if isinstance(v, list) else [] for v in rewards.values())
        )
        advantage = _number(advantages[i] if i < len(advantages) else None)
        swatch = _swatch(colours[i]) if i < len(predicted) and predicted[i] is not None else ""
        text = _with_tool_images(
            html.escape(str(completion)), tool_images[i] if i < len(tool_images) else [], run_dir, cache
        )
        parts.append(
            f'<tr><td>{swatch}{i}</td><td><pre>{text}</pre></td>{cells}<td class="num">{advantage}</td></tr>'
        )
    parts.append("</table></div>")
    return "\n".join(parts)


def shown_note(shown: int, total: int) -> str:
    """The line under a step's heading when the page shows only `shown` of its `total` prompt groups."""
    return f"<p>{shown} of {total} prompt groups of this step shown</p>"


def render_html(
    run_dir: str | Path,
    output: str | Path | None = None,
    last: int | None = None,
    max_groups: int | None = MAX_GROUPS,
    oldest_first: bool = False,
) -> Path:
    """Write a static, self-contained HTML page of a run's samples (images embedded as data URIs).

    Args:
        run_dir (`str | Path`): the run's `output_dir`.
        output (`str | Path | None`, *optional*, defaults to `None`): the page to write; `None` means
            `RUN_DIR/samples.html`.
        last (`int | None`, *optional*, defaults to `None`): only the last `last` logged steps; `None` means every
            step.
        max_groups (`int | None`, *optional*, defaults to `MAX_GROUPS`): at most this many prompt groups of each
            step, the first ones (the page says how many of how many it shows); `None` means every group.
        oldest_first (`bool`, *optional*, defaults to `False`): list the steps from the first logged one on; by
            default the newest step comes first.

    Returns:
        `Path`: the page written.

    Raises:
        VLMGRPOError: no sample files in the run, or a malformed line (see `read_samples`).
    """
    run_dir = Path(run_dir)
    by_step: dict[Any, list[dict[str, Any]]] = {}
    for record in read_samples(run_dir):
        by_step.setdefault(record.get("step"), []).append(record)
    steps = sorted(by_step, key=lambda s: (s is None, s))  # oldest first
    if last is not None:
        steps = steps[-last:] if last > 0 else []
    if not oldest_first:
        steps.reverse()
    if not steps:
        raise VLMGRPOError(
            f"no samples in {run_dir / SAMPLES_DIR} (expected step_*.jsonl files); the trainer writes them "
            "while training, so train with sample logging on first."
        )
    folder = (
        run_dir.resolve()
    )  # the run, by its folder and the one above (demos save to .../model); no machine path
    title = (
        f"Samples of {folder.parent.name}/{folder.name}"
        if folder.parent.name
        else f"Samples of {folder.name}"
    )
    body = [f"<h1>{html.escape(title)}</h1>"]
    cache: dict[str, str] = {}
    for step in steps:
        group = by_step[step]
        body.append(f"<h2>step {html.escape(str(step))}</h2>")
        if max_groups and 0 < max_groups < len(group):
            body.append(shown_note(max_groups, len(group)))
            group = group[:max_groups]
        body.extend(_group_html(record, run_dir, cache) for record in group)
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
    """Entry point of `vlm-grpo samples`; a missing or malformed sample log is a `VLMGRPOError` (one line, status 1)."""
    parser = argparse.ArgumentParser(prog="vlm-grpo samples", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's output_dir")
    parser.add_argument(
        "--output", default=None, help=f"HTML page to write (default RUN_DIR/{DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--last", type=int, default=None, help="only the last N logged steps (a smaller page)"
    )
    parser.add_argument(
        "--max_groups",
        type=int,
        default=MAX_GROUPS,
        help=f"at most N prompt groups of each step (default {MAX_GROUPS}); 0: every group",
    )
    parser.add_argument(
        "--oldest_first", action="store_true", help="list the first logged step first (default: newest first)"
    )
    args = parser.parse_args(argv)
    output = render_html(
        args.run_dir,
        args.output,
        last=args.last,
        max_groups=args.max_groups or None,
        oldest_first=args.oldest_first,
    )
    print(output)


if __name__ == "__main__":
    run_cli("samples", main, sys.argv[1:])
