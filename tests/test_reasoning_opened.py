"""Templates whose generation prompt opens the reasoning block (`<think>` at its end, as Qwen3.5 4B and larger): the
model's text holds `</think>` but not `<think>`, and the built-in rewards read it with `<think>` put back in front.

The trainer decides it once from its template (`ModelFamily.completions_open_in_reasoning`) and adds
`reasoning_opened` to the rewards' arguments; stock TRL passes the completions alike and no such argument.
"""

from __future__ import annotations

import pytest
import torch
from conftest import color_rows, grpo_args
from datasets import Dataset

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.rewards.choice import choice_accuracy
from vlm_grpo.rewards.formatting import format_reward
from vlm_grpo.rewards.mathematics import geo3k
from vlm_grpo.rewards.text import REASONING_OPENED
from vlm_grpo.testing import families_with, tiny_family

REASONED = "the square is red\n</think>\n<answer>red</answer>"  # as the model writes it after `<think>\n`


def conversational(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_rewards_read_the_opened_reasoning():
    completions = [conversational(REASONED), conversational("<think>\n" + REASONED)]
    assert format_reward(completions) == [0.0, 1.0]  # without the argument: the text as it is
    # opened by the prompt: the first reads as a whole block; the second opens a second block, which is malformed
    assert format_reward(completions, **{REASONING_OPENED: [True, True]}) == [1.0, 0.0]
    boxed = [conversational("x + 1 = 4\n</think>\nso \\boxed{3}")]
    assert geo3k(boxed, ["3"]) == [0.9]  # the answer, but not the format
    assert geo3k(boxed, ["3"], **{REASONING_OPENED: [True]}) == [1.0]
    # an answer without tags: the reasoning before `</think>` is not read as the answer
    unwrapped = [conversational("maybe green\n</think>\nred")]
    options = [["red", "green"]]
    assert choice_accuracy(unwrapped, ["red"], options=options, **{REASONING_OPENED: [True]}) == [1.0]


def opening_and_not() -> list[str]:
    """Two tiny families: one whose template opens the reasoning in the generation prompt, one whose does not."""
    families = families_with()
    opening = [f for f in families if tiny_family(f).layout and tiny_family(f).layout.thinking_prompt]
    plain = [f for f in families if tiny_family(f).layout and not tiny_family(f).layout.thinking_prompt]
    return [opening[0], plain[0]]


def count(word: str) -> str:
    """Count the letters of a word.

    Args:
        word: the word.
    """
    return str(len(word))


def format_scores(path: str, tmp_path, tools=None, **options) -> list[float]:
    """The trainer's `format` reward of `REASONED`, for one batch of two rows."""
    trainer = VLMGRPOTrainer(
        path, format_reward, args=grpo_args(tmp_path, **options), train_dataset=Dataset.from_list(color_rows(4)),
        tools=tools,
    )  # fmt: skip
    inputs = color_rows(2)
    prompts = [x["prompt"] for x in inputs]
    completions = [conversational(REASONED)] * 2
    return trainer._calculate_rewards(inputs, prompts, completions, [[0], [0]])[:, 0].tolist()


@pytest.mark.parametrize("family", opening_and_not())
def test_the_trainer_tells_the_rewards_where_the_template_opens_the_reasoning(family, tiny_model, tmp_path):
    path = tiny_model(family)
    opens = bool(tiny_family(family).layout.thinking_prompt)
    assert format_scores(path, tmp_path) == ([1.0, 1.0] if opens else [0.0, 0.0])
    if opens:  # the template's own switch: with thinking off, the prompt closes an empty block instead
        off = format_scores(path, tmp_path, chat_template_kwargs={"enable_thinking": False})
        assert off == [0.0, 0.0]
        # with tools, TRL's response parser splits the reasoning out of each completion (`reasoning_content`)
        assert format_scores(path, tmp_path, tools=[count]) == [0.0, 0.0]


def test_the_rows_of_the_batch_are_left_as_they_were(tiny_model, tmp_path):
    path = tiny_model(opening_and_not()[0])
    trainer = VLMGRPOTrainer(
        path, format_reward, args=grpo_args(tmp_path), train_dataset=Dataset.from_list(color_rows(4))
    )
    inputs = color_rows(2)
    keys = [set(x) for x in inputs]
    rewards = trainer._calculate_rewards(
        inputs, [x["prompt"] for x in inputs], [conversational(REASONED)] * 2, [[0]] * 2
    )
    assert torch.equal(rewards, torch.ones(2, 1))
    assert [set(x) for x in inputs] == keys
