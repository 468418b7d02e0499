"""Keep ZeRO-3 processes in step when one holds only text-only prompts and another holds images.

Under ZeRO-3 every process gathers each module's parameter shards collectively, in the order the modules run. A
process whose micro-batch has no image never runs the vision tower, while another one does: their gathers stop
matching and the job aborts or hangs. The fix is to make every forward run the vision tower: a micro-batch without
images gets one extra row, a tiny blank image prompt whose first completion token is scored, and whose log-prob is
added to the real ones multiplied by zero. The vision tower then runs in the forward and, with zero gradients, in
the backward on every process; the real rows' values and gradients are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image
from transformers import ProcessorMixin

from .models import EncodedPrompt, ModelFamily


def dummy_image_prompt(family: ModelFamily, processor: ProcessorMixin, device: torch.device) -> EncodedPrompt:
    """A one-image prompt (a 56x56 black image, no text) encoded by the family's module, tensors on `device`."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ""}]}]
    item = family.encode_prompt(processor, messages, [Image.new("RGB", (56, 56))])
    item.image_inputs = {k: v.to(device) for k, v in item.image_inputs.items()}
    return item


def add_dummy_row(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    image_inputs: Sequence[dict],
    dummy: EncodedPrompt,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Append the dummy image row to a micro-batch (prompts widened on the left if the dummy's is longer).

    Args:
        input_ids (`torch.Tensor`): `[b, P+C]` left-padded prompts followed by completions.
        attention_mask (`torch.Tensor`): `[b, P+C]`.
        logits_to_keep (`int`): C.
        image_inputs (`Sequence[dict]`): the b per-sample image dicts.
        dummy (`EncodedPrompt`): from `dummy_image_prompt`.
        pad_id (`int`): the tokenizer's pad id.

    Returns:
        `(input_ids [b+1, P'+C], attention_mask [b+1, P'+C], image_inputs + [dummy.image_inputs])`; the dummy row's first
        completion token (a pad token) is unmasked so that its log-prob depends on the image.
    """
    prompt_len = input_ids.size(1) - logits_to_keep
    width = max(prompt_len, len(dummy.input_ids))
    grow = width - prompt_len
    if grow:
        input_ids = torch.cat([input_ids.new_full((input_ids.size(0), grow), pad_id), input_ids], dim=1)
        attention_mask = torch.cat(
            [attention_mask.new_zeros((input_ids.size(0), grow)), attention_mask], dim=1
        )
    ids = input_ids.new_full((1, width + logits_to_keep), pad_id)
    ids[0, width - len(dummy.input_ids) : width] = torch.tensor(dummy.input_ids)
    mask = torch.zeros_like(ids)
    mask[0, width - len(dummy.input_ids) : width + 1] = 1  # the prompt and one completion token
    return torch.cat([input_ids, ids]), torch.cat([attention_mask, mask]), [*image_inputs, dummy.image_inputs]


def drop_dummy_row(values: torch.Tensor) -> torch.Tensor:
    """`values` `[b+1, C]` without the dummy row, plus zero times it, so the backward reaches the vision tower."""
    return values[:-1] + 0.0 * values[-1:].sum()
