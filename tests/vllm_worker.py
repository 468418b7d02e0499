"""One family's real vLLM checks, run by `test_vllm.py` in a fresh process: `python vllm_worker.py SHAPE OUT [MODE]`.

MODE is empty, `video` (a batch with video prompts, see `video_main`), `lora` (train a LoRA adapter), `dist` (run under
`torchrun`, each process with its own engine, on the model the test built in `OUT/model`; each process writes
`OUT/result{RANK}.json`), `server PORT` (TRL's server mode, generating through the `trl vllm-serve` the test started on
127.0.0.1:PORT with the model in `OUT/model`; see `server_checks`) or `server-async PORT` (the same with
`async_rollouts`, dynamic sampling and a LoRA adapter, 4 steps; `result.json` also holds the run's row `counts`).

One process builds one vLLM engine (TRL's colocate mode, inside the trainer's process) and runs every check on it;
a fresh process per family keeps the engines and their process groups apart. Writes `OUT/result.json`:

- `prompts`: for each row of a mixed batch (two images, one image, no image), whether the prompt ids vLLM expanded
  from the payload equal the processor-expanded ids the trainer trains on.
- `log_history`: the trainer's logs of 2 colocate steps (the importance-sampling correction on, TRL's default).
- `before_sync` / `after_sync`: the largest gap between vLLM's and the trainer's log-prob of each token of one
  completion, scored by vLLM before and after `VLLMSampler.push()` (the trainer is one step ahead of vLLM before);
  `tokens`: the three log-probs of each token. On vLLM's CPU backend the trainer's log-probs attend causally over
  image tokens as vLLM's CPU attention does (`causal_images`); `model_mask_gap` is the gap after the sync to the
  trainer's own mask (larger for the families that attend bidirectionally among an image's tokens).
- `base_gap` (with `lora`, which trains a LoRA adapter): the gap between vLLM after the sync and the base model with
  the adapter disabled; TRL merges the adapter into the weights it syncs, so `after_sync` is small and this is not.

With `server`, the engine runs in the server's processes and `result.json` holds `log_history`; `before_sync`,
`after_sync` and `after_encoder_reset` (scored by the server, see `server_checks`) and `stale_image_features` (the gap
between the last two); what the server counted while the trainer trained: `server_requests` (finished requests) and
`server_generation_tokens`; and `local_engine`, whether the trainer built an engine itself.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

from dist_helpers import free_port

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def trainer_logps(trainer, encoded, completion: list[int], causal_images: bool = False) -> list[float]:
    """The trainer model's log-prob of each token of `completion` after the processor-expanded prompt (with
    `causal_images`, attending causally over image tokens as vLLM's CPU attention does)."""
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    ids = torch.tensor([encoded.input_ids + completion])
    inputs = trainer.family.model_inputs(
        model.config, ids, torch.ones_like(ids), [encoded.image_inputs], causal_images=causal_images
    )
    with torch.no_grad():
        logits = model(**inputs).logits[0, -len(completion) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def vllm_attends_images_causally() -> bool:
    """Whether vLLM attends causally over image tokens whatever the model's mask: its CPU attention has no
    multimodal-prefix mask (see `vlm_grpo.rollout.vllm.payload.warn_vllm_cpu_image_mask`)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


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


def server_request(client, prompt_ids: list[int], features: dict | None, **sampling) -> dict:
    """One request to the server's token-in endpoint (`/inference/v1/generate`, as TRL's client sends it)."""
    body = {
        "request_id": f"check-{uuid.uuid4().hex}",
        "model": client.model,
        "token_ids": prompt_ids,
        "features": features,
        "sampling_params": {"temperature": 1.0, "output_kind": 2, **sampling},  # 2: FINAL_ONLY, as TRL
    }
    return client._post(f"{client.base_url}/inference/v1/generate", json=body)


def server_logps(client, prompt_ids: list[int], features: dict | None, completion: list[int]) -> list[float]:
    """The server's log-prob of each token of `completion` after the prompt (its prompt log-probs)."""
    response = server_request(client, prompt_ids + completion, features, max_tokens=1, prompt_logprobs=0)
    scored = response["prompt_logprobs"][-len(completion) :]
    return [entry[str(token)]["logprob"] for entry, token in zip(scored, completion, strict=True)]


def server_counts(client) -> dict[str, float]:
    """The server's counters of finished requests and generated tokens (its Prometheus `/metrics`)."""
    text = client.session.get(f"{client.base_url}/metrics").text
    counts = {"requests": 0.0, "generation_tokens": 0.0}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name == "vllm:request_success_total":
            counts["requests"] += float(line.rsplit(" ", 1)[1])
        elif name == "vllm:generation_tokens_total":
            counts["generation_tokens"] += float(line.rsplit(" ", 1)[1])
    return counts


def server_checks(
    trainer, rows: list[dict], encoded: list, before: dict[str, float], lora: bool = False
) -> dict:
    """Server mode: what the server generated while training, and its log-probs before and after a weight sync.

    One completion of a two-image prompt is sampled by the server (the trainer's sampling settings, seeded) and scored
    by it before and after `VLLMSampler.push()`, the prompt's images as TRL sends them (features the server computed
    from the raw images, placed on the processor-expanded prompt ids). After the sync it is scored twice: as the
    trainer leaves the server, then once more after emptying the server's encoder cache (`/reset_encoder_cache`), which
    makes the server encode the images again with the synced vision tower.
    """
    generation = trainer.vllm_generation
    client = generation.vllm_client
    after = server_counts(client)
    ids = list(encoded[0].input_ids)
    (features,) = client.image_features([rows[0]["images"]])
    features = generation._place_features(features, ids)
    settings = {**generation.generation_kwargs, "seed": 0}
    (completion,) = client.generate([ids], features=[features], max_tokens=4, generation_kwargs=settings)[
        "completion_ids"
    ]
    ours = trainer_logps(trainer, encoded[0], completion, vllm_attends_images_causally())
    result = {
        "local_engine": hasattr(generation, "llm"),
        "server_requests": after["requests"] - before["requests"],
        "server_generation_tokens": after["generation_tokens"] - before["generation_tokens"],
        "before_sync": gap(server_logps(client, ids, features, completion), ours),
    }
    trainer.rollout.vllm.push()
    synced = server_logps(client, ids, features, completion)
    client.session.post(f"{client.base_url}/reset_encoder_cache").raise_for_status()
    encoded_again = server_logps(client, ids, features, completion)
    result["after_sync"] = gap(synced, ours)
    result["after_encoder_reset"] = gap(encoded_again, ours)
    result["stale_image_features"] = gap(encoded_again, synced)
    if lora:  # the server scores as the adapted model, not the base one
        with trainer.accelerator.unwrap_model(trainer.model).disable_adapter():
            base = trainer_logps(trainer, encoded[0], completion, vllm_attends_images_causally())
        result["base_gap"] = gap(encoded_again, base)
    return result


def video_main(shape: str, out: Path) -> None:
    """`video` mode: 2 colocate steps on a mixed batch (two video prompts, an image prompt, a text-only prompt), the
    trainer checking in every step that vLLM expanded each prompt into its own ids (`check_vllm_prompts`); then the
    expanded prompts of the payload and the log-probs of a video prompt's completion, before and after a sync."""
    import vllm
    from conftest import color_rows, grpo_args, length_reward
    from datasets import Dataset
    from test_video import video_rows
    from trl.data_utils import prepare_multimodal_messages

    from vlm_grpo import VLMGRPOTrainer
    from vlm_grpo.data.rows import load_rows
    from vlm_grpo.rollout.vllm.payload import build_vllm_payload, vllm_prompt_inputs
    from vlm_grpo.runtime.shutdown import exit_process, finish_processes
    from vlm_grpo.testing import build_tiny_model

    path = build_tiny_model(shape, out / "model", hidden_size=256)
    (out / "media").mkdir(parents=True, exist_ok=True)
    images = color_rows(2, text_only_every=2)  # one image prompt, one text-only prompt
    videos = video_rows(out / "media", 3)  # a video file, another, a list of frame files
    rows = [videos[0], videos[2]] + [r | {"videos": []} for r in images]
    args = grpo_args(
        out / "run", max_steps=2, per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
        use_vllm=True, vllm_mode="colocate", vllm_max_model_length=512, vllm_gpu_memory_utilization=0.2,
        shuffle_dataset=False,
    )  # fmt: skip
    trainer = VLMGRPOTrainer(path, length_reward, args=args, train_dataset=Dataset.from_list(rows))
    trainer.train()
    family, processor = trainer.family, trainer.processing_class
    loaded = load_rows(rows)
    inputs = vllm_prompt_inputs(build_vllm_payload(processor, family, loaded))
    encoded = [
        family.encode_prompt(
            processor,
            prepare_multimodal_messages(r["prompt"], images=r["images"]),
            r["images"],
            None,
            r["videos"],
        )
        for r in loaded
    ]
    llm = trainer.vllm_generation.llm
    params = vllm.SamplingParams(max_tokens=4, temperature=1.0, logprobs=0, seed=0)
    outputs = llm.generate(inputs, sampling_params=params, use_tqdm=False)
    completion = list(outputs[0].outputs[0].token_ids)
    ours = trainer_logps(trainer, encoded[0], completion, vllm_attends_images_causally())
    before = vllm_logps(llm, inputs[0], completion)
    trainer.rollout.vllm.push()
    result = {
        "family": family.model_type,
        "num_videos": [e.num_videos for e in encoded],
        "video_tokens": [  # a family may write a video's frames with its image token (GLM)
            sum(
                e.input_ids.count(t)
                for t in {family.image_token_id(processor), family.prompt_video_token(processor)[1]}
            )
            for e in encoded
        ],
        "prompts": [list(o.prompt_token_ids) == e.input_ids for o, e in zip(outputs, encoded, strict=True)],
        "log_history": trainer.state.log_history,
        "before_sync": gap(before, ours),
        "after_sync": gap(vllm_logps(llm, inputs[0], completion), ours),
    }
    (out / "result.json").write_text(json.dumps(result))
    if finish_processes(trainer.release_process_groups):
        exit_process(0)


def main(shape: str, out: Path, mode: str, port: int | None = None) -> None:
    if mode == "video":
        return video_main(shape, out)
    import vllm
    from conftest import color_rows, grpo_args, length_reward
    from datasets import Dataset
    from peft import LoraConfig
    from trl.data_utils import prepare_multimodal_messages

    from vlm_grpo import VLMGRPOTrainer
    from vlm_grpo.data.rows import load_rows
    from vlm_grpo.errors import VLMGRPOError
    from vlm_grpo.rollout.vllm.payload import build_vllm_payload, vllm_prompt_inputs
    from vlm_grpo.runtime.shutdown import exit_process, finish_processes
    from vlm_grpo.testing import build_tiny_model

    dist, server, asynchronous = mode == "dist", mode.startswith("server"), mode == "server-async"
    lora = mode in ("lora", "server-async")
    result_file = out / (f"result{os.environ['RANK']}.json" if dist else "result.json")  # torchrun's RANK
    # under torchrun, and for a server, the test built the model; otherwise the worker builds it
    path = str(out / "model") if dist or server else build_tiny_model(shape, out / "model", hidden_size=256)
    rows = color_rows(2, images_per_prompt=2) + color_rows(2, text_only_every=2)  # 2 images, 2, 1, none
    # LoRA with a random (not zero) B, so that the adapter changes the model from the first step on
    peft_config = LoraConfig(r=8, lora_alpha=16, init_lora_weights=False) if lora else None
    args = grpo_args(
        out / "run",
        max_steps=4 if asynchronous else 2,
        per_device_train_batch_size=2 if dist else 4,  # 2 processes x 2 rows: the same 4 rows per step
        num_generations=2,
        max_completion_length=4,
        use_vllm=True,
        vllm_mode="server" if server else "colocate",
        vllm_max_model_length=512,
        vllm_gpu_memory_utilization=0.2,
        async_rollouts=asynchronous,
        dynamic_sampling=asynchronous,  # its refill rounds sampled on the thread, with the batch's weights
        **(
            {"vllm_server_base_url": f"http://127.0.0.1:{port}", "vllm_group_port": free_port()}
            if server
            else {}
        ),
    )
    try:
        trainer = VLMGRPOTrainer(
            path, length_reward, args=args, train_dataset=Dataset.from_list(rows), peft_config=peft_config
        )
    except VLMGRPOError as error:  # vLLM does not implement this family: the one-line refusal is the result
        result_file.write_text(json.dumps({"error": str(error)}))
        return
    if server:
        before = server_counts(trainer.vllm_generation.vllm_client)
    trainer.train()
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
    if server:
        result = {"family": family.model_type, "log_history": trainer.state.log_history}
        if asynchronous:
            result["counts"] = vars(trainer._async.counts)
        result_file.write_text(json.dumps(result | server_checks(trainer, loaded, encoded, before, lora)))
        return
    llm = trainer.vllm_generation.llm
    params = vllm.SamplingParams(max_tokens=4, temperature=1.0, logprobs=0, seed=0)
    outputs = llm.generate(inputs, sampling_params=params, use_tqdm=False)
    result = {
        "family": family.model_type,
        "prompts": [list(o.prompt_token_ids) == e.input_ids for o, e in zip(outputs, encoded, strict=True)],
        "completion_lengths": [len(o.outputs[0].token_ids) for o in outputs],
        "log_history": trainer.state.log_history,
    }
    completion = list(outputs[0].outputs[0].token_ids)
    causal = vllm_attends_images_causally()
    ours = trainer_logps(trainer, encoded[0], completion, causal)
    before = vllm_logps(llm, inputs[0], completion)
    result["before_sync"] = gap(before, ours)
    trainer.rollout.vllm.push()
    synced = vllm_logps(llm, inputs[0], completion)
    result["after_sync"] = gap(synced, ours)
    result["tokens"] = {
        "trainer": ours,
        "before_sync": before,
        "after_sync": synced,
    }  # per token, for the record
    result["model_mask_gap"] = gap(synced, trainer_logps(trainer, encoded[0], completion))
    if lora:
        with trainer.accelerator.unwrap_model(trainer.model).disable_adapter():
            result["base_gap"] = gap(synced, trainer_logps(trainer, encoded[0], completion, causal))
    result_file.write_text(json.dumps(result))
    if finish_processes(trainer.release_process_groups):  # as `vlm-grpo train` ends
        exit_process(0)


if __name__ == "__main__":
    main(
        sys.argv[1],
        Path(sys.argv[2]),
        sys.argv[3] if len(sys.argv) > 3 else "",
        int(sys.argv[4]) if len(sys.argv) > 4 else None,
    )
