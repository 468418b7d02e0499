"""Dynamic sampling: groups whose rewards all agree are replaced by groups of fresh prompts, on every process alike.

The rewards here are fixed by the prompt: a group of a degenerate prompt gets the same reward on every completion
(zero spread, nothing to learn), the others a reward that varies with the text.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import color_dataset, grpo_args, length_reward, write_color_data, write_train_yaml

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.dynamic_sampling import PromptStream
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.testing import DEFAULT_FAMILY

DEGENERATE = ("red", "green")


def agree_on_red_and_green(completions, solution, **kwargs) -> list[float]:
    """1.0 for every completion of a red or green square; the text's length otherwise."""
    return [
        1.0 if s in DEGENERATE else float(len(c[0]["content"]))
        for c, s in zip(completions, solution, strict=True)
    ]


def trainer_for(tiny_model, tmp_path, reward=agree_on_red_and_green, **overrides) -> VLMGRPOTrainer:
    args = grpo_args(tmp_path, dynamic_sampling=True, log_samples_steps=1, **overrides)
    return VLMGRPOTrainer(tiny_model(DEFAULT_FAMILY), reward, args=args, train_dataset=color_dataset(8))


def samples(folder) -> list[dict]:
    return [
        json.loads(line)
        for f in sorted((folder / "samples").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_groups_whose_rewards_agree_are_replaced(tiny_model, tmp_path):
    trainer = trainer_for(tiny_model, tmp_path, max_steps=3)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 3 and all(e["frac_reward_zero_std"] == 0.0 for e in logs)
    assert sum(e["dynamic_sampling/groups_dropped"] for e in logs) > 0
    assert all(e["dynamic_sampling/prompts"] >= 2 and e["dynamic_sampling/groups_filled"] == 0 for e in logs)
    records = samples(tmp_path)
    trained = [r for r in records if not r.get("dropped")]
    dropped = [r for r in records if r.get("dropped")]
    assert len(trained) == 2 * 3 and all(r["solution"] not in DEGENERATE for r in trained), trained
    assert all(len(set(r["rewards"]["agree_on_red_and_green"])) > 1 for r in trained)
    # every dropped group's rewards agree (any prompt's may, by chance; a red or green one's always do)
    assert dropped and all(len(set(r["rewards"]["agree_on_red_and_green"])) == 1 for r in dropped)
    assert sum(len(r["completions"]) for r in dropped) == 2 * sum(
        e["dynamic_sampling/groups_dropped"] for e in logs
    )


@pytest.mark.parametrize("at_cap", ["fill", "keep"])
def test_at_the_cap(at_cap, tiny_model, tmp_path):
    """Every reward agrees: after 1 + max_rounds rounds, "fill" trains on dropped groups, "keep" on what it kept."""
    constant = lambda completions, **kwargs: [1.0] * len(completions)  # noqa: E731
    trainer = trainer_for(
        tiny_model, tmp_path, reward=constant, dynamic_sampling_max_rounds=2, dynamic_sampling_at_cap=at_cap
    )
    rows = [r for r in color_dataset(2) for _ in range(2)]
    trainer.model.train()  # a training rollout (evaluation never samples dynamically)
    batch = trainer._generate_and_score_completions(rows)
    assert batch["completion_ids"].size(0) == 4
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/rounds"] == [3.0] and metrics["dynamic_sampling/groups_filled"] == [2.0]


def test_keep_trains_on_the_informative_groups_alone(tiny_model, tmp_path):
    trainer = trainer_for(tiny_model, tmp_path, dynamic_sampling_max_rounds=0, dynamic_sampling_at_cap="keep")
    rows = [r for r in color_dataset(3).select([0, 2]) for _ in range(2)]  # red (agrees), blue (varies)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(rows)
    assert batch["completion_ids"].size(0) == 2  # one group, the blue square's
    assert trainer._metrics["train"]["dynamic_sampling/groups_dropped"] == [1.0]


def test_a_step_equals_a_plain_step_on_the_kept_groups(tiny_model, tmp_path):
    """With greedy decoding every group's completions are fixed, so the rewards are too: the dynamic-sampling batch
    (the blue square kept, the red one dropped, a fresh prompt from the stream) gives the loss and gradients of a
    plain step on the blue square and that fresh prompt, within 1e-6."""
    greedy = {"do_sample": False}
    dynamic = trainer_for(tiny_model, tmp_path / "dynamic", generation_kwargs=greedy)
    plain = VLMGRPOTrainer(
        tiny_model(DEFAULT_FAMILY), agree_on_red_and_green, train_dataset=color_dataset(8),
        args=grpo_args(tmp_path / "plain", generation_kwargs=greedy, log_samples_steps=0),
    )  # fmt: skip
    dataset = color_dataset(8)
    fresh = PromptStream(len(dataset), seed=dynamic.args.seed + 1).take(4)
    first_kept = next(i for i in fresh if dataset[i]["solution"] not in DEGENERATE)
    rows = [r for r in dataset.select([0, 2]) for _ in range(2)]  # red, blue
    kept = [r for r in dataset.select([2, first_kept]) for _ in range(2)]

    def loss_and_grads(trainer, inputs):
        trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before a step
        trainer.model.train()
        trainer.model.zero_grad()
        batch = trainer._generate_and_score_completions(inputs)
        loss = trainer._compute_loss(trainer.model, batch)  # TRL's GRPO loss of this batch
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        return batch, loss.detach(), grads

    batch_d, loss_d, grads_d = loss_and_grads(dynamic, rows)
    batch_p, loss_p, grads_p = loss_and_grads(plain, kept)
    assert dynamic._metrics["train"]["dynamic_sampling/groups_dropped"][0] >= 1  # the red square's group
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        assert torch.equal(batch_d[key], batch_p[key]), key  # the same groups, rows and advantages
    assert torch.allclose(loss_d, loss_p, atol=1e-6) and set(grads_d) == set(grads_p) and grads_d
    for name, grad in grads_p.items():
        torch.testing.assert_close(grads_d[name], grad, atol=1e-6, rtol=0, msg=name)


def test_resume_draws_the_prompts_the_uninterrupted_run_draws(tiny_model, tmp_path, monkeypatch):
    from vlm_grpo.train import main as train_main

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "agree_reward.py").write_text(
        "def agree(completions, solution, **kwargs):\n"
        "    return [1.0 if s in ('red', 'green') else float(len(c[0]['content'])) for c, s in zip(completions, solution)]\n"
    )
    data = write_color_data(tmp_path / "data", n=8)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    options = dict(rewards=["agree_reward.agree"], dynamic_sampling=True, max_steps=4, save_strategy="steps",
                   save_steps=2, seed=3, learning_rate=1e-2)  # fmt: skip
    straight = write_train_yaml(
        tmp_path / "a", tiny_model(DEFAULT_FAMILY), data, output_dir=str(tmp_path / "a"), **options
    )
    train_main([str(straight)])
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert json.loads((checkpoint / "prompt_stream.json").read_text())["taken"] > 0
    shutil.copytree(checkpoint, tmp_path / "b" / "checkpoint-2")
    resumed = write_train_yaml(
        tmp_path / "b", tiny_model(DEFAULT_FAMILY), data, output_dir=str(tmp_path / "b"), **options
    )
    train_main([str(resumed), "--resume_from_checkpoint", "true"])
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    stream = [
        json.loads((tmp_path / run / "checkpoint-4" / "prompt_stream.json").read_text()) for run in "ab"
    ]
    assert stream[0] == stream[1]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dynamic_sampling_at_cap": "drop"}, "fill or keep"),
        ({"dynamic_sampling_max_rounds": -1}, ">= 0"),
        ({"per_device_train_batch_size": 3, "num_generations": 3, "steps_per_generation": 1,
          "generation_batch_size": None}, None),
    ],
)  # fmt: skip
def test_options_are_checked(options, message, tmp_path):
    if message is None:  # 3 x 1 rows per process hold whole groups of 3: accepted
        grpo_args(tmp_path, dynamic_sampling=True, **options)
        return
    with pytest.raises(VLMGRPOError, match=message):
        grpo_args(tmp_path, dynamic_sampling=True, **options)


def test_plain_runs_are_unchanged(tiny_model, tmp_path):
    """With dynamic_sampling off no dynamic metric is logged (the TRL parity tests cover the rest)."""
    trainer = VLMGRPOTrainer(
        tiny_model(DEFAULT_FAMILY),
        length_reward,
        args=grpo_args(tmp_path, max_steps=1),
        train_dataset=color_dataset(4),
    )
    trainer.train()
    assert not any(k.startswith("dynamic_sampling/") for e in trainer.state.log_history for k in e)
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


@pytest.mark.distributed
@pytest.mark.parametrize("deepspeed", [None, "local_scripts/zero3.json"], ids=["ddp", "zero3"])
def test_two_processes_agree_and_resume_exactly(deepspeed, tiny_model, tmp_path):
    """torchrun, 2 processes: rank 0's own groups all agree (even record ids) and rank 1's vary, so only rank 0 needs
    fresh prompts; both ranks run the same rounds (the same number of reward calls per step) and train. A run resumed
    from the step-2 checkpoint ends with the uninterrupted run's weights."""
    from dist_helpers import (
        BIN,
        build_deepspeed_cpu_ops,
        free_port,
        launch,
        launch_env,
        load_state,
        read_probe,
        weight_difference,
        write_config,
        write_data,
    )

    if deepspeed:
        built = build_deepspeed_cpu_ops()
        assert built.returncode == 0, built.stdout[-3000:]
    model = tiny_model(DEFAULT_FAMILY)
    data = write_data(tmp_path / "data", ["image"] * 8)

    def torchrun(name: str, *extra: str):
        (tmp_path / name / "probe").mkdir(parents=True, exist_ok=True)
        config = write_config(
            tmp_path / name, model, data, max_steps=4, rewards=["dist_helpers.even_ids_agree"],
            dynamic_sampling=True, dynamic_sampling_max_rounds=4,
        )  # fmt: skip
        cmd = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
        cmd += [
            "-m",
            "vlm_grpo.train",
            str(config),
            *(["--deepspeed", deepspeed] if deepspeed else []),
            *extra,
        ]
        run = launch(cmd, launch_env(tmp_path / name / "probe"), tmp_path / f"{name}.log")
        assert run.returncode == 0 and not run.timed_out, run.tail()
        return tmp_path / name / "run"

    straight = torchrun("straight")
    logs = [e for e in load_state(straight)["log_history"] if "loss" in e]
    assert len(logs) == 4 and all(e["frac_reward_zero_std"] == 0.0 for e in logs)
    assert logs[0]["dynamic_sampling/groups_dropped"] >= 1 and logs[0]["dynamic_sampling/rounds"] >= 2
    calls = read_probe(tmp_path / "straight" / "probe")
    assert len(calls[0]) == len(calls[1]) == sum(e["dynamic_sampling/rounds"] for e in logs)
    resumed_dir = tmp_path / "resumed" / "run"
    shutil.copytree(straight / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = torchrun("resumed", "--resume_from_checkpoint", "true")
    assert load_state(resumed)["global_step"] == 4
    difference, moved = weight_difference(model, straight, resumed)
    assert moved > 0 and difference <= 1e-6, difference


AROUND = {
    "micro_batches": {"steps_per_generation": 2, "per_device_train_batch_size": 2},
    "iterations": {"num_iterations": 2, "max_steps": 4},
    "shared_prefix": {"share_prompt_prefix": True},
    "frozen_vision": {"freeze_vision_modules": True},
    "reference": {"beta": 0.04},
    **{loss: {"loss_type": loss} for loss in ("grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")},
}


@pytest.mark.parametrize("case", list(AROUND))
@pytest.mark.parametrize("layout", ["one_image", "two_images_and_text"])
def test_with_everything_around_it(case, layout, tiny_model, tmp_path):
    """Every generation batch trains on informative groups alone, with each option, on image and mixed batches."""
    dataset = (
        color_dataset(8)
        if layout == "one_image"
        else color_dataset(8, images_per_prompt=2, text_only_every=2)
    )
    args = grpo_args(tmp_path, dynamic_sampling=True, log_samples_steps=0, **AROUND[case])
    trainer = VLMGRPOTrainer(
        tiny_model(DEFAULT_FAMILY), agree_on_red_and_green, args=args, train_dataset=dataset
    )
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert logs and all(math.isfinite(e["loss"]) for e in logs)
    rollouts = [e for e in logs if "dynamic_sampling/rounds" in e]
    assert rollouts and all(e["frac_reward_zero_std"] == 0.0 for e in rollouts)
    assert sum(e["dynamic_sampling/groups_dropped"] for e in rollouts) > 0


def test_features_of_dropped_groups_are_not_kept(tiny_model, tmp_path):
    trainer = trainer_for(tiny_model, tmp_path, freeze_vision_modules=True)
    assert trainer._image_features is not None  # frozen vision: image features are computed once per batch
    trainer.model.train()
    rows = [r for r in color_dataset(3).select([0, 2]) for _ in range(2)]  # red (dropped), blue (kept)
    batch = trainer._generate_and_score_completions(rows)
    kept = {id(row) for row in batch["image_inputs"]}
    assert trainer._metrics["train"]["dynamic_sampling/groups_dropped"][0] >= 1
    assert kept and set(trainer._image_features._outputs) <= kept
