"""The `judge` reward: its parsers, its faults and throughput against a local HTTP judge (`vlm_grpo.testing.judge_server`),
a judge loaded in the process, the check before training, a training run scored by the judge, and the benchmark."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import color_dataset, grpo_args, write_color_data, write_train_yaml
from PIL import Image

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.rewards import JudgeReward, build_rewards, connect_rewards
from vlm_grpo.rewards.judge_parse import make_parser, parse_rubric, parse_score, parse_yes_no
from vlm_grpo.testing import DEFAULT_FAMILY
from vlm_grpo.testing._common import ROLE_WORDS, TokenizerSpec, build_word_tokenizer
from vlm_grpo.testing.judge_server import GARBAGE, judge_server, length_score, user_text

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
"""The tiny judge's chat template: the messages' text alone, so that its reply follows the completion's last word."""
DIGITS = tuple(str(i) for i in range(11))


def judge(url: str, **options) -> JudgeReward:
    """A judge of the local server whose request is the completion alone (the server scores its length)."""
    (reward,), _ = build_rewards(
        [{"name": "judge", "url": url, "model": "judge", "template": "{completion}", **options}]
    )
    return reward


def score(reward, completions, prompts=None, **columns) -> tuple[list, dict]:
    """`reward`'s values, as TRL awaits it, and what it logged (`log_metric` and `log_extra`)."""
    logged: dict = {}
    values = asyncio.run(
        reward(
            prompts=prompts or ["q"] * len(completions),
            completions=completions,
            log_metric=logged.__setitem__,
            log_extra=logged.__setitem__,
            **columns,
        )
    )
    return values, logged


def expected(text: str) -> float:
    return int(length_score(text)) / 10


# --------------------------------------------------------------------------- parsers


def test_score_parser_reads_the_last_number_in_range():
    assert parse_score("Score: 7") == pytest.approx(0.7)
    assert parse_score("7/10") == pytest.approx(0.7)
    assert parse_score("The answer misses step 2, so I give it 4.") == pytest.approx(0.4)
    assert parse_score("<think>maybe 9</think> 3") == pytest.approx(0.3)
    assert parse_score("4.5", low=1, high=5) == pytest.approx(0.875)
    assert parse_score("-1") is None and parse_score("11") is None  # out of the range
    assert parse_score("no number here") is None and parse_score("") is None
    assert parse_score("version v2") is None  # a digit inside a word is no score


def test_yes_no_parser_reads_the_first_verdict():
    assert parse_yes_no("Yes.") == 1.0 and parse_yes_no("NO, it is wrong") == 0.0
    assert parse_yes_no("<think>no idea, yes</think>Yes") == 1.0
    assert parse_yes_no("Yes, there is no error") == 1.0
    assert parse_yes_no("Maybe") is None and parse_yes_no("yesterday nothing") is None


def test_rubric_parser_weighs_the_items():
    weights = {"correct": 3.0, "clear": 1.0}
    assert parse_rubric('{"correct": 10, "clear": 2}', weights) == pytest.approx((3 * 1.0 + 0.2) / 4)
    fenced = 'Here:\n```json\n{"correct": true, "clear": 5, "note": "x"}\n```'
    assert parse_rubric(fenced, weights) == pytest.approx((3 + 0.5) / 4)
    assert parse_rubric('{"correct": 10}', weights) is None  # an item missing
    assert parse_rubric('{"correct": 12, "clear": 2}', weights) is None  # out of the range
    assert parse_rubric('{"correct": "high", "clear": 2}', weights) is None
    assert parse_rubric("{not json}", weights) is None and parse_rubric("[1, 2]", weights) is None
    assert make_parser("rubric", [1, 5], {"a": 1})('{"a": 5}') == 1.0


def test_parser_options_are_checked():
    with pytest.raises(VLMGRPOError, match="unknown parser 'scor'"):
        make_parser("scor")
    with pytest.raises(VLMGRPOError, match="score_range must be two numbers"):
        make_parser("score", [10, 0])
    with pytest.raises(VLMGRPOError, match="needs `rubric"):
        make_parser("rubric")
    with pytest.raises(VLMGRPOError, match="positive weight"):
        make_parser("rubric", rubric={"a": 0})
    with pytest.raises(VLMGRPOError, match="goes with `parser: rubric`"):
        make_parser("score", rubric={"a": 1})


def test_spec_keys_are_checked():
    with pytest.raises(VLMGRPOError, match="either url and model .* or model_path"):
        build_rewards([{"name": "judge"}])
    with pytest.raises(VLMGRPOError, match=r"unknown key 'api_key' \(did you mean 'api_key_env'\?\)"):
        build_rewards([{"name": "judge", "url": "http://x/v1", "model": "m", "api_key": "secret"}])
    with pytest.raises(VLMGRPOError, match="concurrency must be at least 1"):
        build_rewards([{"name": "judge", "url": "http://x/v1", "model": "m", "concurrency": 0}])
    with pytest.raises(VLMGRPOError, match="retries must be an integer"):
        build_rewards([{"name": "judge", "url": "http://x/v1", "model": "m", "retries": 1.5}])
    with pytest.raises(VLMGRPOError, match="template is not a valid format string"):
        build_rewards([{"name": "judge", "url": "http://x/v1", "model": "m", "template": "{completion"}])
    funcs, _ = build_rewards([{"name": "judge", "model_path": "m"}, {"name": "judge", "model_path": "m"}])
    assert [f.__name__ for f in funcs] == ["judge", "judge_2"]


# --------------------------------------------------------------------------- requests


def test_request_holds_the_template_fields_and_the_images(tmp_path):
    path = tmp_path / "a.png"
    Image.new("RGB", (4, 4), (255, 0, 0)).save(path)
    with judge_server() as server:
        reward = judge(
            server.url,
            template="Q: {question} | A: {completion} | S: {solution} | O: {options}",
            system="Be fair.",
        )
        prompt = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour ?"}]}
        ]
        tool_rollout = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "zoom", "arguments": {"r": 1}}}],
            },
            {"role": "tool", "content": [{"type": "text", "text": "zoomed"}]},
            {"role": "assistant", "content": "red"},
        ]
        values, logged = score(
            reward, [tool_rollout], prompts=[prompt], solution=["<answer>red</answer>"], options=[["red", "blue"]],
            images=[[str(path)]],
        )  # fmt: skip
    (request,) = server.requests
    system, user = request["messages"]
    assert system == {"role": "system", "content": "Be fair."}
    image, text = user["content"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    completion = 'assistant: [call zoom({"r": 1})]\n\ntool: zoomed\n\nassistant: red'
    assert text["text"] == f"Q: Which colour ? | A: {completion} | S: red | O: ['red', 'blue']"
    assert request["temperature"] == 0.0 and request["max_tokens"] == 256 and request["model"] == "judge"
    assert values == [expected(text["text"])] and logged["judge_reply"] == [length_score(text["text"])]


def test_unknown_template_field_names_the_columns():
    with judge_server() as server:
        with pytest.raises(
            VLMGRPOError, match=r"template field \{answr\} is not a column .*did you mean 'answer'"
        ):
            score(judge(server.url, template="{answr}"), ["a"], answer=["x"])


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    "plan, attempts, failed",
    [
        pytest.param(["slow", "ok"], 2, False, id="timeout-then-retry"),
        pytest.param(["close", "ok"], 2, False, id="connection-closed-then-retry"),
        pytest.param(["500"], 3, True, id="5xx-retried-then-none"),
        pytest.param(["400"], 1, True, id="4xx-not-retried"),
    ],
)
def test_faults_are_retried_or_counted(plan, attempts, failed):
    with judge_server(plan=plan, slow_s=1.0) as server:
        values, logged = score(judge(server.url, timeout=0.3, retries=2, backoff=0.01), ["abcd", "ab"])
    assert len(server.requests) == 2 * attempts
    assert values == ([None, None] if failed else [0.4, 0.2])
    assert logged["judge/failures"] == (2.0 if failed else 0.0) and logged["judge/unparsed"] == 0.0
    assert logged["judge_reply"] == ([None, None] if failed else ["4", "2"])
    if plan[0] == "slow":
        assert logged["judge/latency"] >= 0.3


def test_garbage_reply_gives_no_reward_and_is_counted():
    with judge_server(plan=["garbage"]) as server:
        values, logged = score(judge(server.url), ["abcd", "ab", "abc"])
    assert values == [None, None, None] and len(server.requests) == 3  # not retried
    assert logged["judge/unparsed"] == 3.0 and logged["judge/failures"] == 0.0
    assert logged["judge_reply"] == [GARBAGE] * 3


def test_failed_requests_are_not_cached():
    with judge_server(plan=["500", "500", "ok"]) as server:
        reward = judge(server.url, retries=1, backoff=0.01)
        assert score(reward, ["abc"])[0] == [None]
        assert score(reward, ["abc"])[0] == [0.3]  # asked again: the third attempt answers
    assert len(server.requests) == 3


def test_unreachable_endpoint_stops_before_training(tmp_path, tiny_model):
    with judge_server() as server:
        url = server.url
    with pytest.raises(VLMGRPOError) as info:  # the server is gone: nothing listens on its port
        connect_rewards([judge(url, timeout=2)])
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"judge judge at {url}: cannot reach {url}/models")
    with judge_server() as server:
        with pytest.raises(VLMGRPOError, match="serves judge, not 'other'; set model"):
            connect_rewards(build_rewards([{"name": "judge", "url": server.url, "model": "other"}])[0])
        with pytest.raises(VLMGRPOError, match="JUDGE_TEST_KEY_UNSET .* is not set"):
            connect_rewards([judge(server.url, api_key_env="JUDGE_TEST_KEY_UNSET")])
    with pytest.raises(VLMGRPOError, match="judge missing_judge_folder: no such model folder"):
        connect_rewards(build_rewards([{"name": "judge", "model_path": "missing_judge_folder"}])[0])
    # the command: one line naming the judge, exit status 1, before the model loads
    rewards = [{"name": "judge", "url": url, "model": "judge", "timeout": 2}]
    config = write_train_yaml(
        tmp_path, tiny_model(DEFAULT_FAMILY), write_color_data(tmp_path / "data"), rewards=rewards
    )
    code = "from vlm_grpo.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "train", str(config)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"judge judge at {url}: cannot reach" in errors[0], proc.stderr[-2000:]


# --------------------------------------------------------------------------- throughput


def test_group_duplicates_are_judged_once_and_replies_cached():
    with judge_server() as server:
        reward = judge(server.url)
        completions = ["red", "red", "blue", "blue", "green", "red"]  # groups of 2 with identical completions
        values, logged = score(reward, completions, prompts=["p1", "p1", "p2", "p2", "p3", "p3"])
        assert len(server.requests) == 3  # the template reads the completion only: red, blue, green
        assert values == [expected(c) for c in completions]
        assert logged["judge/cache_hits"] == 3.0 and logged["judge/requests"] == 3.0
        values, logged = score(reward, ["blue", "purple"])
        assert len(server.requests) == 4 and logged["judge/cache_hits"] == 1.0
        assert "judge/latency" in logged
        values, logged = score(reward, ["blue", "purple"])
        assert (
            len(server.requests) == 4 and logged["judge/cache_hits"] == 2.0 and "judge/latency" not in logged
        )
        uncached = judge(server.url, cache_size=0)
        score(uncached, ["red", "red"])
        score(uncached, ["red"])
        assert len(server.requests) == 6  # one per batch: duplicates of a batch are still judged once


def test_concurrency_limit_is_respected():
    with judge_server(delay=0.2) as server:
        values, _ = score(judge(server.url, concurrency=3), [f"c{'x' * i}" for i in range(9)])
    assert server.most_in_flight == 3 and len(server.requests) == 9
    assert values == [expected(f"c{'x' * i}") for i in range(9)]


@pytest.mark.once  # the benchmark scripts' smoke runs: `make test` runs them, the floor does not
def test_benchmark_smoke():
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_judge.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rates = dict(line.split(":") for line in proc.stdout.splitlines() if line.startswith("completions/s"))
    assert set(rates) == {"completions/s concurrency 1", "completions/s concurrency 4"}
    assert float(rates["completions/s concurrency 4"]) > float(rates["completions/s concurrency 1"])


# --------------------------------------------------------------------------- a judge in the process


def build_tiny_judge(folder: Path, words: tuple[str, ...] = (), hidden_size: int = 64) -> Path:
    """A tiny random causal LM (Llama) with a chat template, whose output layer writes only the numbers 0 to 10 (the
    rows of every other token are zero, so that a number, a positive logit, wins over them); its embeddings are large
    next to what its layers add, so that its reply follows the last word of its input."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = TokenizerSpec(
        ["<|im_end|>", "<|endoftext|>"], {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    )
    tokenizer = build_word_tokenizer(spec, [*DIGITS, *words], TINY_TEMPLATE, base_words=ROLE_WORDS)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    numbers = tokenizer.convert_tokens_to_ids(list(DIGITS))
    with torch.no_grad():
        keep = torch.zeros(len(tokenizer), dtype=torch.bool)
        keep[numbers] = True
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 1.0)
        model.lm_head.weight[~keep] = 0.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_local_judge_reward_is_its_generation_parsed(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    words = ("red", "blue", "green", "yellow")
    folder = build_tiny_judge(tmp_path / "judge", words)
    (reward,), _ = build_rewards(
        [
            {
                "name": "judge",
                "model_path": str(folder),
                "template": "{completion}",
                "max_tokens": 1,
                "batch_size": 2,
            }
        ]
    )
    connect_rewards([reward])
    completions = ["red blue", "green red", "blue blue", "yellow green", "red blue"]
    values, logged = score(reward, completions)
    assert logged["judge/requests"] == 4.0 and logged["judge/cache_hits"] == 1.0
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    replies = []
    for text in completions:  # one at a time, no padding: the completions have the same length
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **ids, max_new_tokens=1, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        replies.append(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    assert logged["judge_reply"] == replies
    assert values == [parse_score(r) for r in replies]
    assert len(set(values)) > 1  # the reply follows the completion


# --------------------------------------------------------------------------- training


def test_training_logs_the_judges_mean(tiny_model, tmp_path):
    from vlm_grpo import VLMGRPOTrainer

    with judge_server() as server:
        rewards, weights = build_rewards(
            [{"name": "judge", "url": server.url, "model": "judge", "template": "{completion}"}]
        )
        connect_rewards(rewards)
        args = grpo_args(tmp_path, reward_weights=weights, log_samples_steps=1, max_completion_length=6)
        trainer = VLMGRPOTrainer(
            tiny_model(DEFAULT_FAMILY), rewards, args=args, train_dataset=color_dataset(8)
        )
        trainer.train()
    means = [e["rewards/judge/mean"] for e in trainer.state.log_history if "rewards/judge/mean" in e]
    assert len(means) == 2
    for step, mean in enumerate(means, start=1):
        groups = [
            json.loads(line)
            for line in (tmp_path / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        completions = [c for group in groups for c in group["completions"]]
        rewards = [r for group in groups for r in group["rewards"]["judge"]]
        assert rewards == pytest.approx([expected(c) for c in completions])  # float32 in the log
        # the sample log keeps each reply next to the completion it scored
        replies = [r for group in groups for r in group["logged"]["judge_reply"]]
        assert replies == [length_score(c) for c in completions]
        assert mean == pytest.approx(sum(expected(c) for c in completions) / len(completions))
    history = {k for e in trainer.state.log_history for k in e}
    assert {"judge/latency", "judge/failures", "judge/unparsed", "judge/cache_hits"} <= history
    # the sample table keeps the last rollout's replies next to its completions
    assert list(trainer._logs["extra"]["judge_reply"]) == [length_score(c) for c in completions]


def test_eval_scores_with_the_judge(tiny_model, tmp_path):
    from vlm_grpo.cli.evaluate import evaluate

    data = write_color_data(tmp_path / "data")
    with judge_server() as server:
        spec = {"name": "judge", "url": server.url, "model": "judge", "template": "{completion}"}
        report = evaluate(
            tiny_model(DEFAULT_FAMILY), str(data), rewards=["choice_accuracy", spec], max_new_tokens=3
        )
    texts = [user_text(request) for request in server.requests]
    assert report["n"] == 8 and 1 <= len(texts) <= 8  # identical completions are judged once
    assert set(report["rewards"]) == {"choice_accuracy", "judge"}
    scores = [expected(t) for t in texts]  # the mean of the 8 completions' scores, each one of these
    assert min(scores) - 1e-6 <= report["rewards"]["judge"] <= max(scores) + 1e-6
