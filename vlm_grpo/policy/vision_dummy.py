"""Keep ZeRO-3 processes in step when their micro-batches hold different kinds of media.

Under ZeRO-3 every process gathers each module's parameter shards collectively, in the order the modules run. A
process whose micro-batch has no image never runs the vision tower, while another one does: their gathers stop
matching and the job aborts or hangs. Images and videos are two runs of the vision tower (the model's
`get_image_features` and `get_video_features`), so a micro-batch with both beside one with images only desyncs too.
The fix is to make every forward run the vision tower on the same kinds of media on every process: the processes
share which kinds their micro-batches hold (`media_needed`), and one that lacks a kind gets one extra row, a tiny
blank prompt of the kinds it lacks (`dummy_media_prompt`), whose first completion token is scored, and whose log-prob
is added to the real ones multiplied by zero. The vision tower then runs the same calls in the forward and, with
zero gradients, in the backward on every process; the real rows' values and gradients are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image
from transformers import ProcessorMixin

from ..models import EncodedPrompt, ModelFamily

MEDIA_KINDS = ("image", "video")


def media_kinds(family: ModelFamily, image_inputs: Sequence[dict]) -> tuple[bool, bool]:
    """Whether any of a micro-batch's rows holds an image, and whether any holds a video.

    Args:
        family (`ModelFamily`): the model's family (its `image_input_keys` and `video_input_keys`).
        image_inputs (`Sequence[dict]`): the per-sample image and video tensors.
    """
    has_image = any(family.image_input_keys[0] in row for row in image_inputs)
    has_video = bool(family.video_input_keys) and any(
        family.video_input_keys[0] in row for row in image_inputs
    )
    return has_image, has_video


def media_needed(family: ModelFamily, image_inputs: Sequence[dict], device: torch.device) -> frozenset[str]:
    """The kinds of media this process's micro-batch lacks and must add as a dummy row: those that any process's
    micro-batch holds (an image when none holds any, so that every forward runs the vision tower, as it always did).

    A collective: every process calls it once per micro-batch, in the same order.

    Args:
        family (`ModelFamily`): the model's family.
        image_inputs (`Sequence[dict]`): this process's per-sample image and video tensors.
        device (`torch.device`): the device of the collective's tensor.
    """
    held = torch.tensor(media_kinds(family, image_inputs), dtype=torch.int64, device=device)  # [2]
    anywhere = held.clone()
    torch.distributed.all_reduce(anywhere, op=torch.distributed.ReduceOp.MAX)
    if not anywhere.any():
        anywhere[0] = 1
    return frozenset(kind for kind, h, a in zip(MEDIA_KINDS, held.tolist(), anywhere.tolist()) if a and not h)


def dummy_media_prompt(
    family: ModelFamily, processor: ProcessorMixin, device: torch.device, kinds: frozenset[str]
) -> EncodedPrompt:
    """A prompt of no text and the media `kinds` (a 56x56 black image; a video of two such frames), encoded by the
    family's module, tensors on `device`."""
    blank = Image.new("RGB", (56, 56))
    content = [{"type": kind} for kind in MEDIA_KINDS if kind in kinds] + [{"type": "text", "text": ""}]
    videos = [{"path": None, "frames": [blank, blank]}] if "video" in kinds else None
    images = [blank] if "image" in kinds else []
    item = family.encode_prompt(processor, [{"role": "user", "content": content}], images, None, videos)
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
    """Append the dummy media row to a micro-batch (prompts widened on the left if the dummy's is longer).

    Args:
        input_ids (`torch.Tensor`): `[b, P+C]` left-padded prompts followed by completions.
        attention_mask (`torch.Tensor`): `[b, P+C]`.
        logits_to_keep (`int`): C.
        image_inputs (`Sequence[dict]`): the b per-sample image dicts.
        dummy (`EncodedPrompt`): from `dummy_media_prompt`.
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
