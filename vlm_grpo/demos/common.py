"""Parts every demo shares: writing a synthetic split, the supervised warm start, GRPO, evaluation, reporting.

A demo writes its images and VLM-R1 style JSON records with `write_split`, builds a tiny model with
`demo_model` (a tiny Qwen2-VL), and then calls `evaluate_stage` / `warm_start` / `train_grpo` in turn;
`finish` draws the training curves and the samples page of the GRPO run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import VLMGRPOConfig, VLMModelConfig
from ..data import load_data_config
from ..evaluate import evaluate
from ..plot import plot_run
from ..samples import render_html
from ..testing import ROLE_WORDS
from ..testing.qwen import build_qwen
from ..train import ScriptArguments, run


def words_of(text: str) -> list[str]:
    """The words of `text` as the tiny models' tokenizer splits it: runs of letters and digits, and each
    punctuation character alone (`"content:"` gives `"content"`, `":"`).

    Args:
        text (`str`): any text.
    """
    return re.findall(r"\w+|[^\w\s]", text)


def write_split(out_dir: Path, split: str, records: Sequence[dict[str, Any]]) -> Path:
    """Write `records` as `{split}.json` and a data config `{split}.yaml` naming it; returns the YAML path.

    Args:
        out_dir (`Path`): the data folder; image paths in the records are relative to it.
        split (`str`): the split's name (`"train"`, `"eval"`, ...).
        records (`Sequence[dict]`): VLM-R1 style records (`image`, `problem`, `solution`, extra columns).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{split}.json").write_text(json.dumps(list(records)))
    yaml_path = out_dir / f"{split}.yaml"
    yaml_path.write_text(f"datasets:\n  - json_path: {split}.json\n")
    return yaml_path


def evaluate_stage(
    model_dir: str | Path,
    eval_yaml: Path,
    output: Path,
    rewards: Sequence[str],
    max_new_tokens: int,
    label: str,
) -> dict[str, Any]:
    """Greedy evaluation on the held-out split, written to `output` and printed as one line.

    Args:
        model_dir (`str | Path`): the model folder.
        eval_yaml (`Path`): the held-out data config.
        output (`Path`): where the JSON report goes.
        rewards (`Sequence[str]`): reward names; the first is the report's `accuracy`.
        max_new_tokens (`int`): completion budget.
        label (`str`): the stage, for the printed line (`"start"`, `"after warm start"`, ...).

    Returns:
        `dict`: the report of `vlm_grpo.evaluate.evaluate` plus `seconds`.
    """
    start = time.perf_counter()
    report = evaluate(
        str(model_dir),
        str(eval_yaml),
        rewards=list(rewards),
        max_new_tokens=max_new_tokens,
        batch_size=64,
        output=str(output),
    )
    report["seconds"] = time.perf_counter() - start
    scores = ", ".join(f"{name} {value:.3f}" for name, value in report["rewards"].items())
    print(f"held-out {label}: {scores} (n={report['n']})", flush=True)
    return report


def warm_start(
    model_dir: str | Path,
    data_yaml: Path,
    targets: Sequence[str],
    output_dir: Path,
    epochs: float = 1.0,
    learning_rate: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> float:
    """Supervised warm start with TRL's `SFTTrainer`: prompt + image -> `targets[i]`, loss on the completion only.

    Args:
        model_dir (`str | Path`): the model to start from.
        data_yaml (`Path`): data config of the warm-start records (same prompts as GRPO's).
        targets (`Sequence[str]`): one completion text per record, in the file's order.
        output_dir (`Path`): where the warmed model and its processor are saved.
        epochs (`float`, *optional*, defaults to 1.0): passes over the records.
        learning_rate (`float`, *optional*, defaults to 1e-3): constant learning rate.
        batch_size (`int`, *optional*, defaults to 8): records per step.
        seed (`int`, *optional*, defaults to 0): seed.

    Returns:
        `float`: seconds spent training.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    rows = load_data_config(data_yaml, seed=seed).select_columns(["prompt", "images"])
    if len(targets) != len(rows):
        raise ValueError(f"warm_start: {len(targets)} targets for {len(rows)} records")
    dataset = rows.add_column("completion", [[{"role": "assistant", "content": t}] for t in targets])
    args = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        max_length=None,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        seed=seed,
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
    )
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype="float32")
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(str(output_dir))
    processor.save_pretrained(str(output_dir))
    print(f"warm start: {len(rows)} records x {epochs:g} epochs in {seconds:.0f} s", flush=True)
    return seconds


def demo_model(out_dir: Path, words: list[str], seed: int, image_size: int = 56) -> str:
    """The demos' tiny Qwen2-VL: the chat roles and the task's words as vocabulary, embeddings untied.

    Untied, as in the Qwen2-VL-7B checkpoint (the builder's default ties them, as the 2B does): with one-token
    answers, GRPO then moves only the answer's output embedding. Tied, it also moved the answer's input embedding,
    and the brand demo's model stopped ending its answer (held-out accuracy 0.219 after the warm start, 0.040 after
    GRPO, answers such as "Rada Rada").

    Args:
        out_dir (`Path`): the model's folder.
        words (`list[str]`): the task's words.
        seed (`int`): seed of the random weights.
        image_size (`int`, *optional*, defaults to 56): image side the processor resizes to.
    """
    return build_qwen(
        "qwen2_vl", out_dir, base_words=ROLE_WORDS, words=words, seed=seed, image_size=image_size,
        tie_word_embeddings=False,
    )  # fmt: skip


def grpo_config(output_dir: Path, max_steps: int, seed: int, **overrides: Any) -> VLMGRPOConfig:
    """The demos' GRPO settings on a CPU; `overrides` replace any field.

    Args:
        output_dir (`Path`): the run's folder.
        max_steps (`int`): optimizer steps.
        seed (`int`): seed.
        **overrides (`Any`): other `VLMGRPOConfig` fields (`learning_rate`, `num_generations`, ...).
    """
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=1,
        learning_rate=3e-4,
        lr_scheduler_type="constant",
        beta=0.0,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=25,
        log_samples_steps=100,
        save_strategy="no",
        report_to="none",
        seed=seed,
        disable_tqdm=True,
        use_cpu=True,
    )
    settings.update(overrides)
    return VLMGRPOConfig(**settings)


def train_grpo(
    model_dir: str | Path, train_yaml: Path, rewards: Sequence[str], training_args: VLMGRPOConfig
) -> float:
    """Train with `vlm_grpo.train.run` and save to `training_args.output_dir`; returns the seconds it took.

    Args:
        model_dir (`str | Path`): the model to start from.
        train_yaml (`Path`): the training data config.
        rewards (`Sequence[str]`): reward names.
        training_args (`VLMGRPOConfig`): the GRPO settings (see `grpo_config`).
    """
    script_args = ScriptArguments(data_config=str(train_yaml), rewards=list(rewards))
    model_args = VLMModelConfig(model_name_or_path=str(model_dir), dtype="float32")
    start = time.perf_counter()
    run(script_args, training_args, model_args, compact_console=True)
    seconds = time.perf_counter() - start
    print(f"GRPO: {training_args.max_steps} steps in {seconds:.0f} s", flush=True)
    return seconds


def finish(run_dir: Path) -> dict[str, str]:
    """Draw the run's training curves and samples page; returns their paths.

    Args:
        run_dir (`Path`): the GRPO run's folder.
    """
    curves, page = plot_run(run_dir), render_html(run_dir)
    print(f"training curves: {curves}\nsamples page: {page}", flush=True)
    return {"curves": str(curves), "samples": str(page)}
