"""Real vLLM in TRL's server mode: `trl vllm-serve` started on a loopback port, the trainer generating through it.

One module run builds a tiny model of the first family vLLM implements whose template calls tools, starts
`trl vllm-serve` on 127.0.0.1 (a free port) as its own process group, waits for its `/health`, trains 2 steps with
`vllm_mode="server"` in a fresh process (`vllm_worker.py ... server PORT`), then 2 more with a tool that returns
images and an environment (`vllm_tools_worker.py ... server PORT`), and stops the server (SIGTERM, then SIGKILL to
its process group after a timeout).
On vLLM's CPU backend, the weight sync runs over gloo in place of vLLM's NCCL weight transfer, and the server's linear
layers keep plain weights: `vlm_grpo.rollout.vllm.cpu_transfer`, which the trainer installs in its process and vLLM
loads into the server's as a plugin this package declares; everything else is the real `trl vllm-serve`, vLLM server
and TRL client.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_vllm import (
    FAMILIES,
    STEP_TOLERANCE,
    SYNC_TOLERANCE,
    TESTS,
    free_port,
    implemented_by_vllm,
    run_worker,
)
from test_vllm_tools import run_tools_worker, tool_run_checks

from vlm_grpo.testing import families_with

pytestmark = pytest.mark.vllm

STARTUP_TIMEOUT = 300  # about 35 to 60 s on 2 CPU cores
STOP_TIMEOUT = 60
COMPLETIONS = 2 * 4  # 2 steps of 4 rows (2 prompts, num_generations=2); vLLM counts each sample as a request


@dataclass
class Server:
    """A `trl vllm-serve` process, leader of its own process group.

    Args:
        process (`subprocess.Popen`): the server (`trl vllm-serve` replaces itself with `vllm serve`).
        port (`int`): the loopback port it serves on.
        log (`Path`): its stdout and stderr.
    """

    process: subprocess.Popen
    port: int
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def group_alive(self) -> bool:
        """Whether any process of the server's process group (its engine processes included) is still running."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(
                f"trl vllm-serve exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(server.url("/health"), timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise AssertionError(f"trl vllm-serve not healthy after {STARTUP_TIMEOUT} s:\n{server.log_tail()}")


def stop(server: Server) -> None:
    """SIGTERM to the server (vLLM shuts its engine processes down), SIGKILL to its whole group after a timeout."""
    if server.process.poll() is None:
        server.process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and (server.process.poll() is None or server.group_alive()):
        time.sleep(0.5)
    if server.group_alive():
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=STOP_TIMEOUT)


@contextmanager
def vllm_serve(model: Path, folder: Path) -> Iterator[Server]:
    """Run `trl vllm-serve` for `model` on a free loopback port while the context is open.

    Args:
        model (`Path`): the model folder to serve.
        folder (`Path`): where the server's log is written.

    Yields:
        `Server`: once its `/health` answers.
    """
    path = [str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    port = free_port()
    trl = Path(sys.executable).parent / "trl"
    command = [str(trl), "vllm-serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    # the tools run's context, as its colocate engine
    command += ["--max_model_len", "1024", "--max-num-batched-tokens", "4096"]
    log = folder / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(process, port, log)
    try:
        wait_healthy(server)
        yield server
    finally:
        stop(server)


@pytest.fixture(scope="module")
def server_runs(tmp_path_factory) -> tuple[dict, dict, dict, dict]:
    """One server and four server-mode training runs on it, shared by the tests of this module: a plain one
    (`vllm_worker.py`), one with a tool that returns images and an environment (`vllm_tools_worker.py`), a
    `vlm-grpo train` run during which the server is killed (`run_until_the_server_dies`), and one with
    `async_rollouts` and a LoRA adapter (`vllm_worker.py ... server-async`)."""
    from vlm_grpo.testing import build_tiny_model

    shape = next(s for s in FAMILIES if s in families_with(tool_calls=True) and implemented_by_vllm(s))
    out = tmp_path_factory.mktemp(shape)
    build_tiny_model(shape, out / "model", hidden_size=256)
    with vllm_serve(out / "model", out) as server:
        result = run_worker(shape, out, "server", str(server.port))
        tools_result = run_tools_worker(shape, out, "server", str(server.port))
        (out / "async").mkdir()
        (out / "async" / "model").symlink_to(out / "model")  # the model the server serves
        asynchronous = run_worker(shape, out / "async", "server-async", str(server.port))
        killed = run_until_the_server_dies(server, out / "model", out / "killed")
    return result | {"server": server}, tools_result, killed, asynchronous


def run_until_the_server_dies(server: Server, model: Path, folder: Path) -> dict:
    """`vlm-grpo train` with `vllm_mode: server` and a checkpoint every step; once the first checkpoint is complete,
    the whole server (its process group) is killed. Returns the command's exit status and error output, and the
    checkpoints left."""
    from dist_helpers import write_config, write_data

    from vlm_grpo.trainer.checkpoints import COMPLETE_MARKER

    folder.mkdir()
    config = write_config(
        folder, str(model), write_data(folder / "data", ["image"] * 8),
        use_vllm=True, vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{server.port}",
        vllm_group_port=free_port(), max_steps=40, save_steps=1, max_completion_length=4,
    )  # fmt: skip
    code = "from vlm_grpo.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with (folder / "train.log").open("w") as log:
        train = subprocess.Popen(
            [sys.executable, "-c", code, "train", str(config)],
            env=env,
            stdout=log,
            stderr=subprocess.PIPE,
            text=True,
        )
    first = folder / "run" / "checkpoint-1" / COMPLETE_MARKER
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not first.exists() and train.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(server.process.pid, signal.SIGKILL)
    try:
        _, stderr = train.communicate(timeout=STARTUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        train.kill()
        _, stderr = train.communicate()
        stderr += "\n(killed at the timeout: the run hung)"
    checkpoints = sorted(p.name for p in (folder / "run").glob("checkpoint-*"))
    complete = [name for name in checkpoints if (folder / "run" / name / COMPLETE_MARKER).exists()]
    return {
        "returncode": train.returncode,
        "stderr": stderr,
        "checkpoints": checkpoints,
        "complete": complete,
    }


@pytest.fixture(scope="module")
def server_run(server_runs) -> dict:
    return server_runs[0]


def test_server_generates_for_the_trainer(server_run):
    """The trainer builds no engine: every completion it trained on was sampled by the server."""
    assert server_run["local_engine"] is False
    assert server_run["server_requests"] == COMPLETIONS
    steps = [log for log in server_run["log_history"] if "loss" in log]
    trained_tokens = sum(log["completions/mean_length"] * COMPLETIONS / len(steps) for log in steps)
    assert server_run["server_generation_tokens"] == pytest.approx(trained_tokens)


def test_weight_sync_reaches_the_server(server_run):
    """After a step, the server scores a completion as the trainer does once the weights are synced, not before.

    Scored with the images encoded again after the sync (the server's encoder cache emptied): the weights, vision
    tower included, reached the server. Whether the trainer's sync empties that cache is the next test.
    """
    assert server_run["after_encoder_reset"] < SYNC_TOLERANCE
    assert server_run["before_sync"] > 2 * server_run["after_encoder_reset"]


def test_weight_sync_empties_the_server_encoder_cache(server_run):
    """As the trainer leaves the server after a sync, its images are encoded by the synced vision tower.

    The server reuses the features it computed for an image it has seen; TRL's sync resets only its prefix cache,
    and the trainer empties the encoder cache too (`POST /reset_encoder_cache`). Emptying it by hand after the
    trainer's sync then changes nothing.
    """
    assert server_run["stale_image_features"] < 1e-3
    assert server_run["after_sync"] < SYNC_TOLERANCE


def test_importance_sampling_reads_server_logps(server_run):
    """TRL's `sampling/*` metrics (correction on, TRL's default) from the server's log-probs."""
    steps = [log for log in server_run["log_history"] if "loss" in log]
    assert len(steps) == 2
    for log in steps:
        assert (
            0 < log["sampling/sampling_logp_difference/mean"] <= log["sampling/sampling_logp_difference/max"]
        )
        assert log["sampling/sampling_logp_difference/max"] < STEP_TOLERANCE
        low, mean, high = (log[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "mean", "max"))
        assert math.exp(-4 * STEP_TOLERANCE) < low <= mean <= high < math.exp(4 * STEP_TOLERANCE)
        assert not low == high == 1.0  # from the server's log-probs, not the trainer's
        assert math.isfinite(log["loss"])
        # a step whose groups all tie (each group's completions the same length; the server's sampling varies from
        # run to run) has no advantage and no gradient; any other step has one. That training moved the weights is
        # `test_weight_sync_reaches_the_server`'s check.
        assert log["grad_norm"] > 0 or log["frac_reward_zero_std"] == 1.0, str(log)


def test_server_is_stopped(server_run):
    """The server and its engine processes are gone once the run ends."""
    server = server_run["server"]
    assert server.process.returncode is not None
    assert not server.group_alive()


def test_a_server_that_dies_stops_the_run_in_one_line(server_runs):
    """The server killed mid-run: `vlm-grpo train` stops with one line naming the server and the step (after the
    client's own retries), exits non-zero, and leaves its complete checkpoints as they were."""
    killed = server_runs[2]
    lines = [line for line in killed["stderr"].splitlines() if line.strip()]
    assert killed["returncode"] == 1, killed["stderr"][-4000:]
    assert lines[-1].startswith("vlm-grpo train: error: The vLLM server at http://127.0.0.1:"), lines[-3:]
    assert "stopped answering during" in lines[-1] and "resume_from_checkpoint: true" in lines[-1]
    step = int(lines[-1].split(" for step ")[1].split()[0])
    assert step >= 2 and "checkpoint-1" in killed["complete"], killed
    assert killed["complete"] == [c for c in killed["checkpoints"] if int(c.split("-")[1]) < step], killed


def test_async_rollouts_train_on_batches_the_server_sampled_ahead(server_runs):
    """`async_rollouts` with dynamic sampling and a LoRA adapter, 4 steps: every row sampled was trained, set aside by
    dynamic sampling, or sampled ahead of a step the run did not reach (none dropped: the weights went to the server
    before each batch was taken), each batch at most `max_staleness` (1) step older than the trainer's weights, the
    server's sampling log-probs corrected by TRL's importance sampling, and the server scoring as the adapted model
    after the last sync, not the base one (a LoRA update changes what the server samples)."""
    result = server_runs[3]
    counts = result["counts"]
    total = counts["trained"] + counts["filtered"] + counts["dropped"] + counts["unused"]
    assert counts["sampled"] == total, counts
    assert counts["trained"] == 4 * 4 and counts["dropped"] == 0, counts  # 4 steps of 4 rows
    steps = [log for log in result["log_history"] if "loss" in log]
    assert len(steps) == 4 and all(math.isfinite(log["loss"]) for log in steps)
    # dynamic sampling's rounds ran on the thread: the groups they set aside are the rows counted as filtered
    dropped_groups = sum(log["dynamic_sampling/groups_dropped"] for log in steps)
    assert counts["filtered"] == 2 * dropped_groups, (counts, steps)  # groups of 2
    # the first batch is sampled before any step; a later one is sampled while the step before it trains (one step
    # old), or with the newest weights when the thread starts it only after that step's sync (a race the design
    # allows: fresher, never staler)
    staleness = [log["async/staleness_max"] for log in steps]
    assert staleness[0] == 0.0 and all(s in (0.0, 1.0) for s in staleness) and 1.0 in staleness, steps
    assert all(log["async/rows_dropped_stale"] == 0 for log in steps)
    # the first batch was sampled with the trainer's own weights; a later one mostly one step earlier, which the
    # importance-sampling ratio (TRL's correction) weights
    assert steps[0]["sampling/sampling_logp_difference/max"] < STEP_TOLERANCE
    ratios = [log["sampling/importance_sampling_ratio/mean"] for log in steps]
    assert all(math.isfinite(r) and r > 0 for r in ratios), ratios
    assert result["after_sync"] < SYNC_TOLERANCE and result["base_gap"] > 3 * result["after_sync"], result


def test_tool_turns_sampled_by_the_server_see_the_rows_images(server_runs):
    """Tools whose results are images, and an environment, with a vLLM server: the server samples every turn from
    the row's processor-expanded ids, each image's features placed on its run of image tokens (as the first turn's
    prompts), and its sampling log-probs of a turn after a tool's image are the trainer's."""
    result = server_runs[1]
    tool_run_checks(result)
    assert result["tokens"] > 0 and result["sampled_gap"] < SYNC_TOLERANCE, result
