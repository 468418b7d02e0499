"""`vlm-grpo eval`: greedy (by default) generation on a data config, scored by rewards, written as JSON.

    vlm-grpo eval --model runs/demo/model --data data_config/eval.yaml --output eval.json
    vlm-grpo eval --model runs/lora --data geo3k_test.yaml          # a LoRA run: its base model comes along
    vlm-grpo eval --model Qwen/Qwen2.5-VL-7B-Instruct --adapter runs/lora --data geo3k_test.yaml
    vlm-grpo eval --model runs/rec --data rec_eval.yaml --rewards "{name: accuracy, default: iou}" format

Report: `{"accuracy": float, "n": int, "rewards": {name: mean}}`; accuracy is the mean of the first reward
(default `accuracy`, which follows each record's `accu_reward_method`, or its `default` option for records without
one). A None reward (not applicable to that record) is left out of its mean. Every input (model folder, adapter,
data config, rewards) is checked before the model loads; a missing file or an unknown reward before torch,
transformers or TRL is imported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import VLMGRPOError
from ..rewards import AsyncNamedReward, build_rewards, connect_rewards
from .options import check_model_path, is_hub_id

if TYPE_CHECKING:  # torch, transformers and TRL are imported once the inputs are checked
    import torch

    from ..models import ModelFamily

_NOT_REWARD_COLUMNS = ("prompt", "images", "image")
"""A hub id, `owner/name`: what a model path that is no folder here must look like (see `is_hub_id`)."""


def generate_texts(
    model: torch.nn.Module,
    processor: Any,
    family: ModelFamily,
    rows: Sequence[dict[str, Any]],
    max_new_tokens: int = 64,
    greedy: bool = True,
    temperature: float = 1.0,
) -> list[str]:
    """Generate one completion per row (conversational `prompt` + `images`) and decode it.

    Args:
        model (`torch.nn.Module`): the model (or PEFT model), in eval mode.
        processor (`ProcessorMixin`): its processor.
        family (`ModelFamily`): its per-model module.
        rows (`Sequence[dict]`): dataset rows.
        max_new_tokens (`int`, defaults to 64): completion budget.
        greedy (`bool`, defaults to True): greedy decoding; False samples at `temperature`.
        temperature (`float`, defaults to 1.0): sampling temperature when not greedy.
    """
    import torch

    with torch.no_grad():
        return _generate_texts(model, processor, family, rows, max_new_tokens, greedy, temperature)


def _generate_texts(
    model: torch.nn.Module,
    processor: Any,
    family: ModelFamily,
    rows: Sequence[dict[str, Any]],
    max_new_tokens: int,
    greedy: bool,
    temperature: float,
) -> list[str]:
    """`generate_texts`, run inside `torch.no_grad()`."""
    from trl.data_utils import prepare_multimodal_messages

    from ..data.rows import load_rows
    from ..rollout.batch import pad_rows

    device = next(model.parameters()).device
    encoded = []
    for row in load_rows(rows):
        messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
        encoded.append(family.encode_prompt(processor, messages, row["images"], videos=row["videos"]))
    ids, mask = pad_rows([e.input_ids for e in encoded], processor.tokenizer.pad_token_id, "left")  # [B, P]
    ids, mask = ids.to(device), mask.to(device)
    inputs = family.model_inputs(
        model.config, ids, mask, [e.image_inputs for e in encoded]
    )  # + image tensors
    eos = family.eos_token_ids(processor, model)  # those training stops on
    # TRL's sampling defaults, never the checkpoint's (a published generation_config.json may set top_k, top_p or a
    # repetition penalty, which `generate` would otherwise merge in)
    sampling = {"temperature": temperature, "top_p": 1.0, "top_k": 0} if not greedy else {}
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        repetition_penalty=1.0,
        **sampling,
        eos_token_id=eos,
        pad_token_id=processor.tokenizer.pad_token_id,
        suppress_tokens=family.placeholder_token_ids(processor, model.config),
    )
    completions = output[:, ids.size(1) :].cpu()  # [B, C]
    texts = []
    for row in completions.tolist():
        cut = next((i for i, t in enumerate(row) if t in eos), len(row))
        texts.append(processor.tokenizer.decode(row[:cut], skip_special_tokens=True))
    return texts


def resolve_adapter(model: str, adapter: str | None) -> tuple[str, str | None]:
    """`(base model, adapter)`: a `--model` folder that holds a LoRA adapter names its base model itself.

    Raises:
        VLMGRPOError: the adapter's base model is not here, `--adapter` is not an adapter folder, or both flags
            name adapters; the message says which flags to pass.
    """
    config = os.path.join(model, "adapter_config.json")
    if os.path.isfile(config) and not os.path.isfile(os.path.join(model, "config.json")):
        if adapter is not None:
            raise VLMGRPOError(
                f"--model {model} is a LoRA adapter, and so is --adapter {adapter}; pass the base model as --model."
            )
        base = json.loads(open(config, encoding="utf-8").read()).get("base_model_name_or_path")
        if not base or not (os.path.isdir(base) or is_hub_id(base)):
            raise VLMGRPOError(
                f"{model} holds a LoRA adapter trained on {base!r}, which is not a folder here; pass "
                f"--model BASE_MODEL_FOLDER --adapter {model}."
            )
        return base, model
    if adapter is not None and not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        raise VLMGRPOError(
            f"--adapter {adapter} has no adapter_config.json; point it at a saved LoRA adapter."
        )
    return model, adapter


def check_paths(model: str, data: str) -> None:
    """Refuse a `--model` or `--data` that names no file here, before any heavy import.

    A `--model` that does not exist is taken for a hub id when it reads as one (`is_hub_id`), as `from_pretrained`
    reads it; any other path must be a folder holding a saved model (`config.json`) or a LoRA adapter.

    Args:
        model (`str`): the `--model` value.
        data (`str`): the `--data` value.

    Raises:
        VLMGRPOError: the data config or the model folder is missing; the message names the flag.
    """
    if not Path(data).is_file():
        raise VLMGRPOError(f"--data: data config {data} not found; pass the path of an existing YAML file.")
    check_model_path(model, "--model")


def check_rewards_apply(funcs: Sequence[Any], dataset: Any) -> None:
    """Score an empty completion of the first record with every reward, so that a reward that cannot read this
    data (e.g. `accuracy` without `accu_reward_method` and no `default`) fails before the model loads."""
    if len(dataset) == 0:
        return
    row = dataset[0]
    columns = {k: [v] for k, v in row.items() if k not in _NOT_REWARD_COLUMNS}
    for func in funcs:
        if isinstance(func, AsyncNamedReward):  # not awaited here; a judge is checked by `connect_rewards`
            continue
        try:
            func(prompts=[row["prompt"]], completions=[[{"role": "assistant", "content": ""}]], **columns)
        except VLMGRPOError as error:
            raise VLMGRPOError(
                f"{error} On the eval command line, reward options go in YAML form: "
                '--rewards "{name: accuracy, default: iou}".'
            ) from error


def evaluate(
    model: str,
    data: str,
    adapter: str | None = None,
    rewards: Sequence[Any] = ("accuracy",),
    batch_size: int = 8,
    max_new_tokens: int = 64,
    greedy: bool = True,
    seed: int = 42,
    output: str | None = None,
    trust_remote_code: bool = False,
    video_fps: float = 2.0,
    video_max_frames: int | None = None,
) -> dict[str, Any]:
    """Evaluate `model` (plus an optional LoRA `adapter`) on the data config `data`.

    Args:
        model (`str`): model folder.
        data (`str`): YAML data config.
        adapter (`str | None`): PEFT adapter folder trained on top of `model`.
        rewards (`Sequence`, defaults to `("accuracy",)`): reward specs as in a training YAML; the first one is the
            accuracy.
        batch_size (`int`, defaults to 8): prompts per generate call.
        max_new_tokens (`int`, defaults to 64): completion budget.
        greedy (`bool`, defaults to True): greedy decoding.
        seed (`int`, defaults to 42): seed (data sampling, and decoding when not greedy).
        output (`str | None`): where to write the JSON report.
        trust_remote_code (`bool`, defaults to False): allow code shipped with the checkpoint to run.
        video_fps (`float`, defaults to 2.0): frames per second sampled from a video file, as training's
            `video_fps`.
        video_max_frames (`int | None`, defaults to None): most frames sampled from a video, as training's
            `video_max_frames` (None: the video processor's own).
    """
    if not video_fps > 0:
        raise VLMGRPOError(f"--video_fps must be a positive number, got {video_fps}.")
    check_paths(model, data)
    model, adapter = resolve_adapter(model, adapter)
    funcs, _ = build_rewards(list(rewards))
    from transformers.trainer_utils import set_seed

    from ..data import load_data_config
    from ..device import default_device
    from ..models import get_model_family

    set_seed(seed)
    family = get_model_family(model, trust_remote_code=trust_remote_code)
    dataset = load_data_config(data, seed=seed)
    check_rewards_apply(funcs, dataset)
    connect_rewards(funcs)
    policy = family.load_model(model, **family.model_init_kwargs(trust_remote_code=trust_remote_code))
    if adapter:
        from peft import PeftModel

        policy = PeftModel.from_pretrained(policy, adapter)
    policy = policy.to(default_device()).eval()
    processor = family.load_processor(model, trust_remote_code=trust_remote_code)
    family.configure_video(processor, fps=video_fps, max_frames=video_max_frames)

    scores: dict[str, list[float]] = {f.__name__: [] for f in funcs}
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        texts = generate_texts(policy, processor, family, rows, max_new_tokens, greedy)
        columns = {k: [row[k] for row in rows] for k in rows[0] if k not in _NOT_REWARD_COLUMNS}
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        for func in funcs:
            values = func(prompts=[r["prompt"] for r in rows], completions=completions, **columns)
            if isinstance(func, AsyncNamedReward):
                values = asyncio.run(values)
            scores[func.__name__].extend(float(v) for v in values if v is not None and not math.isnan(v))

    means = {name: (sum(v) / len(v) if v else float("nan")) for name, v in scores.items()}
    report = {"accuracy": means[funcs[0].__name__], "n": len(dataset), "rewards": means}
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(report, indent=2) + "\n")
    return report


def reward_spec(text: str) -> Any:
    """A `--rewards` item: a reward name, or a YAML mapping `{name: ..., option: value}` as in a training YAML."""
    if not text.lstrip().startswith("{"):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise VLMGRPOError(
            f"--rewards {text!r}: not a YAML mapping ({' '.join(str(error).split())})."
        ) from error


def main(argv: list[str] | None = None) -> None:
    """Entry point of `vlm-grpo eval`."""
    parser = argparse.ArgumentParser(prog="vlm-grpo eval", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="model folder, or a LoRA run's folder (its base model is found)"
    )
    parser.add_argument("--adapter", default=None, help="LoRA adapter folder trained on top of --model")
    parser.add_argument("--data", required=True, help="YAML data config to evaluate on")
    parser.add_argument("--output", default=None, help="write the JSON report here")
    parser.add_argument(
        "--rewards",
        nargs="+",
        default=["accuracy"],
        help="rewards, as in a training YAML: names, or mappings with options such as "
        '"{name: accuracy, default: iou}"; the first is the accuracy (default: accuracy, which follows each '
        "record's accu_reward_method)",
    )
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trust_remote_code", action="store_true")
    parser.add_argument(
        "--video_fps",
        type=float,
        default=2.0,
        help="frames per second sampled from a video file (as training)",
    )
    parser.add_argument(
        "--video_max_frames", type=int, default=None, help="most frames sampled from a video (as training)"
    )
    args = parser.parse_args(argv)
    report = evaluate(
        args.model,
        args.data,
        args.adapter,
        [reward_spec(text) for text in args.rewards],
        args.batch_size,
        args.max_new_tokens,
        not args.sample,
        args.seed,
        args.output,
        args.trust_remote_code,
        args.video_fps,
        args.video_max_frames,
    )
    print(f"accuracy: {report['accuracy']:.4f} (n={report['n']})")
    print(json.dumps(report["rewards"], indent=2))
