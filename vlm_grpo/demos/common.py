"""The demo pipeline, written once (`run_task`), and the parts it is made of.

A demo task is a `DemoTask`: its data (images and VLM-R1 style JSON records written with `write_split`), its
vocabulary, its warm start and its rewards. `run_task` runs every task the same way: write the data, build the
tiny Qwen2-VL (`demo_model`), evaluate (`evaluate_stage`), warm-start (`warm_start`) and evaluate again when the
task has a warm start, train with GRPO (`train_grpo`), evaluate, and draw the training curves and the samples
page of the GRPO run (`finish`).

SIGTERM or SIGUSR1 stops a demo as it stops `vlm-grpo train` (see `vlm_grpo.runtime.preemption`): a training stage (warm
start or GRPO) finishes its step, writes a checkpoint and stops; any other stage finishes first. `run_task` then
raises `Preempted`, saying where the last checkpoint (or saved model) is, instead of going on to a stage that needs
what the stopped one did not write.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli.evaluate import evaluate
from ..cli.plot import plot_run
from ..cli.samples import render_html
from ..config import VLMGRPOConfig, VLMModelConfig
from ..data import load_data_config
from ..rollout.vllm.local_server import served_locally
from ..runtime.preemption import Preempted, PreemptionCallback, preempted_step
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
        `dict`: the report of `vlm_grpo.cli.evaluate.evaluate` plus `seconds`.
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
    stop: PreemptionCallback | None = None,
) -> float:
    """Supervised warm start with TRL's `SFTTrainer`: prompt + image -> `targets[i]`, loss on the completion only.

    Args:
        model_dir (`str | Path`): the model to start from.
        data_yaml (`Path`): data config of the warm-start records (same prompts as GRPO's).
        targets (`Sequence[str]`): one completion text per record, in the file's order.
        output_dir (`Path`): where the warmed model and its processor are saved.
        epochs (`float`, *optional*, defaults to `1.0`): passes over the records.
        learning_rate (`float`, *optional*, defaults to `1e-3`): constant learning rate.
        batch_size (`int`, *optional*, defaults to `8`): records per step.
        seed (`int`, *optional*, defaults to `0`): seed.
        stop (`PreemptionCallback`, *optional*, defaults to `None`): the demo's preemption callback; on a signal the
            warm start writes a checkpoint after its step and stops.

    Returns:
        `float`: seconds spent training.

    Raises:
        `Preempted`: `stop` stopped the warm start; nothing is saved besides its checkpoint.
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
        gradient_checkpointing=False,  # TRL's default recomputes each layer in the backward (1.28x the time here)
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
    callbacks = [stop] if stop is not None else None
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=processor, callbacks=callbacks
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    if stop is not None and stop.stopped_at is not None:
        step = stop.stopped_at
        checkpoint = Path(output_dir) / f"checkpoint-{step}"
        steps = f"after step {step} of {trainer.state.max_steps}"
        raise _preempted(
            stop.received, f"the warm start stopped {steps} with a checkpoint {checkpoint}", str(checkpoint)
        )
    trainer.save_model(str(output_dir))
    processor.save_pretrained(str(output_dir))
    print(f"warm start: {len(rows)} records x {epochs:g} epochs in {seconds:.0f} s", flush=True)
    return seconds


SERVED_HEADS = 2
"""The demo model's attention heads with `--async_rollouts`: vLLM's CPU attention runs head dims of 32 or more, so the
64-wide text tower has 2 heads of 32 there instead of 4 of 16 (the same width; 4 heads of 32, 128 wide, learned the
colour task on one seed in three at the demo's learning rate)."""


def demo_model(out_dir: Path, words: list[str], seed: int, image_size: int = 56, heads: int = 4) -> str:
    """The demos' tiny Qwen2-VL: the chat roles and the task's words as vocabulary, embeddings untied.

    Untied, as in the Qwen2-VL-7B checkpoint (the builder's default ties them, as the 2B does): with one-token
    answers, GRPO then moves only the answer's output embedding, not its input embedding as well.

    Args:
        out_dir (`Path`): the model's folder.
        words (`list[str]`): the task's words.
        seed (`int`): seed of the random weights.
        image_size (`int`, *optional*, defaults to `56`): image side the processor resizes to.
        heads (`int`, *optional*, defaults to `4`): the text tower's attention heads (a vLLM server on a CPU needs
            head dims of 32 or more: `SERVED_HEADS`).
    """
    return build_qwen(
        "qwen2_vl", out_dir, base_words=ROLE_WORDS, words=words, seed=seed, image_size=image_size,
        tie_word_embeddings=False, num_attention_heads=heads,
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
    model_dir: str | Path,
    train_yaml: Path,
    rewards: Sequence[Any],
    training_args: VLMGRPOConfig,
    environment_factory: str | None = None,
) -> float:
    """Train with `vlm_grpo.train.run` and save to `training_args.output_dir`; returns the seconds it took.

    Args:
        model_dir (`str | Path`): the model to start from.
        train_yaml (`Path`): the training data config.
        rewards (`Sequence`): reward names or `{name, weight, ...}` specs.
        training_args (`VLMGRPOConfig`): the GRPO settings (see `grpo_config`).
        environment_factory (`str`, *optional*, defaults to `None`): dotted path of the rows' environment, whose
            methods are the tools the model may call.

    Raises:
        `Preempted`: a preemption signal stopped the run after a step, with a complete checkpoint and no model.
    """
    script_args = ScriptArguments(
        data_config=str(train_yaml), rewards=list(rewards), environment_factory=environment_factory
    )
    model_args = VLMModelConfig(model_name_or_path=str(model_dir), dtype="float32")
    start = time.perf_counter()
    trainer = run(script_args, training_args, model_args, compact_console=True)
    seconds = time.perf_counter() - start
    step = preempted_step(trainer.callback_handler.callbacks)
    if step is not None:
        received = next(
            c.received for c in trainer.callback_handler.callbacks if isinstance(c, PreemptionCallback)
        )
        checkpoint = Path(training_args.output_dir) / f"checkpoint-{step}"
        steps = f"after step {step} of {training_args.max_steps}"
        raise _preempted(
            received, f"GRPO stopped {steps} with a complete checkpoint {checkpoint}", str(checkpoint)
        )
    print(f"GRPO: {training_args.max_steps} steps in {seconds:.0f} s", flush=True)
    return seconds


def _preempted(received: int | None, what: str, checkpoint: str | None) -> Preempted:
    """The `Preempted` of a demo that the signal `received` stopped: `what` stopped, and where."""
    name = signal.Signals(received).name if received else "a signal"
    return Preempted(
        f"preempted ({name}): {what}; a demo does not resume: run it again to start over", checkpoint
    )


def _stop_if_signalled(stop: PreemptionCallback, what: str, checkpoint: str | None = None) -> None:
    """Between two stages: raise `Preempted` (`what` says what is done and where it is) when a signal came."""
    if stop.received is not None:
        raise _preempted(stop.received, what, checkpoint)


def finish(run_dir: Path) -> dict[str, str]:
    """Draw the run's training curves and samples page; returns their paths.

    Args:
        run_dir (`Path`): the GRPO run's folder.
    """
    curves, page = plot_run(run_dir), render_html(run_dir)
    print(f"training curves: {curves}\nsamples page: {page}", flush=True)
    return {"curves": str(curves), "samples": str(page)}


@dataclass(frozen=True)
class DemoTask:
    """What one demo task supplies to `run_task`: its data, vocabulary, warm start, rewards and defaults.

    Args:
        output_dir (`str`): default output folder (`"runs/demo-brand"`, ...).
        max_steps (`int`): default number of GRPO steps.
        write_data (`Callable[..., dict]`): `write_data(out_dir, seed=seed, **data_sizes)` writes the splits and
            returns their data configs by split name: `"train"`, `"eval"` and, with a warm start, `"warm"` and
            `"warm_targets"` (one completion text per warm-start record).
        vocabulary (`Callable[[], list[str]]`): the task's words, the tiny model's vocabulary besides the chat roles.
        rewards (`tuple[str, ...]`): held-out reward names; the first is the reported accuracy.
        max_new_tokens (`int`): completion budget of the held-out evaluation.
        train_rewards (`tuple[str, ...]`, *optional*, defaults to `None`): the rewards GRPO trains on; `None` means
            `rewards`.
        image_size (`int`, *optional*, defaults to `56`): image side the model's processor resizes to.
        warm_epochs (`float`, *optional*, defaults to `0`): default warm-start epochs; `0` means no warm start.
        warm_batch_size (`int`, *optional*, defaults to `16`): warm-start records per step.
        warm_learning_rate (`float`, *optional*, defaults to `3e-3`): the warm start's constant learning rate.
        grpo_settings (`dict[str, Any]`, *optional*, defaults to `{}`): GRPO settings of the task (`grpo_config`
            fills in the rest).
        first_stage (`str`, *optional*, defaults to `"start"`): name of the first held-out report, in the result
            and in its file `eval_{first_stage}.json`.
        target (`float`, *optional*, defaults to `0.0`): the held-out score GRPO should reach: an absolute score, or
            with `target_is_gain` a gain over the warm start.
        target_is_gain (`bool`, *optional*, defaults to `False`): `target` is a gain over the warm start.
        documented (`tuple[float, ...]`, *optional*, defaults to `()`): the held-out scores after GRPO that
            docs/demos.md gives for seeds 0, 1, 2 with the default `max_steps` (a test keeps the two equal); the demo
            prints its seed's beside its own.
    """

    output_dir: str
    max_steps: int
    write_data: Callable[..., dict[str, Any]]
    vocabulary: Callable[[], list[str]]
    rewards: tuple[str, ...]
    max_new_tokens: int
    train_rewards: tuple[str, ...] | None = None
    image_size: int = 56
    warm_epochs: float = 0
    warm_batch_size: int = 16
    warm_learning_rate: float = 3e-3
    grpo_settings: dict[str, Any] = field(default_factory=dict)
    first_stage: str = "start"
    target: float = 0.0
    target_is_gain: bool = False
    documented: tuple[float, ...] = ()

    def verdict(self, result: dict[str, Any], seed: int, max_steps: int | None = None) -> str:
        """How a run's held-out score after GRPO compares with the target and with the documented score of its seed
        (see `verdict_text`).

        Args:
            result (`dict`): what `run_task` returned.
            seed (`int`): the run's seed.
            max_steps (`int`, *optional*, defaults to `None`): the GRPO steps the run trained; `None` means the
                task's default (`self.max_steps`), the run the documented scores are for.
        """
        after = result["after"]["accuracy"]
        if self.target_is_gain:
            base = (result.get("warm") or result[self.first_stage])["accuracy"]
            met, goal = after - base >= self.target, f"+{self.target:g} over the warm start"
        else:
            met, goal = after >= self.target, f">= {self.target:g}"
        documented = self.documented[seed] if seed < len(self.documented) else None
        steps = self.max_steps if max_steps is None else max_steps
        return verdict_text(met, goal, seed, documented, self.max_steps, steps)


def verdict_text(
    met: bool, goal: str, seed: int, documented: float | None, default_steps: int, steps: int
) -> str:
    """The demo's closing verdict: the documented score of its seed, which run that score is for, and the target.

    The documented scores and the target are those of the default run (`default_steps` GRPO steps). A run trained
    for fewer steps says how many, and a target it does not reach is "not reached in N steps", not "missed": a
    shortened run is no failure of the default one. A longer run is held to the target as the default one is.

    Args:
        met (`bool`): the run's held-out score after GRPO meets the target.
        goal (`str`): the target in words (`">= 0.9"`, `"+0.3 over the warm start"`).
        seed (`int`): the run's seed.
        documented (`float | None`): docs/demos.md's score for this seed; `None` when it gives none.
        default_steps (`int`): the task's default GRPO steps, those of the documented run.
        steps (`int`): the GRPO steps this run trained.

    Returns:
        `str`: e.g. `documented for seed 0: 0.984 held out after 500 steps (the default run); this run trained 40
        steps; target >= 0.9: not reached in 40 steps (the target is for the default run's 500)`.
    """
    parts = []
    if documented is not None:
        parts.append(
            f"documented for seed {seed}: {documented:.3f} held out after {default_steps} steps (the default run)"
        )
    if steps != default_steps:
        parts.append(f"this run trained {steps} steps")
    if met:
        outcome = "met"
    elif steps < default_steps:
        outcome = f"not reached in {steps} steps (the target is for the default run's {default_steps})"
    else:
        outcome = "missed"
    parts.append(f"target {goal}: {outcome}")
    return "; ".join(parts)


def run_task(
    task: DemoTask,
    output_dir: str | None = None,
    max_steps: int | None = None,
    seed: int = 0,
    warm_epochs: float | None = None,
    data_sizes: dict[str, int] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Build, evaluate, warm-start, evaluate, train with GRPO, evaluate: one demo task end to end.

    Args:
        task (`DemoTask`): the task.
        output_dir (`str`, *optional*, defaults to `None`): where everything goes; `None` means `task.output_dir`.
        max_steps (`int`, *optional*, defaults to `None`): GRPO steps; `None` means `task.max_steps`.
        seed (`int`, *optional*, defaults to `0`): seed of data, model and training.
        warm_epochs (`float`, *optional*, defaults to `None`): warm-start epochs; `None` means `task.warm_epochs`,
            `0` skips the warm start (and its report).
        data_sizes (`dict[str, int]`, *optional*, defaults to `None`): split sizes passed to `task.write_data`
            (`n_train`, `n_warm`, `n_eval`); `None` keeps the task's own.
        **overrides (`Any`): `VLMGRPOConfig` fields replacing the task's GRPO settings.

    Returns:
        `dict`: the held-out reports (`task.first_stage`, `warm` after a warm start, `after`), the seconds of the
        warm start and of GRPO (`warm_seconds`, `train_seconds`), the paths of the curves and samples page, the GRPO
        steps trained (`max_steps`) and the `verdict` (`DemoTask.verdict`).

    Raises:
        `Preempted`: SIGTERM or SIGUSR1 stopped the demo (see the module's docstring); the message says where the
            last checkpoint is.
    """
    stop = PreemptionCallback()
    with stop.handle_signals():
        return _run_stages(task, stop, output_dir, max_steps, seed, warm_epochs, data_sizes, overrides)


def _run_stages(
    task: DemoTask,
    stop: PreemptionCallback,
    output_dir: str | None,
    max_steps: int | None,
    seed: int,
    warm_epochs: float | None,
    data_sizes: dict[str, int] | None,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """`run_task`'s stages, checking for a preemption signal between them."""
    out = Path(output_dir if output_dir is not None else task.output_dir)
    max_steps = task.max_steps if max_steps is None else max_steps
    warm_epochs = task.warm_epochs if warm_epochs is None else warm_epochs
    data = task.write_data(out / "data", seed=seed, **(data_sizes or {}))
    heads = SERVED_HEADS if overrides.get("async_rollouts") else 4  # a vLLM server's head dims
    model_dir = demo_model(out / "model-init", task.vocabulary(), seed, task.image_size, heads)
    stage = dict(rewards=task.rewards, max_new_tokens=task.max_new_tokens)
    result: dict[str, Any] = {}
    first = task.first_stage
    result[first] = evaluate_stage(
        model_dir, data["eval"], out / f"eval_{first}.json", label="start", **stage
    )
    _stop_if_signalled(stop, "stopped before training; no checkpoint was written")
    start_from = Path(model_dir)
    if warm_epochs:
        result["warm_seconds"] = warm_start(
            model_dir,
            data["warm"],
            data["warm_targets"],
            out / "model-warm",
            epochs=warm_epochs,
            seed=seed,
            batch_size=task.warm_batch_size,
            learning_rate=task.warm_learning_rate,
            stop=stop,
        )
        start_from = out / "model-warm"
        _stop_if_signalled(stop, f"stopped after the warm start, saved to {start_from}", str(start_from))
        result["warm"] = evaluate_stage(
            start_from, data["eval"], out / "eval_warm.json", label="after warm start", **stage
        )
        _stop_if_signalled(stop, f"stopped after the warm start, saved to {start_from}", str(start_from))
    # with `--async_rollouts`, against a local vLLM server for the GRPO stage
    with served_locally(start_from, out / "vllm-server.log", {**task.grpo_settings, **overrides}) as settings:
        args = grpo_config(out / "model", max_steps, seed, **settings)
        rewards = task.train_rewards or task.rewards
        result["train_seconds"] = train_grpo(start_from, data["train"], rewards, args)
    trained = f"stopped after GRPO, whose model is saved to {out / 'model'}"
    _stop_if_signalled(stop, f"{trained}; the held-out evaluation after GRPO was not run", str(out / "model"))
    result["after"] = evaluate_stage(
        out / "model", data["eval"], out / "eval_after.json", label="after GRPO", **stage
    )
    _stop_if_signalled(stop, f"{trained} and scored in {out / 'eval_after.json'}", str(out / "model"))
    result.update(finish(out / "model"))
    result["max_steps"] = max_steps
    result["verdict"] = task.verdict(result, seed, max_steps)
    return result
