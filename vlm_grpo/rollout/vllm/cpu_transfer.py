"""Server mode on a CPU: the weight transfer of TRL's vLLM server mode over gloo, where NCCL cannot run.

In server mode (`vllm_mode: server`, `trl vllm-serve`) TRL's `VLLMClient` pushes the trainer's weights into the server
through vLLM's weight-transfer engine (`--weight-transfer-config '{"backend": "nccl"}'`, which `trl vllm-serve` sets):

1. `init_communicator` asks the server (`POST /init_weight_transfer_engine`) to join a process group with the trainer
   (rank 0, workers from rank 1) and joins it itself (`nccl_common.trainer_init`);
2. each sync, `update_named_params` sends the names, dtypes and shapes (`POST /update_weights`, between
   `/start_weight_update` and `/finish_weight_update`) and broadcasts the tensors packed into uint8 buffers
   (`packed_tensor.packed_nccl_broadcast_producer`); each worker's `NCCLWeightTransferEngine.receive_weights`
   receives the buffers (`packed_nccl_broadcast_consumer`), unpacks them and hands them to the model's
   `load_weights`, inside vLLM's layerwise reload.

The process group is NCCL (`PyNcclCommunicator`) and the packed broadcasts run on CUDA streams: none of that exists on
a CPU, and TRL refuses up front (`NotImplementedError: Weight synchronization runs on vLLM's NCCL weight-transfer
engine, which needs a CUDA device`). On vLLM's CPU backend, and only there, this module replaces exactly those
transport pieces with gloo, on both sides:

- the process group: a gloo group over the same `StatelessProcessGroup` rendezvous (same address, port, ranks and
  world size), in place of NCCL's;
- the packed broadcasts: the same chunks of vLLM's `pack_tensors` / `unpack_tensor` layout, broadcast with gloo, in
  place of NCCL on CUDA streams;
- TRL's device check: the trainer joins the group on the CPU (the check names the device NCCL would run on).

Everything else is the real code: TRL's client and its HTTP calls, `trl vllm-serve` and vLLM's OpenAI server, vLLM's
worker-side `NCCLWeightTransferEngine` (update info, layerwise reload, the model's `load_weights`), TRL's weight
metadata and iteration, and generation. On a GPU nothing is patched.

The trainer's side (`install_client`) is installed by `VLMGRPOTrainer` in server mode. The server's side
(`install_server`, with `cpu.keep_linear_weights_plain`: without it the sync completes, but the server's log-probs do
not follow the synced weights) is a vLLM general plugin that this package declares (entry point group
`vllm.general_plugins`, name `vlm_grpo_cpu_weight_transfer`): vLLM loads it in each of its processes (API server,
engine core, workers) when `vlm_grpo` is installed next to it, so `trl vllm-serve` on a CPU takes the trainer's
weights with no option to set.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch

TIMEOUT = timedelta(minutes=5)
"""How long gloo waits for a peer in one collective."""
PROBE_EVERY = timedelta(seconds=2)
"""How often a waiting broadcast on the trainer's side asks whether the server is still up."""


class GlooCommunicator:
    """A gloo process group standing in for vLLM's `PyNcclCommunicator` in the weight transfer.

    Gloo does not always notice a peer that died during a broadcast, which then waits out its timeout (`TIMEOUT`): a
    broadcast still waiting after `PROBE_EVERY` asks `peer_alive` (the trainer's side: the server's `/health`) every
    `PROBE_EVERY` and stops with the probe's error once the peer is gone.

    Args:
        group (`vllm.distributed.utils.StatelessProcessGroup`): the rendezvous the NCCL communicator would be built
            on; TRL's `close_communicator` clears its store and socket as it does for NCCL's.
        peer_alive (`Callable[[], None]`, *optional*): raises `requests.exceptions.RequestException` when the peer is
            gone; without it, a broadcast waits up to `TIMEOUT`.
    """

    def __init__(self, group: Any, peer_alive: Callable[[], None] | None = None) -> None:
        self.group, self.peer_alive = group, peer_alive
        store = torch.distributed.PrefixStore("weight_transfer_gloo", group.store)
        self.gloo = torch.distributed.ProcessGroupGloo(store, group.rank, group.world_size, TIMEOUT)

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        """Broadcast `tensor` (a CPU tensor, received in place) from rank `src` to the group, as NCCL's does."""
        options = torch.distributed.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        work = self.gloo.broadcast([tensor], options)
        if self.peer_alive is None:
            work.wait()
            return
        import requests

        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        while not done.wait(PROBE_EVERY.total_seconds()):
            try:
                self.peer_alive()
            except requests.exceptions.RequestException:
                # gloo cannot cancel the pending broadcast (`abort` leaves it waiting), and destroying the group joins
                # the thread that waits in it, until `TIMEOUT`: the process keeps the group until it ends
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.gloo))
                raise
        work.wait()  # raises gloo's error, if any


def _join(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    peer_alive: Callable[[], None] | None = None,
) -> GlooCommunicator:
    from vllm.distributed.utils import StatelessProcessGroup

    group = StatelessProcessGroup.create(
        host=master_address, port=master_port, rank=rank, world_size=world_size
    )
    return GlooCommunicator(group, peer_alive)


def trainer_init(
    init_info: Any, rank: int = 0, peer_alive: Callable[[], None] | None = None
) -> GlooCommunicator:
    """Stands in for `vllm.distributed.weight_transfer.nccl_common.trainer_init`: the trainer joins as `rank`;
    `peer_alive` as `GlooCommunicator`'s."""
    get = init_info.get if isinstance(init_info, dict) else lambda key: getattr(init_info, key)
    return _join(get("master_address"), get("master_port"), rank, get("world_size"), peer_alive)


def worker_init_process_group(init_info: Any, parallel_config: Any) -> GlooCommunicator:
    """Stands in for `nccl_common.worker_init_process_group`: a worker joins at the rank NCCL would give it."""
    worker_rank = parallel_config.data_parallel_index * parallel_config.world_size + parallel_config.rank
    return _join(
        init_info.master_address,
        init_info.master_port,
        worker_rank + init_info.rank_offset,
        init_info.world_size,
    )


def broadcast_producer(
    iterator: Iterator[tuple[str, torch.Tensor]],
    group: GlooCommunicator,
    src: int,
    post_iter_func: Callable[[tuple[str, torch.Tensor]], torch.Tensor],
    buffer_size_bytes: int | None = None,
    num_buffers: int | None = None,
) -> None:
    """Stands in for `packed_tensor.packed_nccl_broadcast_producer`: vLLM's packed chunks, broadcast with gloo.

    Args:
        iterator (`Iterator[tuple[str, torch.Tensor]]`): the `(name, tensor)` pairs to send, in metadata order.
        group (`GlooCommunicator`): from `trainer_init`.
        src (`int`): the sender's rank (0).
        post_iter_func (`Callable`): maps each pair to the tensor to send, as in vLLM.
        buffer_size_bytes (`int`, *optional*, defaults to vLLM's `DEFAULT_PACKED_BUFFER_SIZE_BYTES`): a chunk is
            sent once it holds more bytes; the receiver cuts at the same places.
        num_buffers (`int`, *optional*): unused (NCCL's in-flight buffers on CUDA streams).
    """
    from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES, pack_tensors

    limit = buffer_size_bytes or DEFAULT_PACKED_BUFFER_SIZE_BYTES
    while (chunk := pack_tensors(iterator, post_iter_func, limit)) is not None:
        group.broadcast(chunk.packed_tensor.cpu(), src=src)


def broadcast_consumer(
    iterator: Iterator[tuple[str, tuple[list[int], torch.dtype]]],
    group: GlooCommunicator,
    src: int,
    post_unpack_func: Callable[[list[tuple[str, torch.Tensor]]], None],
    buffer_size_bytes: int | None = None,
    num_buffers: int | None = None,
    device: torch.device | str = "cpu",
) -> None:
    """Stands in for `packed_tensor.packed_nccl_broadcast_consumer`: receives the producer's chunks with gloo.

    Args:
        iterator (`Iterator`): `(name, (shape, dtype))` of each tensor, in the order they are sent.
        group (`GlooCommunicator`): from `worker_init_process_group`.
        src (`int`): the sender's rank (0).
        post_unpack_func (`Callable`): called with each chunk's `(name, tensor)` pairs (the model's `load_weights`).
        buffer_size_bytes (`int`, *optional*, defaults to vLLM's `DEFAULT_PACKED_BUFFER_SIZE_BYTES`): as the producer's.
        num_buffers (`int`, *optional*): unused (NCCL's in-flight buffers on CUDA streams).
        device (`torch.device` or `str`, *optional*, defaults to `"cpu"`): where the received buffers are placed.
    """
    from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES, unpack_tensor

    limit = buffer_size_bytes or DEFAULT_PACKED_BUFFER_SIZE_BYTES
    chunk: list[tuple[str, list[int], torch.dtype, int]] = []

    def receive() -> None:
        names, shapes, dtypes, sizes = (list(field) for field in zip(*chunk))
        packed = torch.empty(sum(sizes), dtype=torch.uint8)
        group.broadcast(packed, src=src)
        post_unpack_func(unpack_tensor(packed.to(device), names, shapes, dtypes, sizes))
        chunk.clear()

    total = 0
    for name, (shape, dtype) in iterator:
        size = math.prod(shape) * dtype.itemsize
        chunk.append((name, shape, dtype, size))
        total += size
        if total > limit:  # where `pack_tensors` closes a chunk
            receive()
            total = 0
    if chunk:
        receive()


def install_client() -> bool:
    """In the trainer's process: TRL's `VLLMClient` joins and feeds the gloo group. Returns whether vLLM runs on the
    CPU (then patched)."""
    import trl.generation.vllm_client as client
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    if _CLIENT_INSTALLED:
        return True
    if not client._HAS_STATEFUL_TRAINER_ENGINE:
        raise RuntimeError("the gloo weight transfer follows vLLM >= 0.28's (TRL's stateful path)")
    client.packed_nccl_broadcast_producer = broadcast_producer
    client.VLLMClient.init_communicator = init_communicator
    _CLIENT_INSTALLED.append(init_communicator)
    return True


def init_communicator(self: Any, device: Any = 0) -> None:
    """TRL's `VLLMClient.init_communicator` on the CPU: the server's weight-transfer engine joins a group with the
    trainer (rank 0, the workers after it), here a gloo one (`trainer_init`) in place of TRL's NCCL endpoint, which
    TRL refuses off CUDA. The same requests and rendezvous as TRL's; `device` is unused (the group runs on the CPU).

    Args:
        self (`VLLMClient`): TRL's client of the server.
        device (`Any`, *optional*, defaults to `0`): TRL's argument, the device NCCL would run on.
    """
    import atexit
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    from trl.generation.vllm_client import get_ip

    if self.get_server_info()["weight_transfer_config"] is None:
        raise RuntimeError(
            f"The vLLM server at {self.base_url} has no weight-transfer engine; start it with trl vllm-serve."
        )
    init_info = {
        "master_address": get_ip(),
        "master_port": self.group_port,
        "rank_offset": 1,
        "world_size": self.get_world_size() + 1,
        "packed": True,
    }
    # the server blocks in the rendezvous while it handles the request: the trainer joins meanwhile
    with ThreadPoolExecutor(max_workers=1) as executor:
        future = executor.submit(
            self._post, f"{self.base_url}/init_weight_transfer_engine", json={"init_info": init_info}
        )
        self.communicator = trainer_init(init_info, peer_alive=partial(server_alive, self.base_url))
        future.result()
    atexit.register(self.close_communicator)


def server_alive(base_url: str) -> None:
    """Raises `requests.ConnectionError` when the server at `base_url` refuses connections (it stopped); a server
    that is up, busy or slow to answer passes.

    Args:
        base_url (`str`): the server's address, as TRL's client holds it.
    """
    import requests

    try:
        requests.get(f"{base_url}/health", timeout=PROBE_EVERY.total_seconds())
    except requests.exceptions.Timeout:
        pass  # up, but busy (the weight update in progress)


_CLIENT_INSTALLED: list = []
"""The installed client side, so that a second call changes nothing."""


def install_server() -> None:
    """vLLM general plugin, in each of the server's processes: `cpu.keep_linear_weights_plain` and the gloo transport
    of the worker's `NCCLWeightTransferEngine`. Does nothing off CPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.distributed.weight_transfer.nccl_engine as engine

    from .cpu import keep_linear_weights_plain

    keep_linear_weights_plain()
    engine.worker_init_process_group = worker_init_process_group
    engine.packed_nccl_broadcast_consumer = broadcast_consumer
