"""Step time of asynchronous rollouts against synchronous ones, both generating on one vLLM server.

    .venv-vllm/bin/python benchmarks/bench_async.py --steps 6 --warmup 2

(`--smoke` checks the script with a tiny model and 2 steps.) One randomly initialised Qwen2-VL (the `small` scale of
`bench_grpo.py`: its recipe shape, LoRA on the language model, gradient checkpointing, beta 0.04, one 448x448 image,
G=8, 128-token completions forced with `min_tokens`) is served by `trl vllm-serve` pinned to the last CPU core
(`vlm_grpo.rollout.vllm.local_server.LocalServer`: `taskset`, its engine's threads bound there with
`VLLM_CPU_OMP_THREADS_BIND`), and trained by `VLMGRPOTrainer` in
`vllm_mode: server` pinned to the other cores, first synchronously, then with `async_rollouts: true`
(`max_staleness: 1`), each in a fresh process, with the same data, seed and config. A step is timed from
`on_step_begin` to `on_step_end`; the warm-up steps are left out and the median of the others is printed per run,
with `async/trainer_wait_s` and `async/generator_idle_s` summed over them. The last line is
`ratio async_rollouts: X` (synchronous / asynchronous median step time: above 1, the asynchronous run is faster).
On a CPU the weights go to the server over gloo (`vlm_grpo.rollout.vllm.cpu_transfer`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(work: Path, smoke: bool) -> tuple[Path, Path]:
    """The model folder and the dataset (saved to disk) of the recipe shape."""
    sys.path.insert(0, str(HERE))
    from bench_grpo import SCALES, SHAPES, build_dataset, build_model

    dims = SCALES["smoke" if smoke else "small"]
    side = 56 if smoke else dims["long_side"]
    model = work / "model"
    build_model(model, dims, side, seed=0)  # returns its size, for the report
    dataset = build_dataset(SHAPES["recipe"], side, n=16, seed=0)
    dataset.save_to_disk(work / "data")
    return model, work / "data"


def train(model: Path, data: Path, port: int, asynchronous: bool, opts, out: Path) -> dict:
    """Runs in its own process (`--train`): one run, its step times and async metrics written to `out`."""
    import torch
    from datasets import load_from_disk
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback

    sys.path.insert(0, str(HERE))
    from bench_grpo import SHAPES, language_lora, length_reward

    from vlm_grpo import VLMGRPOConfig, VLMGRPOTrainer
    from vlm_grpo.rollout.vllm.local_server import free_port

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    shape = SHAPES["recipe"]
    length = 8 if opts.smoke else shape["length"]
    args = VLMGRPOConfig(
        output_dir=str(out.parent / f"run_{'async' if asynchronous else 'sync'}"), per_device_train_batch_size=8,
        num_generations=8, gradient_accumulation_steps=1, max_completion_length=length, beta=0.04,
        gradient_checkpointing=True, learning_rate=1e-5, max_steps=opts.warmup + opts.steps, logging_steps=1,
        report_to="none", save_strategy="no", seed=0, use_cpu=True, bf16=False, disable_tqdm=True,
        log_samples_steps=0, use_vllm=True, vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{port}",
        vllm_group_port=free_port(), generation_kwargs={"min_tokens": length}, async_rollouts=asynchronous,
    )  # fmt: skip

    class Steps(TrainerCallback):
        def __init__(self):
            self.seconds, self._start = [], 0.0

        def on_step_begin(self, *a, **k):
            self._start = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.seconds.append(time.perf_counter() - self._start)

    steps = Steps()
    trainer = VLMGRPOTrainer(
        str(model), length_reward, args=args, train_dataset=load_from_disk(str(data)),
        peft_config=language_lora(str(model)), callbacks=[steps],
    )  # fmt: skip
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e][opts.warmup :]
    result = {
        "steps": steps.seconds[opts.warmup :],
        "trainer_wait_s": sum(e.get("async/trainer_wait_s", 0.0) for e in logs),
        "generator_idle_s": sum(e.get("async/generator_idle_s", 0.0) for e in logs),
        "staleness_max": max((e.get("async/staleness_max", 0.0) for e in logs), default=0.0),
    }
    out.write_text(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, to check the script")
    parser.add_argument(
        "--train", nargs=5, metavar=("MODEL", "DATA", "PORT", "ASYNC", "OUT"), help=argparse.SUPPRESS
    )
    opts = parser.parse_args()
    if opts.train:
        model, data, port, asynchronous, out = opts.train
        train(Path(model), Path(data), int(port), asynchronous == "1", opts, Path(out))
        return
    from vlm_grpo.rollout.vllm.local_server import LocalServer

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = build(work, opts.smoke)
        results = {}
        with LocalServer(model, work / "server.log") as server:  # the last core; this process on the others
            server_core, trainer_cores = server.server_core, ",".join(str(c) for c in server.trainer_cores)
            for asynchronous in (False, True):
                out = work / f"result_{int(asynchronous)}.json"
                command = ["taskset", "-c", trainer_cores, sys.executable, __file__, "--steps", str(opts.steps),
                           "--warmup", str(opts.warmup), *(["--smoke"] if opts.smoke else []),
                           "--train", str(model), str(data), str(server.port), str(int(asynchronous)), str(out)]  # fmt: skip
                env = {**os.environ, "OMP_NUM_THREADS": str(len(server.trainer_cores))}
                subprocess.run(command, env=env, check=True)
                results[asynchronous] = json.loads(out.read_text())
    print(
        f"server on core {server_core}, trainer on {trainer_cores}; {opts.steps} timed steps after {opts.warmup}"
    )
    for asynchronous, result in results.items():
        name = "async_rollouts" if asynchronous else "synchronous"
        print(
            f"{name:15s} median step {statistics.median(result['steps']):.2f} s  trainer waited "
            f"{result['trainer_wait_s']:.1f} s  generator idle {result['generator_idle_s']:.1f} s  staleness max "
            f"{result['staleness_max']:.0f}"
        )
    ratio = statistics.median(results[False]["steps"]) / statistics.median(results[True]["steps"])
    print(f"ratio async_rollouts: {ratio:.2f}")


if __name__ == "__main__":
    main()
