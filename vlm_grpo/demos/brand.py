"""Brand demo: pick the brand of a synthetic logo among 56 options listed in the prompt (`choice_accuracy`).

The prompt follows the brand experiment it mirrors: the image, the question, then every brand numbered `1. Name`,
`2. Name`, ..., then "Please only respond with the brand name". Each brand's logo is a tile of one colour filling
the image with a shape of another colour near its middle (8 colours, ordered pairs of two different colours: 56
brands; the shape, one of four, follows the pair). Images vary in shade, mark size and position; the held-out
images are drawn apart from the training ones. Chance is 1/56 (1.8%).

A random model answers with any word of its vocabulary, and GRPO alone barely moves from chance: with a 1/56
hit rate, most groups of completions get no reward at all. So a supervised warm start comes first (8 labelled
images per brand, 20 epochs at learning rate 1e-3: at 3e-3 one seed in three barely left chance), as in the
SFT-then-GRPO pipeline of that experiment; GRPO then learns from its own answers on 1,680 other images, sampling at
temperature 0.5 (at 1.0 the warm model's flat distribution finds the right brand too rarely to move its greedy
answer). The shape spans 32-40 pixels of the 56: with smaller ones, most wrong answers named the right tile colour
and a wrong shape colour (docs/demos.md, "Brand").
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from .common import DemoTask, run_task, words_of, write_split

IMAGE_SIZE = 56
COLORS = (
    (220, 40, 40),
    (40, 170, 40),
    (40, 60, 220),
    (235, 210, 40),
    (150, 50, 200),
    (250, 140, 30),
    (30, 30, 30),
    (245, 245, 245),
)
SHAPES = ("circle", "square", "triangle", "bar")
_ONSETS = "B D F G K L M N P R S T V Z".split()
_VOWELS = "a e i o u".split()
INTRO = "Please identify the most appropriate brand from the following options based on the image content:"
OUTRO = "Please only respond with the brand name, no additional explanation needed."
REWARDS = ("choice_accuracy",)
GRPO_SETTINGS: dict[str, Any] = dict(
    max_completion_length=1,
    learning_rate=1e-3,
    per_device_train_batch_size=256,
    num_generations=16,
    temperature=0.5,
)
"""GRPO settings of this demo (`grpo_config` fills in the rest)."""


def brand_names(n: int, seed: int = 0) -> list[str]:
    """`n` distinct made-up brand names of two syllables (`"Bako"`, `"Zute"`, ...), fixed by `seed`."""
    rng = random.Random(seed)
    names = [f"{a}{v}{b.lower()}{w}" for a, v, b, w in itertools.product(_ONSETS, _VOWELS, _ONSETS, _VOWELS)]
    return rng.sample(names, n)


def brands() -> list[tuple[str, int, int, str]]:
    """The 56 brands: `(name, tile colour index, shape colour index, shape)`."""
    pairs = [(a, b) for a in range(len(COLORS)) for b in range(len(COLORS)) if a != b]
    names = brand_names(len(pairs))
    return [(name, a, b, SHAPES[(a + b) % len(SHAPES)]) for name, (a, b) in zip(names, pairs)]


def prompt(names: list[str]) -> str:
    """The question with every option numbered, one per line."""
    lines = [INTRO, *(f"{i + 1}. {name}" for i, name in enumerate(names)), OUTRO]
    return "\n".join(lines)


def vocabulary() -> list[str]:
    """The task's words: the question's (with every option) and the brand names."""
    names = [b[0] for b in brands()]
    return [*words_of(prompt(names)), *names]


def _shade(color: tuple[int, int, int], rng: random.Random) -> tuple[int, ...]:
    return tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in color)


def draw_logo(tile: int, mark: int, shape: str, rng: random.Random) -> Image.Image:
    """A logo filling the image: a tile of colour `tile` with a `shape` of colour `mark` near its middle."""
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), _shade(COLORS[tile], rng))
    draw = ImageDraw.Draw(image)
    half, fill = rng.randint(16, 20), _shade(COLORS[mark], rng)
    cx, cy = IMAGE_SIZE // 2 + rng.randint(-4, 4), IMAGE_SIZE // 2 + rng.randint(-4, 4)
    x1, y1, x2, y2 = cx - half, cy - half, cx + half, cy + half
    if shape == "circle":
        draw.ellipse((x1, y1, x2, y2), fill=fill)
    elif shape == "square":
        draw.rectangle((x1, y1, x2, y2), fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, y1), (x2, y2), (x1, y2)], fill=fill)
    else:
        draw.rectangle((x1, cy - half // 2, x2, cy + half // 2), fill=fill)
    return image


def write_task(
    out_dir: Path, n_train: int = 1680, n_warm: int = 448, n_eval: int = 224, seed: int = 0
) -> dict:
    """Write the train, warm-start and held-out splits (every brand equally often); returns YAMLs and warm targets.

    Args:
        out_dir (`Path`): the data folder.
        n_train (`int`, *optional*, defaults to `1680`): GRPO records (30 per brand).
        n_warm (`int`, *optional*, defaults to `448`): warm-start records (8 per brand).
        n_eval (`int`, *optional*, defaults to `224`): held-out records (4 per brand).
        seed (`int`, *optional*, defaults to `0`): seed of the drawing.
    """
    rng = random.Random(seed)
    table = brands()
    names = [b[0] for b in table]
    question = prompt(names)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Any] = {}
    for split, n in (("train", n_train), ("warm", n_warm), ("eval", n_eval)):
        records = []
        for i in range(n):
            name, tile, mark, shape = table[i % len(table)]
            file = f"images/{split}_{i:04d}.png"
            draw_logo(tile, mark, shape, rng).save(out_dir / file)
            records.append({"image": file, "problem": question, "solution": name, "options": names})
        rng.shuffle(records)
        paths[split] = write_split(out_dir, split, records)
        if split == "warm":
            paths["warm_targets"] = [r["solution"] for r in records]
    return paths


TASK = DemoTask(
    output_dir="runs/demo-brand",
    max_steps=400,
    write_data=write_task,
    vocabulary=vocabulary,
    rewards=REWARDS,
    max_new_tokens=2,
    image_size=IMAGE_SIZE,
    warm_epochs=20,
    warm_learning_rate=1e-3,
    grpo_settings=GRPO_SETTINGS,
    target=0.8,
    documented=(0.808, 0.951, 0.955),
)
"""The brand demo: 400 GRPO steps after a warm start of 20 epochs (16 records a step, learning rate 1e-3)."""


def run_brand(output_dir: str = TASK.output_dir, **kwargs: Any) -> dict:
    """Run the brand demo with `run_task` (`max_steps`, `seed`, `warm_epochs`, `data_sizes`, GRPO overrides)."""
    return run_task(TASK, output_dir, **kwargs)
