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
from conftest import color_dataset, color_rows, grpo_args, length_reward, write_color_data, write_train_yaml

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.rollout.prompt_stream import PromptStream
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
        ({"dynamic_sampling_at_cap": "drop"}, "error, fill or keep"),
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
    assert trainer.image_features is not None  # frozen vision: image features are computed once per batch
    trainer.model.train()
    rows = [r for r in color_dataset(3).select([0, 2]) for _ in range(2)]  # red (dropped), blue (kept)
    batch = trainer._generate_and_score_completions(rows)
    kept = {id(row) for row in batch["image_inputs"]}
    assert trainer._metrics["train"]["dynamic_sampling/groups_dropped"][0] >= 1
    assert kept and {row for row, _ in trainer.image_features._outputs} <= kept


# --------------------------------------------------------------------------------- which groups carry no signal
AGGREGATIONS = ["sum_then_normalize", "normalize_then_sum"]
SCALES = ["group", "batch", "none"]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("scale", SCALES)
def test_a_group_is_dropped_exactly_when_its_advantages_are_all_zero(aggregation, scale):
    """Over random rewards with ties and None patterns (all None, a single scorable row, one function None), a group
    is dropped exactly when its advantages in the whole batch, as training computes them, are all zero."""
    from vlm_grpo.advantages import group_advantages
    from vlm_grpo.rollout.dynamic_sampling import no_signal

    generator = torch.Generator().manual_seed(0)
    g, functions = 4, 2
    weights = torch.tensor([1.0, 2.0])
    for _ in range(50):
        groups = []
        for kind in torch.randint(0, 6, (6,), generator=generator).tolist():
            rewards = torch.randint(0, 2, (g, functions), generator=generator).float()  # ties are common
            if kind == 0:
                rewards[:] = torch.nan  # every reward None
            elif kind == 1:
                rewards[1:] = torch.nan  # one scorable row
            elif kind == 2:
                rewards[:, 1] = torch.nan  # the second function never applies
            elif kind == 3:
                rewards[:] = rewards[0]  # every row alike
            groups.append(rewards)
        batch = torch.cat(groups)  # [6*G, F]
        advantages, _, _ = group_advantages(batch, weights, g, scale, aggregation)
        expected = [bool(a.abs().max() <= 1e-6) for a in advantages.view(-1, g)]
        assert no_signal(batch, weights, g, aggregation) == expected
        # whether a group carries a signal does not depend on the groups beside it
        assert [no_signal(r, weights, g, aggregation)[0] for r in groups] == expected


def test_normalize_then_sum_keeps_a_group_whose_weighted_sum_ties():
    """rewards [[2, 0], [0, 1]] with weights [1, 2]: the weighted sums tie (2, 2), yet TRL's normalize_then_sum
    advantages are [-0.707, 0.707]: the group teaches something and is kept."""
    from vlm_grpo.advantages import group_advantages
    from vlm_grpo.rollout.dynamic_sampling import no_signal

    rewards, weights = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 2.0])
    advantages, _, _ = group_advantages(rewards, weights, 2, "group", "normalize_then_sum")
    torch.testing.assert_close(advantages, torch.tensor([-0.7071, 0.7071]), atol=1e-3, rtol=0)
    assert no_signal(rewards, weights, 2, "normalize_then_sum") == [False]
    assert no_signal(rewards, weights, 2, "sum_then_normalize") == [True]


@pytest.mark.parametrize(
    "rewards",
    [[[math.nan], [math.nan]], [[1.0], [math.nan]]],
    ids=["all_none", "one_scorable_row"],
)
def test_groups_without_a_scorable_pair_are_dropped(rewards):
    """TRL gives these groups zero advantage (nan_to_num): they are dropped, not kept as informative."""
    from vlm_grpo.rollout.dynamic_sampling import no_signal

    assert no_signal(torch.tensor(rewards), torch.tensor([1.0]), 2) == [True]


@pytest.mark.parametrize("scale", [1e-7, 1.0, 1e4])
def test_only_rounding_counts_as_no_signal_whatever_the_rewards_scale(scale):
    """`scale_rewards: none` with a small length penalty: rewards that differ by 1e-6 of their scale (a spread TRL
    trains on: its advantages are not zero, and below 1e-6 on rewards up to 1, where an absolute tolerance would drop
    the group) are kept; rewards equal up to float rounding are dropped."""
    from vlm_grpo.advantages import group_advantages
    from vlm_grpo.rollout.dynamic_sampling import no_signal

    weights = torch.tensor([1.0])
    penalised = torch.tensor([[scale], [scale * (1 - 1e-6)]])  # a penalty of 1e-6 of the reward
    rounded = torch.tensor([[scale * 0.1 * 3], [scale * 0.3]])  # equal but for float rounding
    advantages = group_advantages(penalised, weights, 2, "none")[0]
    assert 0 < advantages.abs().max() < 1e-6 * max(scale, 1)  # TRL trains on it
    assert no_signal(penalised, weights, 2) == [False]
    assert no_signal(rounded, weights, 2) == [True]


def test_the_trainer_decides_with_its_own_aggregation(tiny_model, tmp_path):
    """Two functions whose weighted sum is the same on every row, but which disagree row by row: with
    normalize_then_sum every group has a signal and none is dropped; with sum_then_normalize every group is."""
    first = lambda completions, **kwargs: [2.0 * (i % 2) for i in range(len(completions))]  # noqa: E731
    second = lambda completions, **kwargs: [1.0 - i % 2 for i in range(len(completions))]  # noqa: E731
    for aggregation, dropped in (("normalize_then_sum", 0.0), ("sum_then_normalize", 2.0)):
        args = grpo_args(
            tmp_path / aggregation, dynamic_sampling=True, dynamic_sampling_max_rounds=0, log_samples_steps=0,
            multi_objective_aggregation=aggregation, reward_weights=[1.0, 2.0],
        )  # fmt: skip
        trainer = VLMGRPOTrainer(
            tiny_model(DEFAULT_FAMILY), [first, second], args=args, train_dataset=color_dataset(8)
        )
        trainer.model.train()
        trainer._generate_and_score_completions([r for r in color_dataset(2) for _ in range(2)])
        metrics = trainer._metrics["train"]  # at the cap (no extra round) `fill` trains on the dropped groups
        assert metrics["dynamic_sampling/groups_filled"] == [dropped], aggregation


# --------------------------------------------------------------------------------- at the cap
def test_error_at_the_cap_says_how_many_groups_had_no_signal(tiny_model, tmp_path):
    """DAPO's reference stops when its generation budget is spent: `error` does, in one line with the figures."""
    constant = lambda completions, **kwargs: [1.0] * len(completions)  # noqa: E731
    trainer = trainer_for(
        tiny_model, tmp_path, reward=constant, dynamic_sampling_max_rounds=1, dynamic_sampling_at_cap="error"
    )
    trainer.model.train()
    with pytest.raises(VLMGRPOError) as error:
        trainer._generate_and_score_completions([r for r in color_dataset(2) for _ in range(2)])
    message = str(error.value)
    assert "\n" not in message and "after 2 rounds" in message and "4 of 4 sampled groups (100%)" in message
    assert "dynamic_sampling_max_rounds" in message and "fill or keep" in message


def test_keep_never_discards_an_informative_group():
    """`keep` trains on every informative group; with G=2 and 4 micro-batches two groups fill them equally, so 1 or 3
    informative groups are rounded up with dropped ones (to 2 and 4), never down; with G=2 and 2 micro-batches one
    group splits equally, so 1 informative group trains alone."""
    from vlm_grpo.rollout.dynamic_sampling import keep_count

    assert [keep_count(k, 4, 2, 4) for k in (1, 2, 3, 4)] == [2, 2, 4, 4]
    assert [keep_count(k, 2, 2, 2) for k in (1, 2)] == [1, 2]
    assert [keep_count(k, 4, 8, 2) for k in (1, 3)] == [1, 3]
    assert keep_count(1, 3, 3, 2) == 2  # 3 rows of one group cannot split in 2; 2 groups' 6 rows can


@pytest.mark.parametrize(
    "micro_batches, informative, trained, filled",
    [(4, 1, 2, 1), (2, 3, 3, 0)],
    ids=["rounded_up", "all_three"],
)
def test_keep_with_micro_batches_trains_on_every_informative_group(
    micro_batches, informative, trained, filled, tiny_model, tmp_path
):
    """G=2, 4 groups a generation batch: with 4 micro-batches of one row, 1 informative group is rounded up with a
    dropped one (2 groups fill 4 micro-batches equally); with 2 micro-batches of 4 rows, 3 informative groups train
    together (6 rows split equally): none is discarded."""
    reward = lambda completions, solution, **kwargs: [  # noqa: E731
        float(i % 2) if s == "informative" else 1.0 for i, s in enumerate(solution)
    ]
    trainer = trainer_for(
        tiny_model, tmp_path, reward=reward, dynamic_sampling_max_rounds=0, dynamic_sampling_at_cap="keep",
        per_device_train_batch_size=8 // micro_batches, steps_per_generation=micro_batches,
        gradient_accumulation_steps=micro_batches,
    )  # fmt: skip
    rows = color_rows(4)
    for i, row in enumerate(rows):
        row["solution"] = "informative" if i < informative else "flat"
    trainer.model.train()
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(2)])
    assert batch["completion_ids"].size(0) == 2 * trained
    assert trainer._metrics["train"]["dynamic_sampling/groups_filled"] == [float(filled)]


# --------------------------------------------------------------------------------- what the rewards logged
def test_logged_columns_line_up_with_the_logged_completions(tiny_model, tmp_path):
    """A reward logs each completion's text as an extra column and a metric per call: after rounds with dropped
    groups, the extra column holds exactly the texts of the completions table, and the metric only the values of
    calls whose rows are trained on."""

    def agree_and_log(completions, solution, log_extra=None, log_metric=None, **kwargs):
        log_extra("text", [c[0]["content"] for c in completions])
        flat = all(s in DEGENERATE for s in solution)
        log_metric("calls_all_flat", float(flat))
        return agree_on_red_and_green(completions, solution)

    trainer = trainer_for(tiny_model, tmp_path, reward=agree_and_log, max_steps=2, logging_steps=1)
    trainer.model.train()
    rows = [r for r in color_dataset(3).select([0, 2]) for _ in range(2)]  # red (dropped), blue (kept)
    trainer._generate_and_score_completions(rows)
    assert trainer._metrics["train"]["dynamic_sampling/groups_dropped"][0] >= 1
    assert list(trainer._logs["extra"]["text"]) == [c[0]["content"] for c in trainer._logs["completion"]]
    assert len(trainer._logs["completion"]) == 4
    # the rounds of red and green squares alone trained nothing: their calls' value (1.0) is not logged
    assert trainer._metrics["train"]["dynamic_sampling/groups_filled"] == [0.0]
    assert trainer._metrics["train"]["calls_all_flat"] == [0.0]


# --------------------------------------------------------------------------------- fresh prompts
def test_a_refill_round_never_draws_a_prompt_already_sampled_in_the_batch(tiny_model, tmp_path):
    """Twelve distinct prompts, ten of them without signal: every round of a generation batch samples prompts that
    no earlier round of the same batch sampled."""
    calls: list[list[int]] = []

    def mostly_flat(completions, ident, **kwargs):
        calls.append(sorted(set(ident)))
        return [float(i % 2) if k >= 10 else 1.0 for i, k in enumerate(ident)]

    rows = color_rows(12)
    for i, row in enumerate(rows):
        row["ident"] = i
        row["prompt"][0]["content"][-1]["text"] += f" ({i})"
    args = grpo_args(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=4, max_steps=3)
    from datasets import Dataset

    trainer = VLMGRPOTrainer(
        tiny_model(DEFAULT_FAMILY), mostly_flat, args=args, train_dataset=Dataset.from_list(rows)
    )
    trainer.train()
    rounds = [int(e["dynamic_sampling/rounds"]) for e in trainer.state.log_history if "loss" in e]
    assert sum(rounds) == len(calls) and max(rounds) > 2
    for step in range(len(rounds)):
        batch_calls = calls[sum(rounds[:step]) : sum(rounds[: step + 1])]
        drawn = [k for call in batch_calls for k in call]
        assert len(drawn) == len(set(drawn)), batch_calls
