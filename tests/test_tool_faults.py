"""Tools and environments that hang or raise: the call or the row fails, never the run.

`tool_timeout` bounds each call, sync or async (TRL has no bound): a call still running then is reported to the model
as a failed call and counted in `tools/failure_frequency` and `tools/timeout_frequency`. An environment whose
`reset()` raises fails its row only: the row gets no reward, so it does not train, and one log line names it. The
tools here really hang (`time.sleep`, `asyncio.sleep`) or raise; the tiny tool-calling model is led to call them by
`generation_kwargs`' `sequence_bias` (see `test_tools.calls_bias`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import pytest
import torch
from conftest import color_rows
from datasets import Dataset
from test_tools import COMMON, TOOLS_FAMILY, calls_bias, family_model, turns_reward

from vlm_grpo import VLMGRPOConfig, VLMGRPOTrainer
from vlm_grpo.errors import VLMGRPOError

HANG = 60.0  # seconds a hanging tool would take: far past the timeout and the test's own time


def zoom(region: int) -> str:
    """Show one quarter of the image, enlarged.

    Args:
        region: the quarter, 0 to 3.
    """
    time.sleep(HANG)
    return f"quarter {region}"


async def azoom(region: int) -> str:
    """Show one quarter of the image, enlarged.

    Args:
        region: the quarter, 0 to 3.
    """
    await asyncio.sleep(HANG)
    return f"quarter {region}"


def broken(region: int) -> str:
    """Show one quarter of the image, enlarged.

    Args:
        region: the quarter, 0 to 3.
    """
    raise RuntimeError(f"region {region} is out of the picture")


@pytest.fixture(scope="module")
def tools_model(tiny_model):
    """`(path, processor, placeholders)` of a tool-calling family's tiny model."""
    return family_model(tiny_model, TOOLS_FAMILY)


def rollout(tools_model, tmp_path, tools, name: str, environment_factory=None, **options):
    """One rollout of two groups (red, green; two rows each), most rows led to call `name`."""
    path, processor, placeholders = tools_model
    args = VLMGRPOConfig(
        output_dir=str(tmp_path), **{**COMMON, "max_steps": 1, **options},
        generation_kwargs={
            "suppress_tokens": placeholders,
            "sequence_bias": calls_bias(processor, (name, {"region": 2}), start=4.0),
        },
    )  # fmt: skip
    trainer = VLMGRPOTrainer(
        path, turns_reward, args=args, train_dataset=Dataset.from_list(color_rows(8)), tools=tools,
        environment_factory=environment_factory,
    )  # fmt: skip
    trainer.model.train()
    torch.manual_seed(0)
    started = time.monotonic()
    trainer._generate_and_score_completions([r for r in color_rows(2) for _ in range(2)])
    return trainer, time.monotonic() - started


@pytest.mark.parametrize("tool", [zoom, azoom], ids=["sync", "async"])
def test_a_tool_that_hangs_is_a_failed_call_after_tool_timeout(tool, tools_model, tmp_path):
    """A tool that would take a minute answers `{"error": ...}` after `tool_timeout` (1 s), counted as a failure and a
    timeout; the rollout goes on to the next turn."""
    trainer, seconds = rollout(tools_model, tmp_path, [tool], tool.__name__, tool_timeout=1.0)
    results = [m for c in trainer._logs["completion"] for m in c if m["role"] == "tool"]
    assert results, "most rows were led to call the tool"
    assert all("did not answer within tool_timeout (1 s)" in str(m["content"]) for m in results), results
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("tools/")}
    assert metrics["tools/failure_frequency"] == 1.0 and metrics["tools/timeout_frequency"] == 1.0, metrics
    assert seconds < HANG / 2  # the calls did not wait for the tool


def test_a_tool_that_raises_is_a_failed_call_without_a_timeout(tools_model, tmp_path):
    """An exception is reported to the model as TRL reports it, counted as a failure and not as a timeout."""
    trainer, _ = rollout(tools_model, tmp_path, [broken], "broken", tool_timeout=5.0)
    results = [m for c in trainer._logs["completion"] for m in c if m["role"] == "tool"]
    assert results and all("out of the picture" in str(m["content"]) for m in results), results
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("tools/")}
    assert metrics["tools/failure_frequency"] == 1.0 and metrics["tools/timeout_frequency"] == 0.0, metrics


class FussyCanvas:
    """An environment whose `reset` raises for green squares; its `look` tool names the colour."""

    def reset(self, solution: str, **row) -> str:
        if solution == "green":
            raise ValueError("no canvas for green")
        self.colour = solution
        return "The canvas is ready."

    def look(self, region: int) -> str:
        """Look at one quarter of the canvas.

        Args:
            region: the quarter, 0 to 3.
        """
        return f"quarter {region} is {self.colour}"


def test_an_environment_whose_reset_raises_fails_its_row_only(tools_model, tmp_path, caplog):
    """The green group's `reset` raises: one log line names each failed row and the error; those rows get no reward
    (NaN, TRL's None), the red group's rewards stand, and training goes on."""
    with caplog.at_level(logging.WARNING, logger="vlm_grpo.rollout.rollout"):
        trainer, _ = rollout(tools_model, tmp_path, None, "look", environment_factory=FussyCanvas)
    lines = [r.getMessage() for r in caplog.records if "reset raised" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines
    assert all("FussyCanvas.reset raised ValueError: no canvas for green" in line for line in lines)
    assert all("does not train" in line for line in lines)
    rewards = list(trainer._logs["rewards"]["turns_reward"])
    assert [math.isnan(r) for r in rewards] == [False, False, True, True], rewards
    assert list(trainer._logs["advantages"])[2:] == [0.0, 0.0]


def test_tool_timeout_must_be_positive(tmp_path):
    with pytest.raises(VLMGRPOError, match="tool_timeout must be a positive number of seconds, got 0"):
        VLMGRPOConfig(output_dir=str(tmp_path), tool_timeout=0, use_cpu=True)
