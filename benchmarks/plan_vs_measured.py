"""`vlm-grpo plan`'s prediction against the peak memory of real training steps, for a grid of recipes.

    .venv/bin/python benchmarks/plan_vs_measured.py            (about 10 minutes on 2 CPU cores)
    .venv/bin/python benchmarks/plan_vs_measured.py --rows 1   (the first row only: checks the script; --only 4 5)

Each row builds a random Qwen2-VL of the given size locally (the benchmark's `build_model`: a word vocabulary padded
so that the LM head weighs as in real checkpoints), trains it with `VLMGRPOTrainer` on the CPU (float32, completions
forced to full length; the vision tower frozen, as in every full fine-tuning recipe) in a fresh process, and
compares what one step adds on top of what the run holds:
- measured: after a first step (weights, reference model and optimizer states then exist, and every library the
  step loads is loaded), `malloc_trim` and the resident-memory high-water mark reset; the peak resident memory
  (VmHWM) of the next two steps minus the resident memory at that point: gradients, activations, the LM-head
  tiles and the generation cache, allocated and freed by each step;
- predicted: `vlm_grpo.planner.report.plan_config` for the same options, in float32: the larger of its training
  pass and its generation terms (the held terms are parameter counts times bytes, checked exactly by
  `tests/test_plan.py`). The full predicted peak is printed too.
The last column is predicted / measured. The planner targets every row within 15%.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path

ROWS = [  # size, LoRA, beta, gradient checkpointing, G, completion tokens
    ("small", False, 0.0, False, 4, 64),
    ("small", False, 0.04, True, 8, 128),
    ("small", True, 0.04, True, 8, 128),
    ("medium", False, 0.0, False, 4, 32),
    ("medium", False, 0.04, True, 4, 64),
    ("medium", True, 0.0, True, 8, 64),
    ("medium", True, 0.04, False, 4, 64),
]
SIZES = {  # Qwen2-VL dims for `bench_grpo.build_model`
    "small": dict(hidden=512, layers=4, heads=8, kv_heads=2, inter=1536, vis_dim=128, vis_depth=2, vis_heads=4,
                  extra_vocab=8192, long_side=448),
    "medium": dict(hidden=1024, layers=8, heads=8, kv_heads=2, inter=3072, vis_dim=256, vis_depth=2, vis_heads=4,
                   extra_vocab=16384, long_side=448),
}  # fmt: skip
SIDE = 448
QUESTION = "What color is the square and where is it ? Give one short answer ."


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def options(model_dir: str, lora: bool, beta: float, checkpointing: bool, G: int, length: int, out: str):
    """The training and model options of one row, as `vlm-grpo train` would parse them."""
    from vlm_grpo.config import VLMGRPOConfig, VLMModelConfig

    args = VLMGRPOConfig(
        output_dir=out, per_device_train_batch_size=G, num_generations=G, gradient_accumulation_steps=1,
        max_completion_length=length, generation_kwargs={"min_new_tokens": length}, beta=beta,
        gradient_checkpointing=checkpointing, learning_rate=1e-5, max_steps=3, logging_steps=1, report_to="none",
        save_strategy="no", seed=0, use_cpu=True, bf16=False, disable_tqdm=True, log_samples_steps=0,
        freeze_vision_modules=True,
    )  # fmt: skip
    model_args = VLMModelConfig(
        model_name_or_path=model_dir, dtype="float32", use_peft=lora, lora_r=16, lora_alpha=32
    )
    return args, model_args


def measure(row: tuple, model_dir: str, out: str, queue) -> None:
    """In a fresh process: train three steps; put the peak resident memory of steps 2-3 above the memory after step 1."""
    import torch
    from bench_grpo import build_dataset, length_reward
    from transformers import TrainerCallback
    from trl import get_peft_config

    from vlm_grpo.trainer import VLMGRPOTrainer

    torch.set_num_threads(2)
    _, lora, beta, checkpointing, G, length = row
    args, model_args = options(model_dir, lora, beta, checkpointing, G, length, out)
    dataset = build_dataset(dict(images=1, question=QUESTION), SIDE, n=3 * G)
    trainer = VLMGRPOTrainer(
        model_dir, length_reward, args=args, train_dataset=dataset, peft_config=get_peft_config(model_args)
    )
    base = []

    class AfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # VmHWM := VmRSS
                base.append(_status_kib("VmRSS"))

    trainer.add_callback(AfterFirstStep())
    trainer.train()
    lengths = {log.get("completions/mean_length") for log in trainer.state.log_history if "loss" in log}
    queue.put(((_status_kib("VmHWM") - base[0]) * 1024, sorted(lengths)))


def predict(row: tuple, model_dir: str, out: str) -> tuple[int, int, int]:
    """`(predicted bytes a step adds, predicted peak, prompt tokens)` of a row."""
    from vlm_grpo.models import get_model_family
    from vlm_grpo.planner.report import plan_config

    _, lora, beta, checkpointing, G, length = row
    args, model_args = options(model_dir, lora, beta, checkpointing, G, length, out)
    family = get_model_family(model_dir)
    processor = family.load_processor(model_dir)
    from PIL import Image
    from transformers import AutoConfig

    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    encoded = family.encode_prompt(processor, prompt, [Image.new("RGB", (SIDE, SIDE))])
    image_tokens = encoded.input_ids.count(AutoConfig.from_pretrained(model_dir).image_token_id)
    text_tokens = len(encoded.input_ids) - image_tokens
    planned = plan_config(
        args, model_args, 80 * 2**30, image_size=(SIDE, SIDE), text_tokens=text_tokens, device="cpu"
    )
    plan = planned.plan
    return plan.peak - sum(term.gpu for term in plan.held), plan.peak, planned.recipe.prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=len(ROWS), help="run the first N rows")
    parser.add_argument("--only", type=int, nargs="*", help="run these rows (1-based) only")
    opts = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_grpo import build_model

    # glibc keeps freed blocks above its dynamic mmap threshold (up to 32 MiB) in the heap, where resident memory
    # counts them; a fixed threshold maps every large tensor on its own and unmaps it when freed, so resident memory
    # follows the bytes the tensors hold (read by each spawned process at start)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
    ctx = mp.get_context("spawn")
    print(f"{'size':<8}{'params':>9}{'LoRA':>6}{'beta':>6}{'ckpt':>6}{'G':>3}{'C':>5}{'prompt':>8}"
          f"{'peak MiB':>10}{'a step adds: predicted':>24}{'measured MiB':>14}{'ratio':>7}")  # fmt: skip
    ratios = []
    with tempfile.TemporaryDirectory() as work:
        built = {}
        chosen = [ROWS[i - 1] for i in opts.only] if opts.only else ROWS[: opts.rows]
        for row in chosen:
            size = row[0]
            if size not in built:
                built[size] = build_model(Path(work) / size, SIZES[size], SIDE, 0)
            model_dir, out = str(Path(work) / size), str(Path(work) / "out")
            predicted, peak, prompt = predict(row, model_dir, out)
            queue = ctx.Queue()
            process = ctx.Process(target=measure, args=(row, model_dir, out, queue))
            process.start()
            measured, lengths = queue.get()
            process.join()
            if lengths != [float(row[5])]:
                print(f"WARNING: completion lengths {lengths}, not {row[5]}")
            ratios.append(predicted / measured)
            params = built[size].split("M")[0]
            print(f"{size:<8}{params + 'M':>9}{'yes' if row[1] else 'no':>6}{row[2]:>6}{'on' if row[3] else 'off':>6}"
                  f"{row[4]:>3}{row[5]:>5}{prompt:>8}{peak / 2**20:>10.0f}{predicted / 2**20:>24.0f}{measured / 2**20:>14.0f}"
                  f"{predicted / measured:>7.2f}", flush=True)  # fmt: skip
    outside = [f"{r:.2f}" for r in ratios if abs(r - 1) > 0.15]
    print(
        f"rows within 15%: {len(ratios) - len(outside)} of {len(ratios)}"
        + (f"; outside: {outside}" if outside else "")
    )


if __name__ == "__main__":
    main()
