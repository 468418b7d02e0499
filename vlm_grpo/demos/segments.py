"""Math demo: read two segment lengths off a figure and answer their total in `\\boxed{}` (reward `geo3k`).

Each 56x56 image shows two horizontal segments, one in the upper half and one in the lower, of 1 to 4 units each
(a unit is 14 pixels, one patch of the vision tower, and segments lie on the patch grid at random offsets); the
question asks for their total length (2 to 8, drawn uniformly, so chance is 1/7). The answer is
`<think> total length </think> \\boxed{N}` and `geo3k` scores it `0.9 * correct + 0.1 * format` (Geometry3K
style); the reported accuracy is the share of held-out answers that are right.

A random model cannot write `\\boxed{}`, so a format-only warm start comes first: each warm-start image is
paired with the total of another, random image, so the warm start learns the layout and nothing of the figure;
all that the figure teaches comes from GRPO.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from .common import DemoTask, run_task, write_split

IMAGE_SIZE = 56
UNIT = 14
MAX_UNITS = 4
QUESTION = "What is the total length of the two segments ? Answer in \\boxed{} ."
THINK = "<think> total length </think>"
REWARDS = ("math_accuracy", "geo3k")
"""Held-out scores; the first, `math_accuracy`, is the reported accuracy. GRPO trains on `geo3k` alone."""
MAX_NEW_TOKENS = 8
GRPO_SETTINGS: dict[str, Any] = dict(
    max_completion_length=MAX_NEW_TOKENS,
    learning_rate=1e-3,
    per_device_train_batch_size=256,
    num_generations=8,
)
"""GRPO settings of this demo (`grpo_config` fills in the rest)."""


def vocabulary() -> list[str]:
    """The task's words: the question's, the think words, `\\boxed{`, `}` and the numbers 0 to 20."""
    words = QUESTION.replace("\\boxed{}", "").split() + ["total", "length", "\\boxed{", "}"]
    return [*words, *(str(i) for i in range(21))]


def draw_segments(a: int, b: int, rng: random.Random) -> Image.Image:
    """Two dark segments of `a` and `b` units, one in the upper half and one in the lower, on a light background.

    A unit is one patch of the vision tower (14 pixels) and segments lie on the patch grid, at random offsets.
    """
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), tuple(rng.randint(228, 236) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    cells = IMAGE_SIZE // UNIT
    for units, row in ((a, rng.randint(0, 1)), (b, rng.randint(2, 3))):
        x = rng.randint(0, cells - units) * UNIT
        shade = tuple(rng.randint(25, 35) for _ in range(3))
        draw.rectangle((x, row * UNIT, x + units * UNIT - 1, (row + 1) * UNIT - 1), fill=shade)
    return image


def boxed(total: int) -> str:
    """The completion in the task's format."""
    return f"{THINK} \\boxed{{{total}}}"


def write_task(
    out_dir: Path, n_train: int = 1024, n_warm: int = 256, n_eval: int = 98, seed: int = 0
) -> dict:
    """Write the train, warm-start and held-out splits; returns the YAML paths and the warm-start targets.

    Args:
        out_dir (`Path`): the data folder.
        n_train (`int`, *optional*, defaults to `1024`): GRPO records.
        n_warm (`int`, *optional*, defaults to `256`): warm-start records.
        n_eval (`int`, *optional*, defaults to `98`): held-out records (14 per total).
        seed (`int`, *optional*, defaults to `0`): seed of the drawing.
    """
    rng = random.Random(seed)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = {}
    totals: list[int] = []
    for split, n in (("train", n_train), ("warm", n_warm), ("eval", n_eval)):
        records = []
        for i in range(n):
            total = 2 + i % (2 * MAX_UNITS - 1)
            a = rng.randint(max(1, total - MAX_UNITS), min(MAX_UNITS, total - 1))
            name = f"images/{split}_{i:04d}.png"
            draw_segments(a, total - a, rng).save(out_dir / name)
            records.append({"image": name, "problem": QUESTION, "solution": str(total)})
            if split == "warm":
                totals.append(total)
        rng.shuffle(records)
        paths[split] = write_split(out_dir, split, records)
    # Format-only targets: a random total, not the image's.
    paths["warm_targets"] = [boxed(rng.choice(totals)) for _ in range(n_warm)]
    return paths


TASK = DemoTask(
    output_dir="runs/demo-math",
    max_steps=250,
    write_data=write_task,
    vocabulary=vocabulary,
    rewards=REWARDS,
    max_new_tokens=MAX_NEW_TOKENS,
    train_rewards=("geo3k",),
    image_size=IMAGE_SIZE,
    warm_epochs=6,
    warm_batch_size=32,
    grpo_settings=GRPO_SETTINGS,
    target=0.3,
    target_is_gain=True,
    documented=(0.949, 1.0, 0.704),
)
"""The math demo: 250 GRPO steps on `geo3k` after a format-only warm start of 6 epochs (32 records a step)."""


def run_segments(output_dir: str = TASK.output_dir, **kwargs: Any) -> dict:
    """Run the math demo with `run_task` (`max_steps`, `seed`, `warm_epochs`, `data_sizes`, GRPO overrides)."""
    return run_task(TASK, output_dir, **kwargs)
