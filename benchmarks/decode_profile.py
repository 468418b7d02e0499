"""Where a decoding step of our shared-prefix generation goes: model forward, cache update, logits processing,
sampling, and the rest (Python and dispatch in `generate`'s loop and in our code).

    .venv/bin/python benchmarks/decode_profile.py --shape recipe --repeats 2
    .venv/bin/python benchmarks/decode_profile.py --shape recipe --model Qwen/Qwen2.5-VL-3B-Instruct \
        --random_weights --tokens 16 --repeats 2

One `VLMGRPOTrainer` is built as `bench_grpo.py` builds it for the shape (the same model, data, LoRA and settings;
`--model` and `--random_weights` as there), and its generation (`_sample_with_transformers`, each group's prompt
prefilled once) runs on one group of G rows: once to warm up, then `--repeats` times under timers. The timers wrap,
in this process only, the functions each part runs in:

- prefill: our prefix cache (`shared_prefix._prefix_cache`: vision and one prompt pass per group) and `generate`'s
  first forward (the group's rows from the shared cache);
- forward: every later call of the model's forward (one per decoded token), everything inside it included;
- cache update: inside it, the key/value cache's `update` of every layer (`transformers.cache_utils`);
- logits processing: `LogitsProcessorList.__call__` (temperature, top-p/k, suppressed placeholder tokens, ...);
- sampling: `torch.multinomial`;
- inputs and bookkeeping: `prepare_inputs_for_generation` (positions, M-RoPE deltas) and
  `_update_model_kwargs_for_generation`, and the stopping criteria;
- other: the rest of `generate` and of our call (loop overhead, eos tracking, dispatch).

Each part is printed in ms per decoding step (the median over the repeats) and as a share of the decode time. With a
CUDA device every timer synchronises, which adds its own small cost.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
import transformers.cache_utils as cache_utils
from bench_grpo import (
    RECIPE,
    SCALES,
    SHAPES,
    build_dataset,
    build_model,
    generation_settings,
    language_lora,
    make_trainer,
    prepare_model,
    quiet,
    random_model,
    side_of,
)
from transformers import GenerationMixin, LogitsProcessorList, StoppingCriteriaList

import vlm_grpo.policy.shared_prefix as shared_prefix
from vlm_grpo.data.rows import load_rows
from vlm_grpo.policy.adapters import base_model

PARTS = ("prefill", "forward", "cache update", "logits processing", "sampling", "inputs and bookkeeping")


class Timers:
    """Seconds spent in each part (the outermost call of a part only), and the number of decoding forwards."""

    def __init__(self, cuda: bool):
        self.cuda, self.seconds, self.decode_steps = cuda, defaultdict(float), 0
        self.depth: dict[str, int] = defaultdict(int)
        self.forwards: list[bool] = []  # the running forwards, outermost first: whether each decodes

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def wrap(self, part: str, function: Callable, decoding_only: bool = False) -> Callable:
        """`function`, timed as `part` where no call of `part` is already running (and with `decoding_only`, inside a
        decoding forward only)."""

        def timed(*args, **kwargs):
            if self.depth[part] or (decoding_only and not (self.forwards and self.forwards[-1])):
                return function(*args, **kwargs)
            self.depth[part] += 1
            self.sync()
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[part] += time.perf_counter() - start
                self.depth[part] -= 1

        return timed

    def time_forwards(self, model: torch.nn.Module) -> list:
        """Hooks on `model` that time each forward outside the prefix cache: one token per row is a decoding step
        ("forward"), more is a prefill ("prefill"). Returns the hook handles."""
        started: list[float] = []

        def before(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.forwards.append(not self.depth["prefill"] and ids is not None and ids.size(1) == 1)
            self.sync()
            started.append(time.perf_counter())

        def after(module, args, kwargs, output):
            self.sync()
            seconds = time.perf_counter() - started.pop()
            decoding = self.forwards.pop()
            if self.depth["prefill"]:  # inside `_prefix_cache`, timed there
                return
            self.seconds["forward" if decoding else "prefill"] += seconds
            self.decode_steps += decoding

        return [
            model.register_forward_pre_hook(before, with_kwargs=True),
            model.register_forward_hook(after, with_kwargs=True),
        ]


def subclasses(cls: type) -> list[type]:
    """`cls` and every class derived from it (loaded so far)."""
    found = [cls]
    for sub in cls.__subclasses__():
        found += subclasses(sub)
    return found


@contextmanager
def patched(owner, name: str, replacement) -> Iterator[None]:
    """`owner.name` replaced by `replacement` (the attribute as `owner` itself defines it) for the block."""
    original = vars(owner)[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def timed_generation(trainer, encoded, timers: Timers) -> float:
    """One generation under the timers; returns its wall time (s)."""
    base = base_model(trainer.accelerator, trainer.model)
    updates = {*subclasses(cache_utils.CacheLayerMixin), *subclasses(cache_utils.Cache)}
    with ExitStack() as stack:
        for handle in timers.time_forwards(base):
            stack.callback(handle.remove)
        for cls in updates:
            if "update" in vars(cls):
                stack.enter_context(
                    patched(
                        cls, "update", timers.wrap("cache update", vars(cls)["update"], decoding_only=True)
                    )
                )
        for owner, name, part in (
            (LogitsProcessorList, "__call__", "logits processing"),
            (StoppingCriteriaList, "__call__", "inputs and bookkeeping"),
            (torch, "multinomial", "sampling"),
            (shared_prefix, "_prefix_cache", "prefill"),
        ):
            stack.enter_context(patched(owner, name, timers.wrap(part, vars(owner)[name])))
        for owner in {type(base), GenerationMixin}:
            for name in ("prepare_inputs_for_generation", "_update_model_kwargs_for_generation"):
                if name in vars(owner):
                    wrapped = timers.wrap("inputs and bookkeeping", vars(owner)[name])
                    stack.enter_context(patched(owner, name, wrapped))
        timers.sync()
        start = time.perf_counter()
        trainer.rollout.transformers.sample(encoded, shared=trainer.family.indexable_cache)
        timers.sync()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=list(SHAPES), default="recipe")
    parser.add_argument("--repeats", type=int, default=2, help="timed generations (after one warm-up)")
    parser.add_argument("--tokens", type=int, default=None, help="completion tokens (default: the shape's)")
    parser.add_argument("--image_side", type=int, default=None, help="as in bench_grpo.py")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    parser.add_argument("--scale", choices=["small", "large"], default="small")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, to check the script quickly")
    parser.add_argument("--bf16", action="store_true", help="the model in bf16")
    parser.add_argument("--model", metavar="PATH_OR_PUBLISHED_NAME", help="as in bench_grpo.py")
    parser.add_argument("--random_weights", action="store_true", help="as in bench_grpo.py")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--operators",
        action="store_true",
        help="then print the top operators of one more generation (torch.profiler)",
    )
    opts = parser.parse_args()
    if opts.repeats < 1:
        parser.error("--repeats must be >= 1")
    if opts.random_weights and not opts.model:
        parser.error("--random_weights needs --model")
    cuda = opts.device == "cuda" or (opts.device is None and torch.cuda.is_available())
    quiet()
    opts.generation, opts.share, opts.fast_generation = "transformers", "default", "default"
    dims = SCALES["smoke" if opts.smoke else opts.scale]
    spec = dict(SHAPES[opts.shape])
    spec["length"] = opts.tokens or spec["length"]
    side = side_of(spec, opts, dims)
    with tempfile.TemporaryDirectory(prefix="decode_profile_") as work:
        if opts.model:
            model_dir, desc = prepare_model(opts.model, opts.random_weights, Path(work))
        else:
            model_dir = str(Path(work) / "model")
            desc = build_model(Path(model_dir), dims, side, opts.seed)
        model = model_dir
        if opts.random_weights:
            dtype = torch.bfloat16 if opts.bf16 else torch.float32
            model = random_model(model_dir, dtype, "cuda" if cuda else "cpu", opts.seed)
        G = spec["G"]
        common = dict(
            output_dir=str(Path(work) / "out"), per_device_train_batch_size=G, num_generations=G,
            max_completion_length=spec["length"], beta=0.0, gradient_checkpointing=False, max_steps=1,
            report_to="none", save_strategy="no", seed=opts.seed, use_cpu=not cuda, bf16=opts.bf16,
            disable_tqdm=True,
        )  # fmt: skip
        common.update(RECIPE if spec["recipe"] else {})
        common.update(generation_settings("ours", opts, spec["length"], model_dir))
        if opts.model and not opts.random_weights:
            common["model_init_kwargs"] = {"dtype": "bfloat16" if opts.bf16 else "float32"}
        lora = language_lora(model_dir) if spec["recipe"] else None
        dataset = build_dataset(spec, side, n=G, seed=opts.seed)
        trainer = make_trainer("ours", model, dataset, common, opts, lora)
        rows = load_rows([dataset[0]] * G)
        encoded = trainer.rollout.encode_prompts(rows)
        trainer.model.train()  # as in a training step
        timed_generation(trainer, encoded, Timers(cuda))  # warm-up
        runs = []
        for _ in range(opts.repeats):
            timers = Timers(cuda)
            total = timed_generation(trainer, encoded, timers)
            runs.append((total, timers))
        if opts.operators:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=activities) as prof:
                trainer.rollout.transformers.sample(encoded, shared=trainer.family.indexable_cache)
            key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            operators = prof.key_averages().table(sort_by=key, row_limit=15)
    device = f"cuda {torch.cuda.get_device_name()}" if cuda else f"cpu, {torch.get_num_threads()} threads"
    setup = "LoRA on the language model" if spec["recipe"] else "full model"
    print(f"device: {device}; model: {desc}; shape {spec['name']}: G={G}, {spec['length']} tokens, "
          f"{spec['images']} x {side}x{side} image, {setup}, {'bf16' if opts.bf16 else 'fp32'}; "
          f"{opts.repeats} timed generations after one warm-up (medians)")  # fmt: skip
    steps = statistics.median(t.decode_steps for _, t in runs)
    total = statistics.median(total for total, _ in runs)
    prefill = statistics.median(t.seconds["prefill"] for _, t in runs)
    decode = total - prefill
    print(f"generation {total:.3f} s: prefill {prefill:.3f} s, decode {decode:.3f} s over {steps:.0f} steps "
          f"({1000 * decode / steps:.2f} ms per step)")  # fmt: skip
    print(f"{'part':<32}{'ms/step':>10}{'share of decode':>17}")
    # the forward's time includes the cache updates: shown apart, subtracted from it
    forward = statistics.median(t.seconds["forward"] - t.seconds["cache update"] for _, t in runs)
    parts = {"model forward (no cache update)": forward}
    for part in PARTS[2:]:
        parts[part] = statistics.median(t.seconds[part] for _, t in runs)
    parts["other (loop, eos, dispatch)"] = decode - sum(parts.values())
    for part, seconds in parts.items():
        print(f"{part:<32}{1000 * seconds / steps:>10.2f}{100 * seconds / decode:>16.1f}%")
    if opts.operators:
        print(f"\noperators of one more generation (prefill included), by self time:\n{operators}")


if __name__ == "__main__":
    main()
