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

    python benchmarks/plan_vs_measured.py --device cuda            (one GPU; real-size rows)
    python benchmarks/plan_vs_measured.py --device cuda --plan_only (the predictions only; runs anywhere)

`--device cuda` runs `CUDA_ROWS` instead: published checkpoints at their real size, built from their published
config with random bf16 weights directly on the GPU (`bench_grpo.random_model`; tokenizer and processor as
`bench_grpo.py --model NAME --random_weights` gets them), one image (896x896; 448x448 for full fine-tuning) and the
benchmark's long question, trained by `VLMGRPOTrainer` (sdpa attention, bf16, completions forced to full length) for three steps in a fresh process per
row. What the CUDA allocator counts, its peak statistics reset between phases:
- held: `torch.cuda.memory_allocated()` after step 1 (weights, reference model, optimizer states);
- step-1 peak: `torch.cuda.max_memory_allocated()` during step 1 (the optimizer states are created there);
- peak: `max_memory_allocated()` during steps 2-3, and "a step adds" is that peak minus held;
- reserved: `torch.cuda.max_memory_reserved()` during steps 2-3 (what the caching allocator holds from the driver;
  the CUDA context comes on top).
Predicted: `plan_config(..., device="cuda")` for the same options: the sum of its held terms, its peak, and the
difference. `--model` replaces every row's model (a folder holding `config.json`, or a published name), to check the
script on a small one.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path
from queue import Empty

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
CUDA_ROWS = [  # published checkpoint (random weights), LoRA, beta, checkpointing, G, completion tokens, image side
    ("Qwen/Qwen2.5-VL-3B-Instruct", False, 0.0, False, 8, 128, 448),
    ("Qwen/Qwen2.5-VL-3B-Instruct", True, 0.04, True, 8, 128, 896),
    ("Qwen/Qwen2.5-VL-7B-Instruct", True, 0.04, True, 8, 256, 896),
]
"""The rows measured on one H100 on 2026-11-26 (docs/planner.md), with the options they were measured with."""


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def options(
    model_dir: str,
    lora: bool,
    beta: float,
    checkpointing: bool,
    G: int,
    length: int,
    out: str,
    device: str = "cpu",
):
    """The training and model options of one row, as `vlm-grpo train` would parse them.

    On `"cpu"` float32; on `"cuda"` bf16 weights, and `bf16` left to the config (on where the GPU supports it).
    """
    from vlm_grpo.config import VLMGRPOConfig, VLMModelConfig

    cpu = device == "cpu"
    args = VLMGRPOConfig(
        output_dir=out, per_device_train_batch_size=G, num_generations=G, gradient_accumulation_steps=1,
        max_completion_length=length, generation_kwargs={"min_new_tokens": length}, beta=beta,
        gradient_checkpointing=checkpointing, learning_rate=1e-5, max_steps=3, logging_steps=1, report_to="none",
        save_strategy="no", seed=0, use_cpu=cpu, bf16=False if cpu else None, disable_tqdm=True,
        log_samples_steps=0, freeze_vision_modules=True,
    )  # fmt: skip
    model_args = VLMModelConfig(
        model_name_or_path=model_dir, dtype="float32" if cpu else "bfloat16", use_peft=lora, lora_r=16,
        lora_alpha=32,
    )  # fmt: skip
    return args, model_args


def measure(row: tuple, model_dir: str, out: str, queue) -> None:
    """In a fresh process: train three steps; put the peak resident memory of steps 2-3 above the memory after step 1."""
    import torch
    from bench_grpo import build_dataset, length_reward
    from transformers import TrainerCallback
    from trl import get_peft_config

    from vlm_grpo.trainer.trainer import VLMGRPOTrainer

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


def predict(
    row: tuple, model_dir: str, out: str, device: str = "cpu", side: int = SIDE, question: str = QUESTION
) -> tuple[int, int, int, int]:
    """`(predicted bytes a step adds, predicted peak, prompt tokens, predicted bytes held)` of a row."""
    from vlm_grpo.models import get_model_family
    from vlm_grpo.planner.report import plan_config

    _, lora, beta, checkpointing, G, length = row[:6]
    args, model_args = options(model_dir, lora, beta, checkpointing, G, length, out, device)
    family = get_model_family(model_dir)
    processor = family.load_processor(model_dir)
    from PIL import Image
    from transformers import AutoConfig

    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    encoded = family.encode_prompt(processor, prompt, [Image.new("RGB", (side, side))])
    image_tokens = encoded.input_ids.count(AutoConfig.from_pretrained(model_dir).image_token_id)
    text_tokens = len(encoded.input_ids) - image_tokens
    planned = plan_config(
        args, model_args, 80 * 2**30, image_size=(side, side), text_tokens=text_tokens, device=device
    )
    plan = planned.plan
    held = sum(term.gpu for term in plan.held)
    return plan.peak - held, plan.peak, planned.recipe.prompt_tokens, held


def measure_cuda(row: tuple, model_dir: str, out: str, queue) -> None:
    """In a fresh process on the GPU: build the row's model with random bf16 weights, train three steps, and put the
    allocator's figures (`held`, `first_peak`, `peak`, `reserved`, in bytes; see the module docstring)."""
    import torch
    from bench_grpo import LONG_QUESTION, build_dataset, length_reward, random_model
    from transformers import TrainerCallback
    from trl import get_peft_config

    from vlm_grpo.trainer.trainer import VLMGRPOTrainer

    _, lora, beta, checkpointing, G, length, side = row
    args, model_args = options(model_dir, lora, beta, checkpointing, G, length, out, device="cuda")
    model = random_model(model_dir, torch.bfloat16, "cuda", seed=0)
    dataset = build_dataset(dict(images=1, question=LONG_QUESTION), side, n=3 * G)
    trainer = VLMGRPOTrainer(
        model, length_reward, args=args, train_dataset=dataset, peft_config=get_peft_config(model_args)
    )
    figures = {}

    class Phases(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            if state.global_step == 1:
                figures.update(
                    first_peak=torch.cuda.max_memory_allocated(), held=torch.cuda.memory_allocated()
                )
                torch.cuda.reset_peak_memory_stats()
            elif state.global_step == args.max_steps:
                figures.update(
                    peak=torch.cuda.max_memory_allocated(), reserved=torch.cuda.max_memory_reserved()
                )

    trainer.add_callback(Phases())
    trainer.train()
    lengths = {log.get("completions/mean_length") for log in trainer.state.log_history if "loss" in log}
    queue.put((figures, sorted(lengths)))


def in_fresh_process(ctx, target, args: tuple):
    """Run `target(*args, queue)` in a fresh (spawned) process and return what it puts on the queue.

    Raises:
        `SystemExit`: the process ended without a result (its error is printed above).
    """
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(*args, queue))
    process.start()
    while True:
        try:
            result = queue.get(timeout=1.0)
            break
        except Empty:
            if not process.is_alive():
                raise SystemExit(
                    f"the measuring process failed (exit code {process.exitcode}); its error is above"
                ) from None
    process.join()
    return result


def mib(size: int | None) -> str:
    """`size` bytes in whole MiB, `-` for none."""
    return "-" if size is None else f"{size / 2**20:.0f}"


def run_cuda(opts, work: Path, ctx) -> None:
    """`--device cuda`: the real-size rows (predictions only with `--plan_only`)."""
    from bench_grpo import LONG_QUESTION, describe_size, prepare_model, quiet
    from transformers import AutoConfig

    quiet()
    rows = [CUDA_ROWS[i - 1] for i in opts.only] if opts.only else CUDA_ROWS[: opts.rows]
    if opts.model:
        rows = [(opts.model, *row[1:]) for row in rows]
    print(f"{'model':<28}{'params':>8}{'LoRA':>6}{'beta':>6}{'ckpt':>6}{'G':>3}{'C':>5}{'prompt':>8}"
          f"{'held MiB: plan':>16}{'measured':>10}{'a step adds: plan':>19}{'measured':>10}{'peak: plan':>12}"
          f"{'measured':>10}{'step-1 peak':>13}{'reserved':>10}{'ratio':>7}{'peak ratio':>12}")  # fmt: skip
    prepared, ratios = {}, []
    for row in rows:
        if row[0] not in prepared:
            prepared[row[0]] = prepare_model(row[0], True, work / f"model_{len(prepared)}")
        model_dir = prepared[row[0]][0]
        out = str(work / "out")
        adds, peak, prompt, held = predict(row, model_dir, out, "cuda", row[6], LONG_QUESTION)
        figures = {}
        if not opts.plan_only:
            figures, lengths = in_fresh_process(ctx, measure_cuda, (row, model_dir, out))
            if lengths != [float(row[5])]:
                print(f"WARNING: completion lengths {lengths}, not {row[5]}")
        measured = figures["peak"] - figures["held"] if figures else None
        ratio, peak_ratio = (
            (f"{adds / measured:.2f}", f"{peak / figures['peak']:.2f}") if figures else ("-", "-")
        )
        if figures:
            ratios.append(adds / measured)
        params = describe_size(AutoConfig.from_pretrained(model_dir)).split()[0]
        print(f"{Path(row[0]).name:<28}{params:>8}{'yes' if row[1] else 'no':>6}{row[2]:>6}"
              f"{'on' if row[3] else 'off':>6}{row[4]:>3}{row[5]:>5}{prompt:>8}{mib(held):>16}"
              f"{mib(figures.get('held')):>10}{mib(adds):>19}{mib(measured):>10}{mib(peak):>12}"
              f"{mib(figures.get('peak')):>10}{mib(figures.get('first_peak')):>13}{mib(figures.get('reserved')):>10}"
              f"{ratio:>7}{peak_ratio:>12}", flush=True)  # fmt: skip
    if ratios:
        outside = [f"{r:.2f}" for r in ratios if abs(r - 1) > 0.15]
        print(f"rows within 15%: {len(ratios) - len(outside)} of {len(ratios)}"
              + (f"; outside: {outside}" if outside else ""))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="run the first N rows")
    parser.add_argument("--only", type=int, nargs="*", help="run these rows (1-based) only")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the real-size rows on one GPU, from published configs with random weights")  # fmt: skip
    parser.add_argument(
        "--plan_only", action="store_true", help="print the predictions only, without training"
    )
    parser.add_argument("--model", metavar="PATH_OR_PUBLISHED_NAME",
                        help="--device cuda: every row on this model instead (a folder holding its config.json, or "
                             "a published name the planner knows); random weights either way")  # fmt: skip
    opts = parser.parse_args()
    grid = CUDA_ROWS if opts.device == "cuda" else ROWS
    opts.rows = len(grid) if opts.rows is None else opts.rows
    if opts.only and not all(1 <= i <= len(grid) for i in opts.only):
        parser.error(f"--only takes rows 1 to {len(grid)}")
    if opts.model and opts.device != "cuda":
        parser.error("--model goes with --device cuda")
    sys.path.insert(0, str(Path(__file__).parent))
    if opts.device == "cuda":
        import torch

        if not opts.plan_only and not torch.cuda.is_available():
            parser.error("--device cuda but CUDA is not available (--plan_only prints the predictions)")
        with tempfile.TemporaryDirectory() as work:
            run_cuda(opts, Path(work), mp.get_context("spawn"))
        return
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
            predicted, peak, prompt, _ = predict(row, model_dir, out)
            measured = None
            if not opts.plan_only:
                measured, lengths = in_fresh_process(ctx, measure, (row, model_dir, out))
                if lengths != [float(row[5])]:
                    print(f"WARNING: completion lengths {lengths}, not {row[5]}")
                ratios.append(predicted / measured)
            params = built[size].split("M")[0]
            print(f"{size:<8}{params + 'M':>9}{'yes' if row[1] else 'no':>6}{row[2]:>6}{'on' if row[3] else 'off':>6}"
                  f"{row[4]:>3}{row[5]:>5}{prompt:>8}{peak / 2**20:>10.0f}{predicted / 2**20:>24.0f}{mib(measured):>14}"
                  f"{f'{predicted / measured:.2f}' if measured else '-':>7}", flush=True)  # fmt: skip
    if ratios:
        outside = [f"{r:.2f}" for r in ratios if abs(r - 1) > 0.15]
        print(
            f"rows within 15%: {len(ratios) - len(outside)} of {len(ratios)}"
            + (f"; outside: {outside}" if outside else "")
        )


if __name__ == "__main__":
    main()
