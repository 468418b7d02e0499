"""What transformers' own fast-decoding options give a group's generation: the KV cache preallocated (`static`) and
the decoding forward compiled (`torch.compile`), against the growing cache (`dynamic`) that `generate` uses by default.

    .venv/bin/python benchmarks/decode_cache.py --shape recipe --repeats 2
    .venv/bin/python benchmarks/decode_cache.py --shape recipe --kinds dynamic,static --tokens 32
    .venv/bin/python benchmarks/decode_cache.py --shape recipe --kinds dynamic,compiled,autotuned,cpp_wrapper

One `VLMGRPOTrainer` is built as `bench_grpo.py` builds it for the shape (the same model, data, LoRA and settings),
and the model it trains (LoRA adapters included) runs `generate` on one group of G rows of the shape's first prompt,
full rows (the image and prompt in every row), once per kind (`--kinds`; default: the first three) to warm up (and
compile), then `--repeats` times:

- dynamic: `cache_implementation="dynamic"`, no compilation (what `generate` does today);
- static: `cache_implementation="static"` (a cache of prompt + completion length, allocated once), no compilation;
- compiled: the static cache and transformers' own compiled decoding forward (`CompileConfig`, inductor, also on
  the CPU; compiled on the warm-up call);
- autotuned: as compiled, with inductor's `max-autotune-no-cudagraphs` mode (its own matrix-product kernels tried
  against the library's);
- cpp_wrapper: as compiled, with inductor's C++ wrapper (no Python between the compiled kernels).

Each generation samples the shape's token count (`min_new_tokens`, no eos stop) from the same seed. Printed per kind:
the warm-up call's seconds (compilation included), the median decode ms per token over the repeats, and whether its
tokens equal the dynamic cache's (the same draws: equal unless float rounding flips a sample).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_grpo import (
    RECIPE,
    SCALES,
    SHAPES,
    build_dataset,
    build_model,
    generation_settings,
    language_lora,
    make_trainer,
    quiet,
    side_of,
)
from transformers import CompileConfig

from vlm_grpo.data.rows import load_rows

KINDS = ("dynamic", "static", "compiled", "autotuned", "cpp_wrapper")


def generation_kwargs(kind: str, tokens: int) -> dict:
    """`generate` arguments of one cache kind: sampling exactly `tokens` tokens, transformers' defaults otherwise."""
    kwargs = dict(
        max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0
    )
    if kind == "dynamic":
        return {**kwargs, "cache_implementation": "dynamic"}
    if kind == "static":
        return {**kwargs, "cache_implementation": "static", "disable_compile": True}
    if kind == "autotuned":
        compile_config = CompileConfig(fullgraph=False, dynamic=False, mode="max-autotune-no-cudagraphs")
    elif kind == "cpp_wrapper":
        compile_config = CompileConfig(
            fullgraph=False, dynamic=False, mode=None, options={"cpp_wrapper": True}
        )
    else:
        compile_config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told
    return {**kwargs, "cache_implementation": "static", "compile_config": compile_config}


def timed_generate(model, inputs: dict, kwargs: dict, seed: int, cuda: bool) -> tuple[float, torch.Tensor]:
    """Seconds of one `generate` call from `seed`, and its new tokens `[G, T]`."""
    torch.manual_seed(seed)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**inputs, **kwargs)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out[:, inputs["input_ids"].size(1) :]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=list(SHAPES), default="recipe")
    parser.add_argument(
        "--kinds", default="dynamic,static,compiled", help=f"comma-separated, of {', '.join(KINDS)}"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed generations per kind (after one warm-up)"
    )
    parser.add_argument("--tokens", type=int, default=None, help="completion tokens (default: the shape's)")
    parser.add_argument("--image_side", type=int, default=None, help="as in bench_grpo.py")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    parser.add_argument("--scale", choices=["small", "large"], default="small")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, to check the script quickly")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    kinds = opts.kinds.split(",")
    if opts.repeats < 1 or not set(kinds) <= set(KINDS) or "dynamic" not in kinds:
        parser.error(f"--repeats must be >= 1 and --kinds a list of {', '.join(KINDS)} holding dynamic")
    cuda = opts.device == "cuda" or (opts.device is None and torch.cuda.is_available())
    quiet()
    opts.generation, opts.share, opts.fast_generation = "transformers", "default", "default"
    dims = SCALES["smoke" if opts.smoke else opts.scale]
    spec = dict(SHAPES[opts.shape])
    tokens = opts.tokens or spec["length"]
    side = side_of(spec, opts, dims)
    G = spec["G"]
    with tempfile.TemporaryDirectory(prefix="decode_cache_") as work:
        model_dir = str(Path(work) / "model")
        desc = build_model(Path(model_dir), dims, side, opts.seed)
        common = dict(
            output_dir=str(Path(work) / "out"), per_device_train_batch_size=G, num_generations=G,
            max_completion_length=tokens, beta=0.0, gradient_checkpointing=False, max_steps=1, report_to="none",
            save_strategy="no", seed=opts.seed, use_cpu=not cuda, disable_tqdm=True,
        )  # fmt: skip
        common.update(RECIPE if spec["recipe"] else {})
        common.update(generation_settings("ours", opts, tokens, model_dir))
        lora = language_lora(model_dir) if spec["recipe"] else None
        dataset = build_dataset(spec, side, n=G, seed=opts.seed)
        trainer = make_trainer("ours", model_dir, dataset, common, opts, lora)
        family, model = trainer.family, trainer.model
        encoded = trainer.rollout.encode_prompts(load_rows([dataset[0]] * G))
        device = "cuda" if cuda else "cpu"
        ids = torch.tensor([e.input_ids for e in encoded], device=device)  # [G, P]: one prompt, no padding
        inputs = family.model_inputs(
            model.config, ids, torch.ones_like(ids), [e.image_inputs for e in encoded]
        )
        model.eval()
        results = {}
        for kind in kinds:
            kwargs = generation_kwargs(kind, tokens)
            first, _ = timed_generate(model, inputs, kwargs, opts.seed, cuda)
            runs = [timed_generate(model, inputs, kwargs, opts.seed, cuda) for _ in range(opts.repeats)]
            results[kind] = (first, statistics.median(s for s, _ in runs), runs[0][1])
    where = f"cuda {torch.cuda.get_device_name()}" if cuda else f"cpu, {torch.get_num_threads()} threads"
    print(f"device: {where}; model: {desc}; shape {spec['name']}: G={G}, prompt {ids.size(1)} tokens, {tokens} "
          f"tokens sampled, {'LoRA on the language model' if lora else 'full model'}, fp32; {opts.repeats} timed "
          "generations per kind after one warm-up (medians)")  # fmt: skip
    reference = results["dynamic"][2]
    print(f"{'kind':<10}{'warm-up s':>11}{'generate s':>12}{'ms/token':>10}{'vs dynamic':>12}  tokens")
    for kind, (first, median, new) in results.items():
        same = "equal" if torch.equal(new, reference) else f"{(new != reference).float().mean():.0%} differ"
        speedup = results["dynamic"][1] / median
        print(
            f"{kind:<10}{first:>11.2f}{median:>12.3f}{1000 * median / tokens:>10.2f}{speedup:>11.2f}x  {same}"
        )


if __name__ == "__main__":
    main()
