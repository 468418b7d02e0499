"""Real vLLM (TRL's colocate mode) with tools whose results are images and an environment, on each family whose
template calls tools.

Each family runs in a fresh process (`vllm_tools_worker.py`): 2 training steps in which vLLM samples every turn, then
one turn after a tool's image that vLLM samples and the trainer scores. TRL's tool loop hands vLLM each history with
its image placeholders expanded, which vLLM's processor expands again; the trainer hands it one placeholder per image
(`ModelFamily.vllm_history_ids`), which vLLM expands into exactly the row the trainer trains on. The same run with a
`trl vllm-serve` is in `test_vllm_server.py`. Run with
`make test-vllm` (vLLM's CPU backend in `.venv-vllm`), or `pytest -m vllm` where vLLM is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_vllm import SYNC_TOLERANCE, run_worker

from vlm_grpo.testing import families_with

pytestmark = pytest.mark.vllm


def run_tools_worker(family: str, out: Path, *mode: str) -> dict:
    """Run `vllm_tools_worker.py` for one family in a fresh process (colocate mode, or `"server", PORT`)."""
    return run_worker(family, out, *mode, worker="vllm_tools_worker.py")


def tool_run_checks(result: dict) -> None:
    """Training: vLLM sampled the calls (where its structured outputs can write them), the tool's image came back,
    and no call failed; each prompt held its environment's `reset` observation, and the environment's `get_reward`
    was a reward."""
    steps = [e for e in result["log_history"] if "loss" in e]
    assert len(steps) == 2 and (
        any(e["tools/call_frequency"] > 0 for e in steps) or not result["call_is_text"]
    )
    assert all(e["tools/failure_frequency"] == 0 for e in steps), steps
    assert all("rewards/Canvas/mean" in e for e in steps), steps
    assert result["prompts"] and all("The square is" in p for p in result["prompts"]), result["prompts"]
    assert result["images_in_row"] == 2 and result["placeholders"] > 2


@pytest.mark.parametrize("family", families_with(tool_calls=True, moe=False))
def test_tool_turns_sampled_by_vllm_see_the_rows_images(family, tmp_path):
    result = run_tools_worker(family, tmp_path)
    tool_run_checks(result)
    # The turn after a tool's image: vLLM expands the row it is handed into the trained row (both images in place),
    # where the row as TRL hands it would be expanded again; its sampling log-probs are the trainer's.
    assert result["expanded_as_trained"], result
    assert result["expanded_again"] > 0, result
    assert result["tokens"] > 0 and result["sampled_gap"] < SYNC_TOLERANCE, result
