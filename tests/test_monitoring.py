"""Phase timings, throughput, length statistics and sample files of a real run."""

from __future__ import annotations

import json

import pytest
from conftest import color_dataset, grpo_args, length_reward

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.cli.samples import read_samples, render_html
from vlm_grpo.testing import DEFAULT_FAMILY

TIMINGS = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step"]


def test_metrics_and_samples_of_a_run(tiny_model, tmp_path):
    args = grpo_args(
        tmp_path,
        beta=0.1,
        steps_per_generation=2,  # one generation serves 2 optimizer steps: old log-probs are computed
        max_steps=4,
        log_samples_steps=1,
    )
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=args,
        train_dataset=color_dataset(8),
    )
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 4
    for step, entry in enumerate(logs):
        for phase in TIMINGS:
            assert entry[f"timing_s/{phase}"] >= 0.0, phase
        generated = step % 2 == 0  # generation, old and reference log-probs run on every other step
        assert (entry["timing_s/gen"] > 0) == generated and (entry["timing_s/old_log_prob"] > 0) == generated
        assert (entry["timing_s/ref"] > 0) == generated and entry["timing_s/update_actor"] > 0
        assert (
            entry["timing_s/step"]
            >= entry["timing_s/gen"] + entry["timing_s/ref"] + entry["timing_s/update_actor"] - 1e-6
        )
        assert entry["perf/time_per_step"] == pytest.approx(entry["timing_s/step"])
        assert entry["perf/throughput"] == pytest.approx(
            entry["perf/total_num_tokens"] / entry["perf/time_per_step"]
        )
        if generated:
            for prefix in ("prompt_length", "response_length"):
                assert (
                    entry[f"{prefix}/min"] <= entry[f"{prefix}/mean"] <= entry[f"{prefix}/max"]
                )  # every token of the generation batch (8 rows) is counted in the step that generated it
            tokens = 8 * (entry["prompt_length/mean"] + entry["response_length/mean"])
            assert entry["perf/total_num_tokens"] == pytest.approx(tokens)
            assert "reward" in entry  # TRL's own metrics are still there
        assert "kl" in entry

    samples = read_samples(tmp_path)
    # written when a generation batch is made, numbered by the first step it trains (1-based, as the logs)
    assert {s["step"] for s in samples} == {1, 3}
    for record in samples:
        assert len(record["completions"]) == 2 and len(record["advantages"]) == 2
        assert record["rewards"]["length_reward"] == [float(len(c)) for c in record["completions"]]
        assert "What color is the square ?" in record["prompt"]
    page = render_html(tmp_path)
    assert "What color is the square ?" in page.read_text()
    json.dumps(samples)  # plain JSON


def test_samples_off(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=1, log_samples_steps=0),
        train_dataset=color_dataset(8),
    )
    trainer.train()
    assert not (tmp_path / "samples").exists()
