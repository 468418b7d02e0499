"""Faults injected for real into running trainings, and what survives them.

- A reward that raises on one rank of a 2-process DDP run (`dist_helpers.failing_reward`): every rank stops within
  the test's timeout with the one-line error naming the reward and the record, and the last complete checkpoint
  stays intact and is the one resume picks.
- A checkpoint write that fails: the run lowers its own file-size limit (`ulimit -f`, `RLIMIT_FSIZE`) from inside
  (`dist_helpers.file_size_limit_reward`) after its first checkpoint, so that writing the second one fails with
  EFBIG, as on a full disk; the run stops with one line naming the folder, and resume picks the first checkpoint.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import (
    BIN,
    ROOT,
    changed_weights,
    free_port,
    launch,
    launch_env,
    load_state,
    write_config,
    write_data,
)

from vlm_grpo.testing import DEFAULT_FAMILY
from vlm_grpo.trainer.checkpoints import is_complete, latest_checkpoint, resolve_resume

# The fault is injected in the step that starts at global step 2, after checkpoint-2 was written.
FAIL_STEP = 2
# Seconds: a rank left waiting for the failed one would be killed here and fail the test (gloo's own timeout, 30
# minutes, would stop it much later); the bound is wide because 2 busy CPU cores make a 4-step run take minutes.
FAIL_TIMEOUT = 300


def check_last_checkpoint_intact(out: Path, model: str) -> None:
    """checkpoint-2 is complete, is what resume picks, and loads with every weight; nothing later is complete."""
    checkpoint = out / "checkpoint-2"
    assert is_complete(checkpoint), sorted(p.name for p in checkpoint.iterdir())
    assert latest_checkpoint(out) == resolve_resume("true", out) == str(checkpoint)
    assert not any(is_complete(p) for p in out.glob("checkpoint-*") if p != checkpoint)
    assert load_state(checkpoint)["global_step"] == 2
    changed = changed_weights(model, checkpoint)
    assert not changed["missing"] and changed["language"], changed


@pytest.mark.distributed
def test_reward_raising_on_one_rank_stops_every_rank_with_one_line(tiny_model, tmp_path):
    model = tiny_model(DEFAULT_FAMILY)
    data = write_data(tmp_path / "data", ["image"] * 8)
    config = write_config(tmp_path, model, data, rewards=["dist_helpers.failing_reward"], max_steps=4)
    env = launch_env(tmp_path, VLM_GRPO_FAIL_RANK="1", VLM_GRPO_FAIL_STEP=str(FAIL_STEP))
    cmd = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
    cmd += ["-m", "vlm_grpo.train", str(config)]
    run = launch(cmd, env, tmp_path / "launch.log", timeout=FAIL_TIMEOUT)

    assert not run.timed_out, "a rank hung after the reward failed on the other one\n" + run.tail()
    assert run.returncode != 0, run.tail()
    errors = [line for line in run.log.splitlines() if line.startswith("vlm-grpo train: error:")]
    message = r"reward '[\w.]*failing_reward' raised RuntimeError on record \d+ \(id=\d+.*reward service unreachable"
    # The failing rank names the record; the other rank stops with the same line, marked as another process's.
    assert len(errors) == 2, run.tail()
    assert any(re.search(message, e) and "(on another process)" not in e for e in errors), errors
    assert any(re.search(message, e) and "(on another process)" in e for e in errors), errors
    assert "RewardError" not in run.log, run.tail()  # reported as a line, not as a traceback
    check_last_checkpoint_intact(tmp_path / "run", model)


@pytest.mark.parametrize(
    ("written", "limit"),
    [("model weights (safetensors)", 64 * 1024), ("optimizer state (torch.save)", None)],
)
def test_failing_checkpoint_write_stops_with_one_line_and_keeps_the_last_checkpoint(
    tiny_model, tmp_path, written, limit
):
    model = tiny_model(DEFAULT_FAMILY)
    if limit is None:  # between the weights' size and the optimizer state's (Adam keeps 2 values per weight)
        limit = int((Path(model) / "model.safetensors").stat().st_size * 1.5)
    data = write_data(tmp_path / "data", ["image"] * 8)
    config = write_config(
        tmp_path,
        model,
        data,
        rewards=["dist_helpers.file_size_limit_reward"],
        max_steps=4,
        log_samples_steps=0,
    )
    env = launch_env(tmp_path, VLM_GRPO_FSIZE_STEP=str(FAIL_STEP), VLM_GRPO_FSIZE_BYTES=str(limit))
    # Pipes, not a log file: the file-size limit applies to every regular file the run writes.
    run = subprocess.run(
        [sys.executable, "-m", "vlm_grpo.train", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=FAIL_TIMEOUT,
    )
    out = tmp_path / "run"
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"vlm-grpo train: error: Cannot write checkpoint {out / 'checkpoint-4'}:"), (
        written,
        run.stderr[-3000:],
    )
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    check_last_checkpoint_intact(out, model)
