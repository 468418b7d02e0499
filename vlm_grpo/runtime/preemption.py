"""Preemption: stop at a step boundary with a complete checkpoint when the cluster asks the run to stop.

Schedulers preempt a job by sending SIGTERM (SLURM, Kubernetes), often after a warning signal (SIGUSR1 with
SLURM's `--signal`). On either signal the run finishes the optimizer step it is in, writes a checkpoint (marked
complete like every other one, see `vlm_grpo.trainer.checkpoints`) and stops; `vlm-grpo train` then exits with
`EXIT_PREEMPTED` (75, `EX_TEMPFAIL`: "try again"). Running the same command with `--resume_from_checkpoint true`
continues exactly where it stopped. `vlm-grpo demo` stops the same way, with a checkpoint of the stage it was
training, and raises `Preempted` instead of going on to its next stage.

The signal handler only records the request. At the end of every optimizer step the processes agree on it with
one all-reduce of a single number (the maximum over processes), so that every process stops after the same step
even when the signal reached only some of them, or reached them between two different steps.
"""

from __future__ import annotations

import inspect
import logging
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

logger = logging.getLogger("vlm_grpo")

EXIT_PREEMPTED = 75
"""Exit status of `vlm-grpo train` stopped by a preemption signal after writing a complete checkpoint
(`EX_TEMPFAIL` of sysexits.h: a temporary failure, run the same command again to resume)."""

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""The signals that ask a run to checkpoint and stop."""


class Preempted(Exception):
    """A run that a preemption signal stopped before it finished; the message says where it stopped.

    Raised by the demo pipeline (`vlm_grpo.demos.common.run_task`), whose next stage would need what the stopped one
    did not write; `vlm-grpo demo` prints the message in one line and exits with `EXIT_PREEMPTED`.

    Args:
        message (`str`): what was stopped, after which step, and where its last checkpoint is.
        checkpoint (`str | None`, *optional*, defaults to `None`): the last complete checkpoint (or saved model)
            folder, None when the run stopped before it wrote one.
    """

    def __init__(self, message: str, checkpoint: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint


class PreemptionCallback(TrainerCallback):
    """Turn a preemption signal into a checkpoint at the next step end, then a stop, on every process at once.

    Install the signal handlers with `handle_signals` (they only set a flag). At each step end the flag is
    reduced across processes (maximum), so all processes stop after the same step. A signal that arrives once the
    last step has been taken is ignored: the run finishes and saves its final model as usual.

    Handlers nest: a callback whose `handle_signals` block opens inside another callback's takes over a signal the
    outer one already received (it stops after its first step), and hands a signal it receives back to the outer
    one when its block ends (so a pipeline of several runs learns that the run inside it was asked to stop).

    Args:
        signals (`Sequence[signal.Signals]`, defaults to `PREEMPTION_SIGNALS`): the signals that ask for a stop.

    Attributes:
        received (`int | None`): the signal number received by this process, or None.
        stopped_at (`int | None`): the step after which the run checkpointed and stopped, or None.
    """

    def __init__(self, signals: Sequence[signal.Signals] = PREEMPTION_SIGNALS):
        self.signals = tuple(signals)
        self.received: int | None = None
        self.stopped_at: int | None = None

    def request(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler: record the request (the first signal received is the one reported)."""
        if self.received is None:
            self.received = signum

    @contextmanager
    def handle_signals(self) -> Iterator[PreemptionCallback]:
        """Install `request` as the handler of `signals` in this block, and restore the previous handlers after.

        A signal an enclosing `PreemptionCallback` received before the block counts as received here, and one
        received here is passed on to it at the end. Outside the main thread (where Python cannot install handlers)
        nothing is installed.
        """
        try:
            previous = {sig: signal.signal(sig, self.request) for sig in self.signals}
        except ValueError:  # not the main thread of the main interpreter
            previous = {}
        outer = {
            id(h.__self__): h.__self__ for h in previous.values() if isinstance(_owner(h), PreemptionCallback)
        }
        for callback in outer.values():
            if callback.received is not None:
                self.request(callback.received)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.received is not None:
                for callback in outer.values():
                    callback.request(self.received)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> TrainerControl:
        """Agree on a stop across processes; when any process was signalled, save and stop after this step."""
        if state.global_step >= state.max_steps or not self._any_process_signalled(args):
            return control
        self.stopped_at = state.global_step
        control.should_save = True
        control.should_training_stop = True
        if state.is_world_process_zero:
            name = signal.Signals(self.received).name if self.received else "a signal on another process"
            logger.warning("Preempted (%s): writing checkpoint-%d and stopping.", name, state.global_step)
        return control

    def _any_process_signalled(self, args: TrainingArguments) -> bool:
        """Whether this process or any other received a signal (one all-reduce of one number when distributed)."""
        flag = 1.0 if self.received is not None else 0.0
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return flag > 0
        if torch.distributed.get_world_size() == 1:
            return flag > 0
        tensor = torch.tensor([flag], device=args.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor.item() > 0


def _owner(handler: object) -> object:
    """The object a bound-method signal handler belongs to, or None."""
    return handler.__self__ if inspect.ismethod(handler) else None


def preempted_step(callbacks: Sequence[TrainerCallback]) -> int | None:
    """The step a run stopped at because of a preemption signal (from its callbacks), or None.

    Args:
        callbacks (`Sequence[TrainerCallback]`): the trainer's callbacks (`trainer.callback_handler.callbacks`).
    """
    for callback in callbacks:
        if isinstance(callback, PreemptionCallback) and callback.stopped_at is not None:
            return callback.stopped_at
    return None
