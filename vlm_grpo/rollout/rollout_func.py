"""The user's `rollout_func`, called as TRL 1.16 calls it: `rollout_func(prompts, trainer)`.

It gets the rows' multimodal prompts and returns `prompt_ids`, `completion_ids`, `logprobs` and any other fields,
which reach the rewards as columns (`env_mask` masks tokens out of the loss, as TRL's tool mask). The prompt of a row
with images must be the trainer's own encoding of it (`trainer.processing_class` through `apply_chat_template`,
images expanded), so that its image inputs fit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trl.data_utils import prepare_multimodal_messages

from ..errors import VLMGRPOError
from ..models import EncodedPrompt

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


@dataclass
class RolledOut:
    """What a `rollout_func` returned, per row.

    Attributes:
        inputs (`list[dict]`): the dataset rows with the function's other fields added (new dicts).
        encoded (`list[EncodedPrompt]`): the trainer's encoding of each row's prompt, or the function's own ids for a
            text-only row whose ids differ.
        completion_ids (`list[list[int]]`): the function's completions.
        logprobs (`list[list[float]]`): the function's sampling log-probs.
        tool_mask (`list[list[int]] | None`): its `env_mask`, if any.
    """

    inputs: list[dict[str, Any]]
    encoded: list[EncodedPrompt]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    tool_mask: list[list[int]] | None


def call_rollout_func(
    rollout_func: Callable[[list], dict[str, Any]],
    rows: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    encoded: list[EncodedPrompt],
) -> RolledOut:
    """Call `rollout_func` on the rows' prompts and check what it returns.

    Args:
        rollout_func (`Callable[[list], dict]`): the user's function with the trainer bound as its second argument.
        rows (`list[dict]`): `{"prompt", "images", "videos"}` per row (`data.rows.load_rows`).
        inputs (`list[dict]`): the dataset rows (not modified).
        encoded (`list[EncodedPrompt]`): the trainer's encoding of each row's prompt.

    Raises:
        `ValueError`: a required key is missing (TRL's message).
        `VLMGRPOError`: a row with images was not encoded as the trainer encodes it.
    """
    prompts = [prepare_multimodal_messages(r["prompt"], images=r["images"]) for r in rows]
    output = rollout_func(copy.deepcopy(prompts))
    missing = sorted(set(REQUIRED) - output.keys())
    if missing:
        raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
    extra = {k: v for k, v in output.items() if k not in REQUIRED}
    tool_mask = extra.pop("env_mask", None)
    columns = []
    for i, x in enumerate(inputs):  # the rewards get the other fields as columns, as TRL merges them
        fields = {k: v[i] for k, v in extra.items() if isinstance(v, list) and i < len(v)}
        fields.update({k: v for k, v in extra.items() if not isinstance(v, list)})
        columns.append({**x, **fields})  # new dicts: the dataset's rows stay as they are
    own = []
    for i, (ids, item) in enumerate(zip(output["prompt_ids"], encoded, strict=True)):
        if list(ids) == item.input_ids:
            own.append(item)
        elif item.num_images:
            raise VLMGRPOError(
                f"rollout_func: row {i}'s prompt_ids ({len(ids)} tokens) are not the trainer's encoding of its "
                f"prompt with its {item.num_images} image(s) ({len(item.input_ids)} tokens); render prompts with "
                "trainer.processing_class.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True), "
                "which expands the image placeholders."
            )
        else:  # a text-only row: the function's own ids
            own.append(EncodedPrompt(input_ids=list(ids), image_inputs={}, num_images=0))
    completions = [list(c) for c in output["completion_ids"]]
    return RolledOut(columns, own, completions, output["logprobs"], tool_mask)
