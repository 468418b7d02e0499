"""The buffered rollout, saved in each checkpoint, so that a run resumed inside a generation batch stays exact.

With `steps_per_generation > 1` (or `num_iterations > 1`) one rollout feeds several optimizer steps: TRL keeps its
micro-batches in `_buffered_inputs` and counts micro-steps in `_step`. A checkpoint taken between two of those steps
does not hold them in TRL, so a resumed run samples the generation batch again with other random draws and goes on
along another trajectory. Here every checkpoint holds the micro-step count (`rollout_state.json`) and, when it falls
inside a generation batch, each process's buffered micro-batches (`rollout_buffer-RANK.pt`): the resumed run trains
on the very completions, advantages and log-probs the uninterrupted run trains on.

The file holds only tensors, numbers, strings and lists (loaded with `weights_only=True`). The per-sample image dicts
are stored once each and referenced by index (a row whose tools returned images by its three dicts, see
`tool_rollout.ToolImageRow`), since the G rows of a group share one dict object and the shared
prefix and the image-feature cache find groups by that identity. The `SharingPlan` is stored as its fields.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..policy.image_rows import ToolImageRow
from ..policy.sharing_plan import SharingPlan

STATE_FILE = "rollout_state.json"
"""The micro-step count, in each checkpoint folder."""


def buffer_file(folder: str | Path, rank: int) -> Path:
    """Where process `rank`'s buffered micro-batches go in a checkpoint folder."""
    return Path(folder) / f"rollout_buffer-{rank}.pt"


def save_rollout(folder: str | Path, rank: int, step: int, buffered: list[dict[str, Any]] | None) -> None:
    """Write the micro-step count (rank 0) and, inside a generation batch, this process's buffered micro-batches.

    Args:
        folder (`str | Path`): the checkpoint folder.
        rank (`int`): this process's index.
        step (`int`): TRL's micro-step count `_step`.
        buffered (`list[dict]` or `None`): TRL's `_buffered_inputs`; None (or at a generation boundary, nothing
            to resume) writes no buffer.
    """
    if rank == 0:
        (Path(folder) / STATE_FILE).write_text(json.dumps({"step": step}))
    if buffered is not None:
        torch.save(_encode(buffered), buffer_file(folder, rank))


def load_rollout(
    folder: str | Path, rank: int, device: torch.device
) -> tuple[int | None, list[dict[str, Any]] | None]:
    """`(micro-step count, buffered micro-batches)` saved in a checkpoint; None for what it does not hold.

    Args:
        folder (`str | Path`): the checkpoint folder.
        rank (`int`): this process's index.
        device (`torch.device`): where the tensors go.
    """
    state = Path(folder) / STATE_FILE
    step = int(json.loads(state.read_text())["step"]) if state.is_file() else None
    path = buffer_file(folder, rank)
    if not path.is_file():
        return step, None
    return step, _decode(torch.load(path, map_location=device, weights_only=True))


def _image_entry(row: dict[str, torch.Tensor], images: list[dict], index: dict[int, int]) -> int | list[int]:
    """Where a row's image dict is saved: its place in `images` (each distinct dict once), or for a
    `ToolImageRow` the places of its dict, its prompt's and its tools' (plain dicts; `_decode` joins them again)."""

    def place(images_dict: dict[str, torch.Tensor]) -> int:
        if id(images_dict) not in index:
            index[id(images_dict)] = len(images)
            images.append(dict(images_dict))
        return index[id(images_dict)]

    if isinstance(row, ToolImageRow):
        return [place(row), place(row.prompt), place(row.tools)]
    return place(row)


def _encode(buffered: list[dict[str, Any]]) -> dict[str, Any]:
    images: list[dict[str, torch.Tensor]] = []
    index: dict[int, int] = {}  # id(image dict) -> its place in `images`
    batches = []
    for micro_batch in buffered:
        out: dict[str, Any] = {}
        for key, value in micro_batch.items():
            if key == "image_inputs":
                out[key] = [_image_entry(row, images, index) for row in value]
            elif key == "sharing":
                out[key] = asdict(value)
            elif isinstance(value, torch.Tensor | int | float | bool | str) or value is None:
                out[key] = value
            else:
                raise TypeError(f"rollout buffer: no rule to save {key!r} of type {type(value).__name__}")
        batches.append(out)
    return {"images": images, "batches": batches}


def _decode(saved: dict[str, Any]) -> list[dict[str, Any]]:
    images = saved["images"]
    buffered = []
    for micro_batch in saved["batches"]:
        batch = dict(micro_batch)
        batch["image_inputs"] = [
            images[i] if isinstance(i, int) else ToolImageRow(*(images[j] for j in i))
            for i in micro_batch["image_inputs"]
        ]
        plan = micro_batch["sharing"]
        batch["sharing"] = SharingPlan(
            plan["generation"],
            plan["scoring"],
            plan["training"],
            {name: tuple(why) for name, why in plan["reasons"].items()},
        )
        buffered.append(batch)
    return buffered
