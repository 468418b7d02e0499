"""Multi-turn rollouts with an image tool: stock `trl.GRPOTrainer` vs `vlm_grpo.VLMGRPOTrainer`, step for step.

    .venv/bin/python benchmarks/bench_tools.py --steps 3 --warmup 1

(`--smoke --steps 1` checks the script in about a minute.)

Both trainers train the tiny model of the family whose builder carries its published tool-calling chat template
(`vlm_grpo.testing.a_family_with(tool_calls=True)`, Qwen3-VL), at this benchmark's scale (`bench_grpo.SCALES`: text
hidden size and depth), with the same rows, seed and config: a 448x448 noise image (256 image tokens) and a question,
G=8, full fine-tuning, beta 0, up to 2 tool-calling iterations and 64 completion tokens per turn. One tool, `zoom`,
answers every call with a 224x224 image and a line of text, so a row that calls it goes on with one more image. The
random model is made to write a tool call now and then by transformers' `sequence_bias` (the same in both trainers):
some rows call the tool, some answer at once, some call it again.

What differs: ours runs each group's prompt (its image included) once, in every turn and in the loss passes: the
turns after a tool result continue the prompt's prefill with each row's own history and the tools' images, and the
training forward feeds the tools' images to the completions' forward over the prompt's cache. Stock TRL runs every
row's whole history. Each trainer runs in its own process and the two take turns step by step (`alternate.py`), as
in `bench_grpo.py`.

Printed per trainer: the median step, the median time inside the model's `generate`, tokens per step, tool calls
per completion and rows entering the vision tower per step. The last line is `ratio tools: X` (ours / stock median
step time).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

from alternate import StepRecorder, run_alternating, step_order
from bench_grpo import add_run_options, build_dataset, quiet, start_run, step_tokens, vision_tower
from PIL import Image
from transformers import AutoConfig, PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer

from vlm_grpo.config import VLMGRPOConfig
from vlm_grpo.models import get_model_family
from vlm_grpo.testing import a_family_with, build_tiny_model
from vlm_grpo.trainer.trainer import VLMGRPOTrainer

FAMILY = a_family_with(tool_calls=True)
SHAPE = dict(
    name="tools", G=8, length=160, images=1, question="What is in the top left quarter ? Zoom in first ."
)
CALL = '<tool_call>\n{"name": "zoom", "arguments": {"region": 0}}\n</tool_call>'
ZOOM_SIDE = 224


def zoom(region: int) -> list:
    """Show one quarter of the image, enlarged.

    Args:
        region: the quarter, 0 to 3.
    """
    shade = 60 * (int(region) % 4)
    return [
        {"type": "image", "image": Image.new("RGB", (ZOOM_SIDE, ZOOM_SIDE), (shade, 255 - shade, 128))},
        {"type": "text", "text": f"quarter {region}"},
    ]


def turns_reward(completions, **kwargs) -> list[float]:
    """Characters the model wrote over every turn, / 100."""
    return [
        sum(len(m.get("content") or "") for m in c if m["role"] == "assistant") / 100.0 for c in completions
    ]


def call_bias(tokenizer) -> list:
    """`sequence_bias` that starts a `zoom` call now and then and, once started, completes it."""
    ids = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    return [[ids[: i + 1], 3.0 if i == 0 else 40.0] for i in range(len(ids))]


def build_trainer(name: str, opts, model_dir: str, recorder: StepRecorder):
    """Runs in the trainer's own process: the trainer `name` ("stock" or "ours") with `recorder` attached."""
    quiet()
    family = get_model_family(model_dir)
    processor = family.load_processor(model_dir)
    placeholders = family.placeholder_token_ids(processor, AutoConfig.from_pretrained(model_dir))
    common = dict(
        output_dir=str(Path(model_dir).parent / f"out_{name}"), per_device_train_batch_size=SHAPE["G"],
        num_generations=SHAPE["G"], gradient_accumulation_steps=1, max_completion_length=SHAPE["length"],
        max_tool_calling_iterations=2, beta=0.0, gradient_checkpointing=False, learning_rate=1e-5,
        max_steps=opts.warmup + opts.steps, logging_steps=1, report_to="none", save_strategy="no", seed=opts.seed,
        use_cpu=not opts.cuda, bf16=False, fp16=False, disable_tqdm=True, dataloader_num_workers=0,
        generation_kwargs={"suppress_tokens": placeholders, "sequence_bias": call_bias(processor.tokenizer)},
    )  # fmt: skip
    data = build_dataset(SHAPE, opts.side, seed=opts.seed)
    if name == "stock":
        trainer = GRPOTrainer(model=model_dir, reward_funcs=turns_reward, args=GRPOConfig(**common),
                              train_dataset=data, processing_class=processor, tools=[zoom])  # fmt: skip
    else:
        fields = {f.name for f in dataclasses.fields(VLMGRPOConfig)}
        extra = {"log_samples_steps": 0} if "log_samples_steps" in fields else {}
        trainer = VLMGRPOTrainer(model=model_dir, reward_funcs=turns_reward, args=VLMGRPOConfig(**common, **extra),
                                 train_dataset=data, processing_class=processor, tools=[zoom])  # fmt: skip
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(recorder)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    vision_tower(unwrapped).register_forward_pre_hook(recorder.count_vision, with_kwargs=True)
    unwrapped.generate = recorder.timed(unwrapped.generate)  # both trainers call this object's `generate`
    return trainer, {}


def report(name: str, rec: dict, warmup: int) -> float:
    """Print one table row from the measured steps (after `warmup`); return the median step time."""
    times, generate, patches = (rec[k][warmup:] for k in ("times", "timed", "patches"))
    logs = rec["logs"][warmup:]
    tokens = statistics.median(step_tokens(rec["logs"])[warmup:])
    calls = statistics.mean(log.get("tools/call_frequency", 0.0) for log in logs)
    length = statistics.mean(log["completions/mean_length"] for log in logs)
    median = statistics.median(times)
    print(f"{name:<8}{median:>10.3f}{min(times):>8.3f}{max(times):>8.3f}{statistics.median(generate):>12.3f}"
          f"{tokens:>10.0f}{calls:>12.2f}{length:>14.1f}{statistics.median(patches):>18.0f}")  # fmt: skip
    return median


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_options(parser, "trainer")
    opts = parser.parse_args()
    opts.cuda, dims = start_run(parser, opts, "per trainer, alternating stock/ours, each in its own process")
    opts.side = dims["long_side"]
    with tempfile.TemporaryDirectory(prefix="bench_tools_") as work:
        model_dir = build_tiny_model(
            FAMILY, Path(work) / "model", hidden_size=dims["hidden"], num_hidden_layers=dims["layers"],
            image_size=opts.side, seed=opts.seed,
        )  # fmt: skip
        records = run_alternating(["stock", "ours"], build_trainer, (opts, model_dir), opts.cuda)
    print(f"\n== tools: G={SHAPE['G']}, up to {SHAPE['length']} completion tokens (every turn and tool result), 2 tool-calling iterations, one "
          f"{opts.side}x{opts.side} image, a {ZOOM_SIDE}x{ZOOM_SIDE} image per tool result, full, beta 0, fp32, "
          f"tiny {FAMILY} (hidden {dims['hidden']}, {dims['layers']} layers)\n"
          f"step order: {' '.join(step_order(records))}")  # fmt: skip
    print(f"{'trainer':<8}{'median s':>10}{'min s':>8}{'max s':>8}{'generate s':>12}{'tok/step':>10}"
          f"{'calls/row':>12}{'mean length':>14}{'ViT patches/step':>18}")  # fmt: skip
    medians = {name: report(name, records[name], opts.warmup) for name in ("stock", "ours")}
    print(f"\nratio tools: {medians['ours'] / medians['stock']:.2f}")


if __name__ == "__main__":
    main()
