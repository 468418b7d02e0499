"""Frozen vision, computed once: image-encoder outputs reused by generation and every log-prob pass.

While no vision parameter trains (`freeze_vision_modules`, or LoRA on the language model only), the vision tower
(and projector) maps the same image to the same features in every pass of a generation batch: generation, old,
reference and policy log-probs. `ImageFeatureCache` runs it once per distinct prompt's images and hands the stored
output to the model the next times, so the forwards are otherwise unchanged (exact: the same features enter the
language model).

How: every family's inner model calls its own `get_image_features(pixel_values, ...)` (and, for videos,
`get_video_features(pixel_values_videos, ...)`) from `forward`. Inside `ImageFeatureCache.reuse(model, image_inputs)`,
those methods are replaced on the model instance by ones that answer from the cache, row by row. The image tensors it receives are those of some of the given rows, concatenated in row
order (all rows, or one per group on the shared-prefix path); each row is recognised by its tensors being equal to
the next slice of the input, so a match is exact by construction. The cache key is the row's per-sample image dict
(`EncodedPrompt.image_inputs`, one object shared by the G rows of a group); rows not seen yet are computed with the
original method. A row whose tools returned images counts as its two parts, the prompt's (its group's entry) and the
tools' (`tool_rollout.ToolImageRow`). The per-row outputs are joined as one batched call would return them
(`ModelFamily.join_image_features`). Input that matches no sequence of rows is passed to the original method.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from ..models import ModelFamily
from .image_rows import image_parts


class ImageFeatureCache:
    """Image- and video-encoder outputs of one generation batch, one entry per distinct per-sample dict and encoder.

    Args:
        family (`ModelFamily`): the family's module (which inputs are per-image or per-video, how outputs join).
    """

    def __init__(self, family: ModelFamily):
        self.family = family
        self._outputs: dict[
            tuple[int, str], tuple[dict[str, torch.Tensor], Any]
        ] = {}  # (id(row dict), encoder method) -> (row dict, output)
        # rows whose images or videos went through the vision tower (for tests and metrics)
        self.encoded_rows = 0

    def clear(self) -> None:
        """Forget every stored output (a new generation batch starts)."""
        self._outputs.clear()

    def keep(self, image_inputs: Sequence[dict[str, torch.Tensor]]) -> None:
        """Forget the outputs of every row but these (dynamic sampling dropped the others' groups)."""
        kept = {id(part) for part in image_parts(image_inputs)}
        self._outputs = {key: value for key, value in self._outputs.items() if key[0] in kept}

    def encode(self, model: torch.nn.Module, parts: Sequence[dict[str, torch.Tensor]]) -> None:
        """Compute and store the outputs of the rows not stored yet, as the forward calls the encoders
        (`return_dict=True`); what a forward of these rows would compute on a miss, done ahead of it.

        Args:
            model (`PreTrainedModel`): the unwrapped transformers model (no PEFT or DDP wrapper).
            parts (`Sequence[dict]`): per-sample image dicts (`image_rows.image_parts` of the rows).
        """
        owner = self.family.image_encoder_owner(model)
        for name, keys in self._encoders().items():
            original = getattr(owner, name)
            for part in parts:
                if keys[0] in part:
                    device = part[keys[0]].device
                    self._output(part, name, keys, original, device, {"return_dict": True})

    def _encoders(self) -> dict[str, tuple[str, ...]]:
        """The encoder methods of the family's inner model, with the names of their tensor arguments."""
        encoders = {"get_image_features": self.family.image_input_keys}
        if self.family.video_feature_keys:
            encoders["get_video_features"] = self.family.video_feature_keys
        return encoders

    @contextmanager
    def reuse(
        self, model: torch.nn.Module, image_inputs: Sequence[dict[str, torch.Tensor]]
    ) -> Iterator[None]:
        """Within the block, `model`'s image (and video) encoder answers from the cache for these rows.

        Args:
            model (`PreTrainedModel`): the unwrapped transformers model (no PEFT or DDP wrapper).
            image_inputs (`Sequence[dict]`): the per-sample image dicts of the rows this forward runs, in row order.
        """
        owner = self.family.image_encoder_owner(model)
        encoders = self._encoders()
        for name, keys in encoders.items():
            # the rows that hold this encoder's input
            candidates = [part for part in image_parts(image_inputs) if keys[0] in part]
            setattr(owner, name, self._cached(getattr(owner, name), name, keys, candidates))
        try:
            yield
        finally:
            for name in encoders:
                delattr(owner, name)  # back to the class's method

    def _cached(self, original, name: str, keys: tuple[str, ...], candidates: list[dict]):
        """`original` (an encoder method whose tensor arguments are named `keys`), answering from the cache for
        `candidates`. It keeps the method's signature, which transformers' `generate` reads to pass it its inputs."""
        signature = inspect.signature(original)
        var_keyword = next(
            (p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )

        @functools.wraps(original)
        def cached(*args: Any, **kwargs: Any) -> Any:
            arguments = dict(signature.bind(*args, **kwargs).arguments)
            other = {
                **arguments.pop(var_keyword, {}),
                **{k: v for k, v in arguments.items() if k not in keys},
            }
            given = {k: arguments[k] for k in keys if arguments.get(k) is not None}
            rows = self._match_rows(given, candidates) if keys[0] in given else None
            if rows is None:
                return original(*args, **kwargs)
            device = given[keys[0]].device
            outputs = [self._output(row, name, keys, original, device, other) for row in rows]
            return self.family.join_image_features(outputs)

        return cached

    def _match_rows(self, given: dict[str, torch.Tensor], candidates: list[dict]) -> list[dict] | None:
        """The rows whose tensors, concatenated in order, are exactly the `given` inputs; None when there are none."""
        offsets = dict.fromkeys(given, 0)
        rows = []
        for row in candidates:
            sizes = {k: row[k].size(0) for k in given if k in row}
            if len(sizes) == len(given) and all(
                offsets[k] + sizes[k] <= given[k].size(0)
                and torch.equal(given[k][offsets[k] : offsets[k] + sizes[k]], row[k].to(given[k].device))
                for k in given
            ):
                rows.append(row)
                offsets = {k: offsets[k] + sizes[k] for k in given}
        complete = rows and all(offsets[k] == given[k].size(0) for k in given)
        return rows if complete else None

    def _output(
        self, row: dict[str, torch.Tensor], name: str, keys: tuple[str, ...], original, device, other: dict
    ) -> Any:
        """The stored output of one row's images (or videos), computed with the original method on a miss.

        Args:
            other (`dict`): the call's other arguments (not in `keys`), passed on unchanged.
        """
        key = (id(row), name)
        if key not in self._outputs:
            inputs = {k: row[k].to(device) for k in keys if k in row}  # e.g. pixel_values and image_grid_thw
            output = original(**inputs, **other)
            self._outputs[key] = (row, output)  # the row is kept alive so that its id stays unique
            self.encoded_rows += 1
        return self._outputs[key][1]


def reusing_features(
    cache: ImageFeatureCache | None, model: torch.nn.Module, image_inputs: Sequence[dict[str, torch.Tensor]]
) -> AbstractContextManager:
    """`cache.reuse(model, image_inputs)` while vision is frozen; nothing while it trains (`cache` None)."""
    return nullcontext() if cache is None else cache.reuse(model, image_inputs)
