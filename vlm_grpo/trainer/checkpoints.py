"""Checkpoints that are safe to resume from.

A run killed while saving leaves a `checkpoint-N` folder with some files missing. transformers picks the
highest-numbered folder as the latest; we only pick folders that carry the completion marker, which the trainer
writes after every process has finished writing its part of the checkpoint.

A write that fails (a full disk, a read-only folder, a file-size limit) surfaces as different exception types
depending on the writer: `OSError` from Python's own files, `SafetensorError` ("I/O error") from the weights, and
`RuntimeError` from `torch.save` (optimizer, scheduler and RNG states; the errno is lost there).
`checkpoint_write_error` recognises all three and gives the one-line message the run stops with.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from ..errors import VLMGRPOError

if TYPE_CHECKING:  # `vlm-grpo train` reads this module before its heavy imports (see `option_help`)
    import torch

    from ..models import ModelFamily

COMPLETE_MARKER = "checkpoint_complete"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# What torch.save's stream writer says when a write falls short (a full disk, a file-size limit).
_TORCH_WRITE_FAILURE = re.compile(
    r"PytorchStreamWriter failed|inline_container\.cc.*unexpected pos|file write failed"
)


def mark_complete(checkpoint_dir: str | os.PathLike) -> None:
    """Write the completion marker into `checkpoint_dir` (call after all its files are written)."""
    path = Path(checkpoint_dir) / COMPLETE_MARKER
    with open(path, "w") as f:
        f.write("complete\n")
        f.flush()
        os.fsync(f.fileno())


def is_write_failure(error: BaseException) -> bool:
    """Whether `error`, raised while saving a checkpoint, means that writing a file failed.

    Args:
        error (`BaseException`): what saving raised: `OSError`, safetensors' `SafetensorError` with an I/O error,
            or torch.save's `RuntimeError` from its stream writer count; anything else is not a write failure.
    """
    if isinstance(error, OSError):
        return True
    if isinstance(error, SafetensorError):
        return "I/O error" in str(error) or "os error" in str(error)
    return isinstance(error, RuntimeError) and bool(_TORCH_WRITE_FAILURE.search(str(error)))


def checkpoint_write_error(checkpoint_dir: str | os.PathLike, error: BaseException) -> str | None:
    """The one-line message a failed checkpoint write stops the run with, or None when `error` is no write failure.

    Args:
        checkpoint_dir (`str | os.PathLike`): the checkpoint folder being written.
        error (`BaseException`): what saving raised.
    """
    if not is_write_failure(error):
        return None
    reason = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, RuntimeError):
        reason = f"a file came out short ({reason}): disk full or a file-size limit"
    return f"Cannot write checkpoint {checkpoint_dir}: {reason}; free space or fix the folder, then resume."


def is_complete(checkpoint_dir: str | os.PathLike) -> bool:
    """Whether `checkpoint_dir` carries the completion marker."""
    return (Path(checkpoint_dir) / COMPLETE_MARKER).is_file()


def latest_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The complete `checkpoint-N` folder of `output_dir` with the largest N, or None when there is none."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    steps = [
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := _CHECKPOINT.match(p.name)) and p.is_dir() and is_complete(p)
    ]
    return str(max(steps)[1]) if steps else None


def checkpoint_step(checkpoint_dir: str | os.PathLike) -> int | None:
    """The optimizer step a checkpoint was written at: its `trainer_state.json`, else the N of `checkpoint-N`."""
    state = Path(checkpoint_dir) / "trainer_state.json"
    if state.is_file():
        return int(json.loads(state.read_text())["global_step"])
    match = _CHECKPOINT.match(Path(checkpoint_dir).name)
    return int(match.group(1)) if match else None


def resolve_resume(value: str | bool | None, output_dir: str | os.PathLike) -> str | None:
    """Turn a `resume_from_checkpoint` setting into a checkpoint folder.

    Args:
        value (`str | bool | None`): None/False/"false" (start fresh), True/"true" (latest complete checkpoint
            of `output_dir`; start fresh when there is none) or a checkpoint folder.
        output_dir (`str | os.PathLike`): the run's output folder.

    Raises:
        ValueError: a given folder is missing or incomplete (the message names the latest complete one).
    """
    if value in (None, False) or str(value).lower() in ("false", "none", ""):
        return None
    if value is True or str(value).lower() == "true":
        return latest_checkpoint(output_dir)
    if not Path(value).is_dir():
        raise ValueError(f"resume_from_checkpoint={value!r}: no such checkpoint folder.")
    if not is_complete(value):
        raise ValueError(
            f"resume_from_checkpoint={value!r} is incomplete (the run stopped while saving it); resume from "
            f"{latest_checkpoint(Path(value).parent)!r} or pass --resume_from_checkpoint true."
        )
    return str(value)


def load_weights_mapped(
    target: torch.nn.Module, family: ModelFamily, checkpoint_dir: str | os.PathLike
) -> None:
    """Load a checkpoint's weights into `target` through the family's `from_pretrained`, which maps key names.

    From transformers 5.23, VLM weights are saved under the checkpoint's original key names (`visual.*`, say) and
    `Trainer._load_from_checkpoint` loads them without that mapping: every weight would be skipped with a warning
    and training would resume from the initial weights.

    Args:
        target (`torch.nn.Module`): the unwrapped policy.
        family (`ModelFamily`): its family, which loads the checkpoint.
        checkpoint_dir (`str | os.PathLike`): the checkpoint folder.
    """
    loaded = family.load_model(str(checkpoint_dir), dtype=target.dtype, device_map=None)
    missing, unexpected = target.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise VLMGRPOError(
            f"Checkpoint {checkpoint_dir} does not match the model: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}; resume with the model and config that wrote it."
        )


def load_optimizer_and_scheduler_to_cpu(
    optimizer: torch.optim.Optimizer, scheduler: Any, checkpoint_dir: str | os.PathLike
) -> None:
    """Load the optimizer and scheduler states as transformers does, to plain `cpu`.

    transformers below 5.18 loads a multi-process run's optimizer state with `map_location=args.device`; on CPU
    that is accelerate's indexed `cpu:0`, a location torch cannot restore to.

    Args:
        optimizer (`torch.optim.Optimizer`): the trainer's optimizer.
        scheduler (`Any`): the trainer's learning-rate scheduler.
        checkpoint_dir (`str | os.PathLike`): the checkpoint folder.
    """
    import torch
    from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

    optimizer_file, scheduler_file = (
        os.path.join(checkpoint_dir, n) for n in (OPTIMIZER_NAME, SCHEDULER_NAME)
    )
    if os.path.isfile(optimizer_file) and os.path.isfile(scheduler_file):
        optimizer.load_state_dict(torch.load(optimizer_file, map_location="cpu", weights_only=True))
        scheduler.load_state_dict(torch.load(scheduler_file, weights_only=True))
