"""Colour demo: name the colour of a square (four options, one word), scored by `choice_accuracy`.

`common.run_task` builds a tiny Qwen2-VL (`common.demo_model`), draws the task (a coloured square on grey,
held-out images for evaluation), evaluates the untrained model, trains with GRPO and evaluates again. The answer
is one word, which a random model already writes now and then, so there is no warm start; dynamic sampling keeps
the groups that have a right answer among wrong ones. Outputs in `output_dir`:
`data/`, `model-init/`, `model/` (trained, with `training_curves.png`, `samples/` and `samples.html`),
`eval_before.json`, `eval_after.json`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from PIL import Image

from .common import DemoTask, run_task, write_split

COLORS = {"red": (220, 40, 40), "green": (40, 190, 40), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
QUESTION = "What color is the square ? Options : red , green , blue , yellow ."
REWARDS = ("accuracy",)


def draw_square(color: str, rng: random.Random, size: int = 56) -> Image.Image:
    """A grey `size`x`size` image with one square of `color`, with random position, size and shade."""
    image = Image.new("RGB", (size, size), tuple(rng.randint(110, 150) for _ in range(3)))
    side = rng.randint(size // 3, size // 2)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    shade = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in COLORS[color])
    image.paste(Image.new("RGB", (side, side), shade), (x, y))
    return image


def write_task(out_dir: Path, n_train: int = 256, n_eval: int = 64, seed: int = 0) -> tuple[Path, Path]:
    """Write the colour task as images + JSON records + one data YAML per split; returns the two YAML paths.

    Args:
        out_dir (`Path`): the data folder.
        n_train (`int`, *optional*, defaults to `256`): training records.
        n_eval (`int`, *optional*, defaults to `64`): held-out records.
        seed (`int`, *optional*, defaults to `0`): seed of the drawing.
    """
    rng = random.Random(seed)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("eval", n_eval)):
        records = []
        for i in range(n):
            color = list(COLORS)[i % len(COLORS)]
            name = f"images/{split}_{i:04d}.png"
            draw_square(color, rng).save(out_dir / name)
            records.append(
                {
                    "image": name,
                    "problem": QUESTION,
                    "solution": color,
                    "options": list(COLORS),
                    "accu_reward_method": "choice_accuracy",
                }
            )
        paths.append(write_split(out_dir, split, records))
    return paths[0], paths[1]


def vocabulary() -> list[str]:
    """The task's words: the question's. A small vocabulary lets random sampling find the right word early on."""
    return QUESTION.split()


def write_data(out_dir: Path, seed: int = 0, **sizes: int) -> dict[str, Path]:
    """`write_task` with its two data configs by split name (`"train"`, `"eval"`), as `run_task` takes them."""
    return dict(zip(("train", "eval"), write_task(out_dir, seed=seed, **sizes), strict=True))


TASK = DemoTask(
    output_dir="runs/demo",
    max_steps=500,
    write_data=write_data,
    vocabulary=vocabulary,
    rewards=REWARDS,
    max_new_tokens=1,
    first_stage="before",
    grpo_settings={"dynamic_sampling": True},
    target=0.9,
    documented=(1.0, 1.0, 0.984),
)
"""The colour demo: 500 GRPO steps with `grpo_config`'s settings and dynamic sampling, no warm start.

Dynamic sampling, because most groups of the untrained model get no right answer at all (reward 0 for all 8
completions): without it, 66% of the first steps' groups teach nothing and the held-out score after 500 steps
depends on the seed and the machine (0.73 to 0.98 over three seeds here, 0.48 reported elsewhere); with it, every
step trains on groups with a right answer among wrong ones (see docs/demos.md)."""


def run_colour(output_dir: str = TASK.output_dir, **kwargs: Any) -> dict:
    """Run the colour demo with `run_task` (`max_steps`, `seed`, `data_sizes`, GRPO overrides); the first report
    is `before` (`eval_before.json`)."""
    return run_task(TASK, output_dir, **kwargs)
