"""Grounding demo: find the one object in the image and answer its box, scored by `iou` + `rec_format`.

Each 112x112 image holds one object (a filled square or circle of one of four colours) on a noisy grey
background. Its box lies on a 16-pixel grid, so every box is written with the coordinate words 0, 16, ..., 112
of the tiny model's vocabulary. The answer is `<think> {colour} {shape} </think> <answer> [x1, y1, x2, y2]
</answer>` (VLM-R1's REC format).

The model sees each image at 28x28 (one image token): Qwen2-VL's vision tower has rotary positions only, so
in a tiny model the position of an object is readable only from inside a token's own pixels.

A random model cannot write that format, so a short supervised warm start teaches it first, on a few
examples (64 labelled images, 20 epochs); its held-out IoU is printed. GRPO then improves the boxes from its
own answers on 4,096 other images, 32 prompts x 8 completions a step, sampling at temperature 0.7 (at 1.0 most of
the warm model's early samples break the format, and GRPO's first steps go to relearning it), with TRL's adaptive
entropy bonus (`use_adaptive_entropy`): without it the policy's entropy fell to 0.01-0.03 nats a token within 300
steps, half the groups then had no reward spread, and the IoU stopped rising. Even with it, a third of the groups
score their eight boxes alike from step 325 on; dynamic sampling (`dynamic_sampling`) replaces them with fresh prompts,
in one extra generation round a step.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from .common import DemoTask, run_task, write_split

IMAGE_SIZE = 112
VIEW_SIZE = 28
GRID = 16
COLORS = {"red": (220, 40, 40), "green": (40, 190, 40), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
SHAPES = ("square", "circle")
QUESTION = "Find the {colour} {shape} . Answer its box [ x1 , y1 , x2 , y2 ] ."
REWARDS = ("iou", "rec_format")
MAX_NEW_TOKENS = 12
GRPO_SETTINGS: dict[str, Any] = dict(
    max_completion_length=MAX_NEW_TOKENS,
    learning_rate=1e-3,
    per_device_train_batch_size=256,
    num_generations=8,
    temperature=0.7,
    use_adaptive_entropy=True,
    entropy_target=0.2,
    lr_scheduler_type="cosine",
    dynamic_sampling=True,
    dynamic_sampling_max_rounds=1,
)
"""GRPO settings of this demo (`grpo_config` fills in the rest). At a constant learning rate of 1e-3 a run of 800
steps broke (seed 0: the format reward fell from 0.99 to 0.23 after step 400); the cosine decay keeps it. 32 prompts
a step instead of 16 took seed 1 from 0.261 -> 0.452 (800 steps) to 0.261 -> 0.653 in 500 steps. Dynamic sampling
replaces the groups whose eight boxes score alike (a third of them from step 325 on without it): seed 0 then gains +0.31
over its warm start in 500 steps, against +0.26. One extra generation round a step, not 3: late in a run most prompts
draw eight equal boxes, and the third and fourth rounds found few groups with a reward spread for their cost (seed 0 at
step 550: 108 prompts sampled for 12 such groups in 4 rounds, 60 for 8 in 2); the three seeds gained as much (+0.32,
+0.41, +0.37 against +0.32, +0.42, +0.34) in 600 steps (docs/demos.md)."""


def vocabulary() -> list[str]:
    """The task's words: question words, colours, shapes, box punctuation and the grid coordinates."""
    words = QUESTION.replace("{colour}", "").replace("{shape}", "").split()
    values = range(0, IMAGE_SIZE + 1, GRID)
    coords = [f"[{v}," for v in values] + [f"{v}," for v in values] + [f"{v}]" for v in values]
    return [*words, *COLORS, *SHAPES, *coords]


def draw_object(rng: random.Random) -> tuple[Image.Image, str, str, list[int]]:
    """One image: a grey noisy background with one object on the grid; returns image, colour, shape, box."""
    noise = np.random.default_rng(rng.randrange(2**32)).integers(100, 151, (IMAGE_SIZE, IMAGE_SIZE, 3))
    image = Image.fromarray(noise.astype(np.uint8))
    cells = IMAGE_SIZE // GRID
    w, h = rng.randint(2, 4), rng.randint(2, 4)
    x, y = rng.randint(0, cells - w), rng.randint(0, cells - h)
    box = [x * GRID, y * GRID, (x + w) * GRID, (y + h) * GRID]
    colour, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
    fill = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in COLORS[colour])
    draw = ImageDraw.Draw(image)
    corners = (box[0], box[1], box[2] - 1, box[3] - 1)
    (draw.rectangle if shape == "square" else draw.ellipse)(corners, fill=fill)
    return image, colour, shape, box


def answer(colour: str, shape: str, box: list[int]) -> str:
    """The completion in the task's format."""
    return f"<think> {colour} {shape} </think> <answer> [{box[0]}, {box[1]}, {box[2]}, {box[3]}] </answer>"


def write_task(out_dir: Path, n_train: int = 4096, n_warm: int = 64, n_eval: int = 64, seed: int = 0) -> dict:
    """Write the train, warm-start and held-out splits (disjoint images); returns YAML paths and warm targets.

    Args:
        out_dir (`Path`): the data folder.
        n_train (`int`, *optional*, defaults to `4096`): GRPO records.
        n_warm (`int`, *optional*, defaults to `64`): warm-start records, with their true boxes.
        n_eval (`int`, *optional*, defaults to `64`): held-out records.
        seed (`int`, *optional*, defaults to `0`): seed of the drawing.
    """
    rng = random.Random(seed)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = {}
    targets: list[str] = []
    for split, n in (("train", n_train), ("warm", n_warm), ("eval", n_eval)):
        records = []
        for i in range(n):
            image, colour, shape, box = draw_object(rng)
            name = f"images/{split}_{i:04d}.png"
            image.save(out_dir / name)
            records.append(
                {
                    "image": name,
                    "problem": QUESTION.format(colour=colour, shape=shape),
                    "solution": box,
                    "accu_reward_method": "iou",
                }
            )
            if split == "warm":
                targets.append(answer(colour, shape, box))
        paths[split] = write_split(out_dir, split, records)
    paths["warm_targets"] = targets
    return paths


TASK = DemoTask(
    output_dir="runs/demo-grounding",
    max_steps=600,
    write_data=write_task,
    vocabulary=vocabulary,
    rewards=REWARDS,
    max_new_tokens=MAX_NEW_TOKENS,
    image_size=VIEW_SIZE,
    warm_epochs=20,
    grpo_settings=GRPO_SETTINGS,
    target=0.3,
    target_is_gain=True,
    documented=(0.756, 0.668, 0.695),
)
"""The grounding demo: 600 GRPO steps with dynamic sampling (one extra round) after a warm start of 20 epochs (16 records
a step). In 500, seed 0 gained +0.31 over its warm start on one machine and +0.29 on another (docs/demos.md,
"Grounding")."""


def run_grounding(output_dir: str = TASK.output_dir, **kwargs: Any) -> dict:
    """Run the grounding demo with `run_task` (`max_steps`, `seed`, `warm_epochs`, `data_sizes`, GRPO overrides)."""
    return run_task(TASK, output_dir, **kwargs)
