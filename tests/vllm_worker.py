"""One family's real vLLM checks, run by `test_vllm.py` in a fresh process: `python vllm_worker.py SHAPE OUT [MODE]`.

MODE is empty, `lora` (train a LoRA adapter) or `dist` (run under `torchrun`, each process with its own engine, on the
model the test built in `OUT/model`; each process writes `OUT/result{RANK}.json`).

One process builds one vLLM engine (TRL's colocate mode, inside the trainer's process) and runs every check on it;
a fresh process per family keeps the engines and their process groups apart. Writes `OUT/result.json`:

- `prompts`: for each row of a mixed batch (two images, one image, no image), whether the prompt ids vLLM expanded
  from the payload equal the processor-expanded ids the trainer trains on.
- `log_history`: the trainer's logs of 2 colocate steps (the importance-sampling correction on, TRL's default).
- `before_sync` / `after_sync`: the largest gap between vLLM's and the trainer's log-prob of each token of one
  completion, scored by vLLM before and after `sync_vllm_weights()` (the trainer is one step ahead of vLLM before).
- `base_gap` (with `lora`, which trains a LoRA adapter): the gap between vLLM after the sync and the base model with
  the adapter disabled; TRL merges the adapter into the weights it syncs, so `after_sync` is small and this is not.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def trainer_logps(trainer, encoded, completion: list[int]) -> list[float]:
    """The trainer model's log-prob of each token of `completion` after the processor-expanded prompt."""
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    ids = torch.tensor([encoded.input_ids + completion])
    inputs = trainer.family.model_inputs(model.config, ids, torch.ones_like(ids), [encoded.image_inputs])
    with torch.no_grad():
        logits = model(**inputs).logits[0, -len(completion) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def vllm_logps(llm, payload_input: dict, completion: list[int]) -> list[float]:
    """vLLM's log-prob of each token of `completion` after the payload's prompt (its prompt log-probs)."""
    import vllm

    item = {**payload_input, "prompt_token_ids": payload_input["prompt_token_ids"] + completion}
    params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    (output,) = llm.generate([item], sampling_params=params, use_tqdm=False)
    scored = output.prompt_logprobs[-len(completion) :]
    return [entry[token].logprob for entry, token in zip(scored, completion, strict=True)]


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def main(shape: str, out: Path, mode: str) -> None:
    import vllm_cpu_shim

    vllm_cpu_shim.install()
    import vllm
    from conftest import color_rows, grpo_args, length_reward
    from datasets import Dataset
    from peft import LoraConfig
    from trl.data_utils import prepare_multimodal_messages

    from vlm_grpo import VLMGRPOTrainer
    from vlm_grpo.errors import VLMGRPOError
    from vlm_grpo.rollout import load_rows
    from vlm_grpo.testing import build_tiny_model
    from vlm_grpo.train import finish_processes
    from vlm_grpo.vllm_payload import build_vllm_payload, vllm_prompt_inputs

    lora, dist = mode == "lora", mode == "dist"
    result_file = out / (f"result{os.environ['RANK']}.json" if dist else "result.json")  # torchrun's RANK
    # under torchrun every process reads the model the test built; otherwise the worker builds it
    path = str(out / "model") if dist else build_tiny_model(shape, out / "model", hidden_size=256)
    rows = color_rows(2, images_per_prompt=2) + color_rows(2, text_only_every=2)  # 2 images, 2, 1, none
    # LoRA with a random (not zero) B, so that the adapter changes the model from the first step on
    peft_config = LoraConfig(r=8, lora_alpha=16, init_lora_weights=False) if lora else None
    args = grpo_args(
        out / "run",
        max_steps=2,
        per_device_train_batch_size=2 if dist else 4,  # 2 processes x 2 rows: the same 4 rows per step
        num_generations=2,
        max_completion_length=4,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=512,
        vllm_gpu_memory_utilization=0.2,
    )
    try:
        trainer = VLMGRPOTrainer(
            path, length_reward, args=args, train_dataset=Dataset.from_list(rows), peft_config=peft_config
        )
    except VLMGRPOError as error:  # vLLM does not implement this family: the one-line refusal is the result
        result_file.write_text(json.dumps({"error": str(error)}))
        return
    trainer.train()
    llm = trainer.vllm_generation.llm
    family, processor = trainer.family, trainer.processing_class
    loaded = load_rows(rows)
    payload = build_vllm_payload(processor, family, loaded)
    inputs = vllm_prompt_inputs(payload)
    encoded = [
        family.encode_prompt(
            processor, prepare_multimodal_messages(r["prompt"], images=r["images"]), r["images"]
        )
        for r in loaded
    ]
    params = vllm.SamplingParams(max_tokens=4, temperature=1.0, logprobs=0, seed=0)
    outputs = llm.generate(inputs, sampling_params=params, use_tqdm=False)
    result = {
        "family": family.model_type,
        "prompts": [list(o.prompt_token_ids) == e.input_ids for o, e in zip(outputs, encoded, strict=True)],
        "completion_lengths": [len(o.outputs[0].token_ids) for o in outputs],
        "log_history": trainer.state.log_history,
    }
    completion = list(outputs[0].outputs[0].token_ids)
    ours = trainer_logps(trainer, encoded[0], completion)
    result["before_sync"] = gap(vllm_logps(llm, inputs[0], completion), ours)
    trainer.sync_vllm_weights()
    synced = vllm_logps(llm, inputs[0], completion)
    result["after_sync"] = gap(synced, ours)
    if lora:
        with trainer.accelerator.unwrap_model(trainer.model).disable_adapter():
            result["base_gap"] = gap(synced, trainer_logps(trainer, encoded[0], completion))
    result_file.write_text(json.dumps(result))
    finish_processes(trainer.release_process_groups)  # as `vlm-grpo train` ends


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
