"""How a training process ends: every rank finishes its writes, the process groups go, and the process exits cleanly.

A process that ends with a gloo process group still referenced (DeepSpeed's groups, every ZeRO-3 parameter's
`ds_process_group`) keeps the group's C++ worker threads alive into interpreter finalization, where they are torn down
in no fixed order; a thread destroyed before it was joined, or one that takes the GIL of an interpreter being torn
down, aborts the process ("terminate called without an active exception", exit by SIGABRT) although training
succeeded and every file was written. `torch.distributed.destroy_process_group` does not stop those threads while
another reference holds the group, and the holders belong to other libraries. So a process that ran in a process
group of several processes ends with `exit_process`: the interpreter's exit handlers run as usual (loggers, trackers
such as wandb), then the process exits without the finalization that could abort it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def finish_processes(release: Callable[[], None] | None = None) -> bool:
    """Wait for every process, then destroy the process group.

    Under ZeRO-3 the processes end out of step: rank 0 alone writes the gathered final model while the others are
    already exiting. The barrier lets every process finish its writes and collectives first. Only called after
    training ended normally or by preemption, on every process alike (after an error, some processes may still be
    inside a collective). A no-op without a process group.

    Args:
        release (`Callable[[], None]`, *optional*): destroys the process groups that another library owns (the
            trainer's `release_process_groups`: vLLM's, in colocate mode) after the barrier, through that library,
            so that its own finalizer does not try to destroy them again at exit.

    Returns:
        `bool`: whether this process was one of several in a process group; such a process ends with
        `exit_process`.
    """
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    several = torch.distributed.get_world_size() > 1
    torch.distributed.barrier()
    if release is not None:
        release()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return several


def exit_process(status: int) -> NoReturn:
    """End the process with `status` after what a normal exit runs, without the interpreter's finalization.

    Non-daemon threads are joined and the exit handlers run (`atexit`: loggers flushed, trackers closed), as at a
    normal exit; then the standard streams are flushed and the process exits with `os._exit`, so that no C++ object
    left alive by another library (see the module docstring) is torn down. Only for a process whose work is done and
    whose files are written and closed (after `finish_processes`).

    Args:
        status (`int`): the exit status.
    """
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)
