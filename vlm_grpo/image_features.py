"""Frozen vision, computed once: image-encoder outputs reused by generation and every log-prob pass.

While no vision parameter trains (`freeze_vision_modules`, or LoRA on the language model only), the vision tower
(and projector) maps the same image to the same features in every pass of a generation batch: generation, old,
reference and policy log-probs. `ImageFeatureCache` runs it once per distinct prompt's images and hands the stored
output to the model the next times, so the forwards are otherwise unchanged (exact: the same features enter the
language model).

How: every family's inner model calls its own `get_image_features(pixel_values, ...)` from `forward`. Inside
`ImageFeatureCache.reuse(model, image_inputs)`, that method is replaced on the model instance by one that answers
from the cache, row by row. The image tensors it receives are those of some of the given rows, concatenated in row
order (all rows, or one per group on the shared-prefix path); each row is recognised by its tensors being equal to
the next slice of the input, so a match is exact by construction. The cache key is the row's per-sample image dict
(`EncodedPrompt.image_inputs`, one object shared by the G rows of a group); rows not seen yet are computed with the
original method. A row whose tools returned images counts as its two parts, the prompt's (its group's entry) and the
tools' (`tool_rollout.ToolImageRow`). The per-row outputs are joined as one batched call would return them
(`ModelFamily.join_image_features`). Input that matches no sequence of rows is passed to the original method.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from .models import ModelFamily
from .tool_rollout import image_parts


class ImageFeatureCache:
    """Image-encoder outputs of one generation batch, one entry per distinct per-sample image dict.

    Args:
        family (`ModelFamily`): the family's module (which inputs are per-image, how outputs join).
    """

    def __init__(self, family: ModelFamily):
        self.family = family
        self._outputs: dict[
            int, tuple[dict[str, torch.Tensor], Any]
        ] = {}  # id(row dict) -> (row dict, output)
        self.encoded_rows = 0  # rows whose images went through the vision tower (for tests and metrics)

    def clear(self) -> None:
        """Forget every stored output (a new generation batch starts)."""
        self._outputs.clear()

    def keep(self, image_inputs: Sequence[dict[str, torch.Tensor]]) -> None:
        """Forget the outputs of every row but these (dynamic sampling dropped the others' groups)."""
        kept = {id(part) for part in image_parts(image_inputs)}
        self._outputs = {key: value for key, value in self._outputs.items() if key in kept}

    @contextmanager
    def reuse(
        self, model: torch.nn.Module, image_inputs: Sequence[dict[str, torch.Tensor]]
    ) -> Iterator[None]:
        """Within the block, `model`'s image encoder answers from the cache for these rows.

        Args:
            model (`PreTrainedModel`): the unwrapped transformers model (no PEFT or DDP wrapper).
            image_inputs (`Sequence[dict]`): the per-sample image dicts of the rows this forward runs, in row order.
        """
        owner = self.family.image_encoder_owner(model)
        original = owner.get_image_features
        candidates = [part for part in image_parts(image_inputs) if part]

        def cached(pixel_values: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            rows = self._match_rows(pixel_values, args, kwargs, candidates)
            if rows is None:
                return original(pixel_values, *args, **kwargs)
            outputs = [self._output(row, original, pixel_values.device, args, kwargs) for row in rows]
            return self.family.join_image_features(outputs)

        owner.get_image_features = cached
        try:
            yield
        finally:
            del owner.get_image_features  # back to the class's method

    def _match_rows(
        self, pixel_values: torch.Tensor, args: tuple, kwargs: dict, candidates: list[dict]
    ) -> list[dict] | None:
        """The rows whose image tensors, concatenated in order, are exactly the input; None when there are none."""
        keys = self.family.image_input_keys
        given = {keys[0]: pixel_values, **dict(zip(keys[1:], args, strict=False))}
        given.update({k: kwargs[k] for k in keys[1:] if k in kwargs})
        offsets = dict.fromkeys(given, 0)
        rows = []
        for row in candidates:
            sizes = {k: row[k].size(0) for k in given}
            if all(
                offsets[k] + sizes[k] <= given[k].size(0)
                and torch.equal(given[k][offsets[k] : offsets[k] + sizes[k]], row[k].to(given[k].device))
                for k in given
            ):
                rows.append(row)
                offsets = {k: offsets[k] + sizes[k] for k in given}
        complete = rows and all(offsets[k] == given[k].size(0) for k in given)
        return rows if complete else None

    def _output(self, row: dict[str, torch.Tensor], original, device, args: tuple, kwargs: dict) -> Any:
        """The stored output of one row's images, computed with the original method on a miss."""
        key = id(row)
        if key not in self._outputs:
            keys = self.family.image_input_keys
            extra = {k: row[k].to(device) for k in keys[1:] if k in row}  # e.g. image_grid_thw
            positional = [extra.pop(k) if k in extra else a for k, a in zip(keys[1:], args, strict=False)]
            positional += list(args[len(positional) :])
            output = original(row[keys[0]].to(device), *positional, **{**kwargs, **extra})
            self._outputs[key] = (row, output)  # the row is kept alive so that its id stays unique
            self.encoded_rows += 1
        return self._outputs[key][1]
