"""vLLM with tools, run by `test_vllm_tools.py` and `test_vllm_server.py` in a fresh process:
`python vllm_tools_worker.py FAMILY OUT [colocate | server PORT]`.

Trains 2 steps of FAMILY's tiny model with a tool that returns an image and an environment (its `reset` observation
joins each prompt, its `get_reward` is a reward), vLLM in TRL's colocate mode, or a `trl vllm-serve` on PORT serving
the model the test built in `OUT/model`; vLLM's structured outputs (TRL's `vllm_structured_outputs_regex`, the same in
every turn) make each turn either the tool call the family's template renders or a one-word answer, so that some rows
call the tool and answer after its image. Then scores one turn after a tool result: vLLM samples it (the trainer's
`rollout.vllm.next_turns`, as the tool loop calls it, unconstrained) from a history of the prompt's image and the
tool's image, and the trainer computes the log-probs of the same tokens from the same history; in colocate mode vLLM
then scores that row as the trainer hands it over. Writes `OUT/result.json`:

- `log_history`, `completions` (the last step's, images as their sizes) and `prompts` (theirs):
  the training run;
- `sampled_gap`: the largest gap between vLLM's sampling log-prob and the trainer's of a token of that turn;
- colocate mode: `expanded_as_trained`, whether vLLM expanded the row it was handed (one placeholder per image,
  `ModelFamily.vllm_history_ids`) into exactly the ids the trainer trains on; `expanded_again`, how many tokens
  longer vLLM's row is when it is handed the expanded ids, as TRL 1.16 hands them (vLLM expands them again). A server
  takes the expanded ids and places each image's features on its run of image tokens.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(family: str, out: Path, mode: str = "colocate", port: int | None = None) -> None:
    server = mode == "server"
    import torch
    from conftest import color_rows, square_image
    from datasets import Dataset
    from dist_helpers import free_port
    from test_tools import COMMON, Canvas, call_text, family_model, plain, turns_reward, zoom
    from vllm_worker import trainer_logps

    from vlm_grpo import VLMGRPOConfig, VLMGRPOTrainer
    from vlm_grpo.models.base import EncodedPrompt
    from vlm_grpo.testing import build_tiny_model

    # a server serves the model the test built; otherwise the worker builds it
    path = str(out / "model") if server else build_tiny_model(family, out / "model", hidden_size=256)
    _, processor, _ = family_model(lambda _: path, family)
    lead, call, _ = call_text(processor, "zoom", {"region": 2})
    args = VLMGRPOConfig(
        output_dir=str(out / "run"), **COMMON, use_vllm=True, vllm_mode=mode, vllm_max_model_length=1024,
        vllm_gpu_memory_utilization=0.2,
        **({"vllm_server_base_url": f"http://127.0.0.1:{port}", "vllm_group_port": free_port()} if server else {}),
        vllm_structured_outputs_regex=re.escape(lead) + f"({re.escape(call)}|red|blue)",
    )  # fmt: skip
    trainer = VLMGRPOTrainer(
        path,
        turns_reward,
        args=args,
        train_dataset=Dataset.from_list(color_rows(8)),
        tools=[zoom],
        environment_factory=Canvas,
    )
    trainer.train()
    special = {i for i, token in processor.tokenizer.added_tokens_decoder.items() if token.special}
    result = {
        # vLLM's structured outputs write text tokens only: a call that opens with a special token (Gemma 4's
        # `<|tool_call>`) is out of the regex's reach, and every row answers at once
        "call_is_text": not special & set(processor.tokenizer(call, add_special_tokens=False)["input_ids"]),
        "log_history": trainer.state.log_history,
        "completions": str(plain(list(trainer._logs["completion"]))),
        "prompts": [str(p) for p in trainer._logs["prompt"]],
    }

    # One turn after a tool result, sampled by vLLM without the regex.
    trainer.vllm_generation.structured_outputs_regex = None
    prompt_image, tool_image = square_image("red"), square_image("blue", 32)
    history = [
        {"role": "user", "content": [{"type": "image", "image": prompt_image}, {"type": "text", "text": "Color ?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "zoom", "arguments": {"region": 2}}}
        ]},
        {"role": "tool", "name": "zoom", "content": [
            {"type": "image", "image": tool_image}, {"type": "text", "text": "quarter 2"}
        ]},
    ]  # fmt: skip
    ids = processor.apply_chat_template(history, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    ids = list(ids[0] if isinstance(ids[0], list) else ids)
    torch.manual_seed(0)
    images = [prompt_image, tool_image]
    completion_ids, logprobs = trainer.rollout.vllm.next_turns([ids], [images], 1)
    completion, sampled = list(completion_ids[0]), logprobs[0]
    encoded = EncodedPrompt(input_ids=ids, image_inputs=trainer.family.encode_images(processor, images))
    ours = trainer_logps(trainer, encoded, completion)
    result.update(
        tokens=len(completion),
        sampled_gap=max(abs(a - b) for a, b in zip(ours, sampled, strict=True)),
        images_in_row=len(images),
        placeholders=(ids.count(trainer.family.image_token_id(processor))),
    )
    if not server:
        result.update(engine_scores(trainer, ids, completion, images))
    (out / "result.json").write_text(json.dumps(result))


def engine_scores(trainer, ids: list[int], completion: list[int], images: list) -> dict:
    """Colocate mode: the ids vLLM expands the trainer's row into, and TRL's (see the module's docstring)."""
    import vllm

    processor = trainer.processing_class

    # vLLM scores the same row (prompt ids as the trainer hands them to vLLM): the ids it expands them into
    request = {
        "prompt_token_ids": trainer.family.vllm_history_ids(processor, ids + completion),
        "multi_modal_data": {"image": images},
    }
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0)
    scored = trainer.vllm_generation.llm.generate([request], sampling_params=params, use_tqdm=False)[0]
    # the row as TRL hands it to vLLM: placeholders already expanded
    as_trl = {"prompt_token_ids": ids + completion, "multi_modal_data": {"image": images}}
    trl_scored = trainer.vllm_generation.llm.generate([as_trl], sampling_params=params, use_tqdm=False)[0]
    return {
        "expanded_as_trained": list(scored.prompt_token_ids) == ids + completion,
        "expanded_again": len(trl_scored.prompt_token_ids) - len(ids + completion),
    }


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:4], *(int(p) for p in sys.argv[4:5]))
