"""`vlm-grpo demo`: a tiny VLM learns a visual choice task with GRPO, on a CPU, in minutes, with no download.

It builds a tiny Qwen2-VL with `build_tiny_model`, draws a synthetic task (a coloured square on grey: "which
colour?", four options, held-out images for evaluation), writes it as VLM-R1 style JSON with YAML data configs,
evaluates the untrained model, trains with `vlm_grpo.train.run` (reward: `choice_accuracy`), and evaluates again.
Outputs in `--output_dir`: `data/`, `model-init/`, `model/` (trained, with `training_curves.png`,
`samples/` and `samples.html`), `eval_before.json`, `eval_after.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from PIL import Image

from .config import VLMGRPOConfig, VLMModelConfig
from .evaluate import evaluate
from .plot import plot_run
from .samples import render_html
from .testing import ROLE_WORDS, build_tiny_model
from .train import ScriptArguments, run

COLORS = {"red": (220, 40, 40), "green": (40, 190, 40), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
QUESTION = "What color is the square ? Options : red , green , blue , yellow ."


def draw_square(color: str, rng: random.Random, size: int = 56) -> Image.Image:
    """A grey `size`x`size` image with one square of `color`, with random position, size and shade."""
    image = Image.new("RGB", (size, size), tuple(rng.randint(110, 150) for _ in range(3)))
    side = rng.randint(size // 3, size // 2)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    shade = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in COLORS[color])
    image.paste(Image.new("RGB", (side, side), shade), (x, y))
    return image


def write_task(out_dir: Path, n_train: int = 256, n_eval: int = 64, seed: int = 0) -> tuple[Path, Path]:
    """Write the colour task as images + JSON records + one data YAML per split; returns the two YAML paths."""
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
        (out_dir / f"{split}.json").write_text(json.dumps(records))
        yaml_path = out_dir / f"{split}.yaml"
        yaml_path.write_text(f"datasets:\n  - json_path: {split}.json\n")
        paths.append(yaml_path)
    return paths[0], paths[1]


def run_demo(output_dir: str = "runs/demo", max_steps: int = 500, seed: int = 0) -> dict:
    """Build, evaluate, train, evaluate. Returns `{"before": report, "after": report, "train_seconds": float}`."""
    out = Path(output_dir)
    train_yaml, eval_yaml = write_task(out / "data", seed=seed)
    # A small vocabulary (chat roles + the task's words) lets random sampling find the right word early on.
    words = QUESTION.split()
    model_dir = build_tiny_model(
        "qwen2_vl", out / "model-init", seed=seed, base_words=ROLE_WORDS, words=words
    )
    eval_kwargs = dict(rewards=["accuracy"], max_new_tokens=1, batch_size=64)
    before = evaluate(model_dir, str(eval_yaml), output=str(out / "eval_before.json"), **eval_kwargs)
    print(f"held-out accuracy before training: {before['accuracy']:.3f} (n={before['n']})", flush=True)

    script_args = ScriptArguments(data_config=str(train_yaml), rewards=["accuracy"])
    training_args = VLMGRPOConfig(
        output_dir=str(out / "model"),
        max_steps=max_steps,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=1,  # the answer is one word
        learning_rate=3e-4,
        lr_scheduler_type="constant",
        beta=0.0,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=25,
        log_samples_steps=100,
        save_strategy="no",
        report_to="none",
        seed=seed,
        disable_tqdm=True,
        use_cpu=True,
    )
    model_args = VLMModelConfig(model_name_or_path=model_dir, dtype="float32")
    start = time.perf_counter()
    run(script_args, training_args, model_args)
    train_seconds = time.perf_counter() - start
    after = evaluate(str(out / "model"), str(eval_yaml), output=str(out / "eval_after.json"), **eval_kwargs)
    print(f"held-out accuracy after {max_steps} GRPO steps ({train_seconds:.0f} s): {after['accuracy']:.3f}")
    print(f"training curves: {plot_run(out / 'model')}")
    print(f"samples page: {render_html(out / 'model')}")
    return {"before": before, "after": after, "train_seconds": train_seconds}


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo demo`."""
    parser = argparse.ArgumentParser(prog="vlm-grpo demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="runs/demo")
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_demo(args.output_dir, args.max_steps, args.seed)
