"""The zoom demo's task: scenes whose quarters hold patterns that only a zoomed view shows, the environment whose
`zoom` tool shows them, and a reward on the tool call (see `vlm_grpo.demos.zoom` for the demo).

A scene is `SCENE`x`SCENE` pixels; each of its quarters holds a `MARK`x`MARK` mark filled with one of `PATTERNS` (4x4
tiles of 8 dark pixels, any two orthogonal as +-1 tiles), drawn at random for each quarter. Reduced by `TILE` (what the
model is first shown), every mark becomes the same grey, pixel for pixel.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from PIL import Image

from .common import write_split

SCENE, SHOWN, QUARTER, MARK, TILE = 128, 32, 64, 48, 4
PATTERNS: dict[str, list[list[int]]] = {
    "rows": [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]],
    "columns": [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]],
    "checks": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]],
}
"""The marks' fills, as 4x4 tiles (1 is dark): each has 8 dark pixels, so every tile averages to the same grey, and
any two agree on half their pixels (as +-1 tiles they are orthogonal), so none is a shade of another. Three, not four:
each fourth pattern tried (`diagonal`, `squares`, 1-pixel `lines`) was, on some seed, never answered right after
GRPO, while the other three were (docs/demos.md, "Zoom")."""
QUARTERS = ("top left", "top right", "bottom left", "bottom right")
"""The quarters 1-4 by name, as the questions name them and as `zoom`'s description numbers them."""
QUESTION = "Which pattern fills the {where} quarter ? Options : rows , columns , checks ."


class ZoomScene:
    """The zoom demo's environment: one per row, reset with the row's full-resolution scene; its tool is `zoom`."""

    def reset(self, scene: str | None = None, **row: Any) -> None:
        """Load the row's scene (`scene`, a file path); the prompt is left as it is."""
        self.scene = Image.open(scene).convert("RGB")

    def zoom(self, region: int) -> list:
        """Show one quarter of the image at full resolution.

        Args:
            region: the quarter: 1 top left, 2 top right, 3 bottom left, 4 bottom right.
        """
        if region not in (1, 2, 3, 4):
            raise ValueError(f"region must be 1, 2, 3 or 4, not {region!r}")
        x, y = (region - 1) % 2 * QUARTER, (region - 1) // 2 * QUARTER
        return [{"type": "image", "image": self.scene.crop((x, y, x + QUARTER, y + QUARTER))}]


def first_call(completion: Any) -> dict[str, Any] | None:
    """The first tool call of a conversational completion (`{"name": ..., "arguments": {...}}`), or None."""
    for message in completion if isinstance(completion, list) else ():
        for call in message.get("tool_calls") or ():
            function = call.get("function", call)
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = {}
            return {
                "name": function.get("name"),
                "arguments": arguments if isinstance(arguments, dict) else {},
            }
    return None


def zoomed_right(completions: list[Any], region: list[int], **kwargs: Any) -> list[float]:
    """1.0 when a completion's first tool call is `zoom` on the quarter its question asks about (`region`), else 0.0.

    A reward on tool use is a plain reward: the completion's assistant messages carry their `tool_calls`.

    Args:
        completions (`list[list[dict]]`): conversational completions (every turn, tool messages included).
        region (`list[int]`): the quarter each row's question asks about (the records' `region` column).
    """
    scores = []
    for completion, right in zip(completions, region, strict=True):
        call = first_call(completion)
        hit = call is not None and call["name"] == "zoom" and call["arguments"].get("region") == right
        scores.append(1.0 if hit else 0.0)
    return scores


def draw_scene(patterns: list[str], rng: random.Random) -> Image.Image:
    """A `SCENE`x`SCENE` light image whose quarters 1-4 each hold one `MARK`x`MARK` mark, of `patterns[q - 1]`.

    Each mark lies on the `TILE` grid at a random place inside its quarter, so that reducing the scene by `TILE`
    averages whole tiles: every pattern becomes the same grey.
    """
    background = tuple(rng.randint(225, 240) for _ in range(3))
    scene = Image.new("RGB", (SCENE, SCENE), background)
    pixels = scene.load()
    for region, pattern in enumerate(patterns, start=1):
        tile = PATTERNS[pattern]
        x0 = (region - 1) % 2 * QUARTER + rng.randrange(0, QUARTER - MARK + 1, TILE)
        y0 = (region - 1) // 2 * QUARTER + rng.randrange(0, QUARTER - MARK + 1, TILE)
        for dy in range(MARK):
            for dx in range(MARK):
                pixels[x0 + dx, y0 + dy] = (0, 0, 0) if tile[dy % TILE][dx % TILE] else (255, 255, 255)
    return scene


def shown(scene: Image.Image) -> Image.Image:
    """The scene as the model first sees it: `SHOWN`x`SHOWN`, each `TILE`x`TILE` block averaged."""
    return scene.reduce(SCENE // SHOWN)


def question(region: int) -> str:
    """The question about the mark in quarter `region` (1-4), which it names in words."""
    return QUESTION.format(where=QUARTERS[region - 1])


def write_data(out_dir: Path, seed: int = 0, n_train: int = 512, n_warm: int = 96, n_eval: int = 64) -> dict:
    """Write the scenes, the shown images and the records of each split; returns the data configs by split name and
    the warm-start answers (`"warm_answers"`, one per warm-start record).

    Each quarter's pattern is drawn at random, and the one asked about takes each pattern in turn, so that each is the
    answer equally often (an answer that ignores the image is right a third of the time). The warm-start records come
    in threes: one scene and one question, answered once with each pattern. Trained on them, the model's answer to a
    question is as likely to be any pattern, whatever the image: the warm start teaches the call and the answer's
    form, and nothing that GRPO would have to unlearn.

    Args:
        out_dir (`Path`): the data folder.
        seed (`int`, *optional*, defaults to `0`): seed of the drawing.
        n_train (`int`, *optional*, defaults to `512`): GRPO records.
        n_warm (`int`, *optional*, defaults to `96`): warm-start records (32 scenes and questions, each answered with
            the three patterns).
        n_eval (`int`, *optional*, defaults to `64`): held-out records.
    """
    rng = random.Random(seed)
    names = list(PATTERNS)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    for split, n in (("train", n_train), ("warm", n_warm), ("eval", n_eval)):
        records = []
        repeats = len(PATTERNS) if split == "warm" else 1  # a warm-start prompt once with each answer
        for i in range(n):
            if i % repeats == 0:
                scene_index = i // repeats
                region = scene_index % len(QUARTERS) + 1
                patterns = [rng.choice(names) for _ in QUARTERS]
                # each pattern is the answer equally often
                patterns[region - 1] = names[scene_index % len(names)]
                scene = draw_scene(patterns, rng)
                name = f"images/{split}_{i // repeats:04d}"
                scene.save(out_dir / f"{name}_scene.png")
                shown(scene).save(out_dir / f"{name}.png")
            records.append(
                {
                    "image": f"{name}.png",
                    "problem": question(region),
                    "solution": patterns[region - 1],
                    "options": list(PATTERNS),
                    "accu_reward_method": "choice_accuracy",
                    "region": region,
                    "scene": str((out_dir / f"{name}_scene.png").resolve()),
                }
            )
        out[split] = write_split(out_dir, split, records)
    out["warm_answers"] = [list(PATTERNS)[i % len(PATTERNS)] for i in range(n_warm)]
    return out


def vocabulary(tool_section: str = "") -> list[str]:
    """The task's words: the question's, the call's and those of the chat template's tool section, its runs of
    punctuation (`{"`, `":`) included, so that the prompt and the call are short."""
    words = QUESTION.replace("{where}", " ".join(QUARTERS)).split() + ["zoom", "name", "arguments", "region"]
    found = re.findall(r"[A-Za-z]+|\d|[^\sA-Za-z\d]{2,}", tool_section)
    return list(dict.fromkeys([*words, *found]))
