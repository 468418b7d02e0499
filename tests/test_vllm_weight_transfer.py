"""Server mode's weight transfer on a CPU (`vlm_grpo.rollout.vllm.cpu_transfer`): a broadcast whose receiver is gone.

Gloo does not always notice that the server died while the trainer's broadcast waits for it: the broadcast would
wait out gloo's timeout (5 minutes), and the process's exit would wait as long again. Here two real processes join
the weight-transfer group through vLLM's rendezvous, as the trainer and a server's worker do; the worker never
receives, and the server's `/health` refuses connections (a loopback port nobody listens on): the trainer's
broadcast stops with the probe's error within seconds, and its process exits at once.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time

import pytest
from dist_helpers import free_port

pytestmark = pytest.mark.vllm

TRAINER = """
import sys, time
from functools import partial
import requests, torch
from vlm_grpo.rollout.vllm.cpu_transfer import broadcast_producer, server_alive, trainer_init
init_info = {"master_address": "127.0.0.1", "master_port": int(sys.argv[1]), "world_size": 2}
group = trainer_init(init_info, peer_alive=partial(server_alive, sys.argv[2]))
print("joined", flush=True)
start = time.monotonic()
try:  # 64 MiB: more than the sockets hold, so the send waits for the receiver
    broadcast_producer(iter([("w", torch.ones(1 << 26, dtype=torch.uint8))]), group, 0, lambda item: item[1])
except requests.exceptions.ConnectionError as error:
    print(f"stopped after {time.monotonic() - start:.1f} s: {error}", flush=True)
    sys.exit(3)
"""
WORKER = """
import sys, time
from vlm_grpo.rollout.vllm.cpu_transfer import _join
group = _join("127.0.0.1", int(sys.argv[1]), 1, 2)
print("joined", flush=True)
time.sleep(600)
"""


def test_a_broadcast_to_a_server_that_stopped_answering_stops_and_the_process_exits():
    port, dead = free_port(), f"http://127.0.0.1:{free_port()}"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(port), dead],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        start = time.monotonic()
        output, _ = trainer.communicate(timeout=120)  # gloo's own timeout is 300 s
        took = time.monotonic() - start
    finally:
        trainer.kill()
        worker.kill()
        worker.communicate()
    assert trainer.returncode == 3, output[-3000:]
    line = next(line for line in output.splitlines() if line.startswith("stopped after"))
    assert float(line.split()[2]) < 10, line  # the probe runs every 2 s
    assert "/health" in line and "Connection refused" in line, line
    assert took < 60, (took, output[-3000:])  # joined, stopped, and exited: not a 300 s wait at exit


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_server_that_answers_passes_the_probe_and_one_that_is_gone_does_not():
    import requests

    from vlm_grpo.rollout.vllm.cpu_transfer import server_alive

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        server_alive(f"http://127.0.0.1:{server.server_address[1]}")  # raises nothing
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(requests.exceptions.ConnectionError, match="/health"):
        server_alive(f"http://127.0.0.1:{free_port()}")
