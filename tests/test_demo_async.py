"""`vlm-grpo demo --async_rollouts`: the colour demo against a local `trl vllm-serve`, sampled ahead on its own core.

A real server (`vlm_grpo.rollout.vllm.local_server.LocalServer`) serves the demo's model on the last core while the
demo trains on the other, with `async_rollouts` and the demo's dynamic sampling; the weights reach it over gloo after
every step. The full run's held-out scores over three seeds are in docs/demos.md; here a short run checks the
machinery: the server answered generations and weight updates, the run trained and was scored, and the server is gone
once the demo ends, after its last step or on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlm_grpo.runtime.preemption import EXIT_PREEMPTED
from vlm_grpo.trainer.checkpoints import is_complete

pytestmark = pytest.mark.vllm


def test_the_colour_demo_trains_against_a_local_server_and_stops_it(tmp_path):
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "vlm_grpo", "demo", "--async_rollouts", "--max_steps", "30",
               "--output_dir", str(out)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # the demo binds its server to its last core
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "GRPO: 30 steps in" in done.stdout and "colour: held-out accuracy start" in done.stdout, (
        done.stdout
    )
    server_log = (out / "vllm-server.log").read_text()
    # every batch sampled on the server, with dynamic sampling's refill rounds; the weights sent before each batch
    assert server_log.count('"POST /inference/v1/generate HTTP/1.1" 200') >= 30
    assert server_log.count('"POST /finish_weight_update HTTP/1.1" 200') == 30
    assert "Application shutdown complete" in server_log  # stopped when the demo ended
    state = json.loads((out / "model" / "trainer_state.json").read_text())
    steps = [log for log in state["log_history"] if "async/staleness_max" in log]
    assert steps and all(log["async/staleness_max"] <= 1 for log in steps), steps
    assert json.loads((out / "eval_after.json").read_text())["n"] == 64


def test_sigterm_during_an_asynchronous_run_checkpoints_and_stops_the_thread_and_the_server(tmp_path):
    """SIGTERM while the thread samples ahead: the step finishes, a complete checkpoint is written, the demo exits with
    `EXIT_PREEMPTED` without evaluating (the sampling thread stopped once its batch was sampled), and the server does
    not outlive it (the batches sampled ahead are not in the checkpoint: docs/async.md says what a resumed run then
    does)."""
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "vlm_grpo", "demo", "--async_rollouts", "--max_steps", "400",
               "--output_dir", str(out)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 600
    while not (out / "model").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(5)  # a few steps in: the thread is sampling ahead
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == EXIT_PREEMPTED, stderr[-3000:]
    found = re.search(r"GRPO stopped after step (\d+) of 400 with a complete checkpoint (\S+);", stderr)
    assert found, stderr[-3000:]
    assert is_complete(Path(found.group(2))) and not (out / "eval_after.json").exists()
    assert "Traceback" not in stderr
    assert "Application shutdown complete" in (out / "vllm-server.log").read_text()  # the server was stopped
