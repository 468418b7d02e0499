"""Fresh prompts for dynamic sampling's extra rounds: a seeded stream of dataset indices beside the data loader's.

Its position is saved in every checkpoint (`prompt_stream.json`), so a resumed run draws the prompts the
uninterrupted run would have drawn. `prompt_key` names a row's prompt, so that a round can pass over prompts already
sampled in its generation batch on every process alike.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..data.rows import row_images

STATE_FILE = "prompt_stream.json"
"""The stream's position, in each checkpoint folder."""


class PromptStream:
    """Dataset indices for the extra rounds: a new seeded permutation of the dataset for each pass over it.

    Args:
        size (`int`): number of prompts in the dataset.
        seed (`int`): seed of the permutations (pass e of the data uses `seed + e`).
    """

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.taken = 0  # indices handed out (or passed over) so far, over every pass
        self._order: tuple[int, list[int]] | None = None  # (pass, its permutation), computed once per pass
        self._lock = threading.Lock()  # asynchronous rollouts draw on their thread while a checkpoint saves

    def take(self, count: int, skip: Callable[[int], bool] | None = None) -> list[int]:
        """The next `count` indices of the stream, passing over those `skip` marks.

        Args:
            count (`int`): indices wanted.
            skip (`Callable[[int], bool]`, *optional*, defaults to `None`): indices not to hand out (prompts already
                sampled in this generation batch). After a whole pass over the dataset without enough unmarked
                indices, the passed-over ones are handed out in stream order (a dataset smaller than the batch).
        """
        out: list[int] = []
        passed: list[int] = []
        with self._lock:
            while len(out) < count:
                # every index seen once more: take passed-over ones rather than loop
                if len(passed) >= self.size:
                    out += passed[: count - len(out)]
                    break
                index = self._next()
                (passed if skip is not None and skip(index) else out).append(index)
        return out

    def _next(self) -> int:
        """The next index: position `taken` of the seeded permutation of its pass over the data."""
        epoch, offset = divmod(self.taken, self.size)
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._order = (epoch, torch.randperm(self.size, generator=generator).tolist())
        self.taken += 1
        return self._order[1][offset]

    def save(self, folder: str | Path) -> None:
        """Write the position to `folder/prompt_stream.json`."""
        with self._lock:
            (Path(folder) / STATE_FILE).write_text(json.dumps({"taken": self.taken, "seed": self.seed}))

    def load(self, folder: str | Path) -> None:
        """Restore the position saved in `folder` (a checkpoint written without dynamic sampling has none)."""
        path = Path(folder) / STATE_FILE
        if path.is_file():
            self.taken = int(json.loads(path.read_text())["taken"])


def prompt_key(row: dict[str, Any]) -> str:
    """A dataset row's prompt as a string: its messages, its images (paths, or a digest of the pixels) and its videos.

    Two rows get the same key when `vlm_grpo.rollout.batch.same_prompt` would call their prompts equal; the key can be
    gathered across processes.

    Args:
        row (`dict`): a dataset row (`prompt`, `image` or `images` as paths or PIL images, and `videos`).
    """
    images = [
        image if isinstance(image, str) else hashlib.sha1(image.tobytes()).hexdigest() + str(image.size)
        for image in row_images(row)
    ]
    return repr((row["prompt"], images, list(row.get("videos") or [])))
