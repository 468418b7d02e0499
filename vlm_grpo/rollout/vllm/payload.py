"""Prompts and images for TRL's vLLM backend (TRL 1.16, `trl.generation.vllm_generation.VLLMGeneration`).

TRL calls `generate(prompts, images, num_generations, profiler=None)` with `prompts` token ids (one list per row,
each prompt's G copies consecutive) and `images` the raw PIL images per row (`None` for a text-only row, `None`
altogether when no row has any); it returns `(prompt_ids, completion_ids, logprobs, logprob_token_ids)` per row,
`logprobs[i][t][0]` being the sampled token's log-prob.

Colocate mode hands each row to `LLM.generate` as `{"prompt_token_ids": ids, "multi_modal_data": {"image": ...}}`
and vLLM's own processor expands the image placeholders, so the ids must hold ONE placeholder per image as the chat
template writes it (Qwen `<|image_pad|>`, InternVL `<IMG_CONTEXT>`, Gemma 3 `<start_of_image>`); processor-expanded
ids get expanded twice (TRL issue #6294). Server mode places server-computed image features on the runs of image
tokens instead, so it needs the processor-expanded ids. Wiring in `VLMGRPOTrainer._sample_with_vllm`::

    payload = build_vllm_payload(self.processing_class, self.family, rows, encoded, chat_template_kwargs)
    kwargs = vllm_generate_kwargs(payload, num_generations, self.vllm_mode, expanded_prompt_ids=prompt_ids)
    _, completion_ids, logprobs, _ = self.vllm_generation.generate(
        **kwargs, profiler=profiling_context(self, "vLLM.generate"))
    sampling_logps = [[lp[0] for lp in seq] for seq in logprobs]  # sampled-token log-probs

Videos (colocate mode only) go beside the images as the frames the family's video processor samples, with their
metadata (`ModelFamily.vllm_video`), one video placeholder per video in the ids; `add_videos` puts them in the
engine's inputs, since TRL's `generate` passes images only (see `vllm_generation.ColocatedVideos`). vLLM's
expanded prompts are checked against the trainer's (`check_vllm_prompts`).

Training keeps the processor-expanded ids and image tensors; only the completions come from vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import VLMGRPOError

if TYPE_CHECKING:  # TRL and transformers are imported where they are used: the checks below run before them
    import torch
    from transformers import PretrainedConfig

    from ...models import ModelFamily

logger = logging.getLogger(__name__)

VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head dims that vLLM 0.31's CPU attention backend runs (`CPUAttentionBackend.get_supported_head_sizes()`
in `vllm/v1/attention/backends/cpu_attn.py`); any other fails in the engine's first forward with "Unsupported CPU
attention configuration: head_dim=...". A `vllm`-marked test compares it with the installed vLLM."""

VLLM_CPU_LINEAR_HEAD_DIMS = (64, 128)
"""Key and value head dims of the linear-attention (gated delta net) layers of Qwen3.5 that vLLM 0.31's CPU kernels
run; any other fails with "Unexpected head dim size"."""


@dataclass
class VLLMPayload:
    """Prompts for vLLM, one entry per dataset row.

    Attributes:
        texts (`list[str]`): chat-templated prompts (generation prompt added), one placeholder per image.
        prompt_ids (`list[list[int]]`): `texts` tokenized by the tokenizer alone (no special tokens added).
        images (`list[list[PIL.Image.Image] | None] | None`): each row's images, the row's own objects in
            placeholder order; `None` for a text-only row, and `None` altogether when no row has an image.
        videos (`list[list[tuple] | None] | None`, defaults to None): each row's videos as vLLM takes them
            (`ModelFamily.vllm_video`: sampled frames and their metadata), in placeholder order; `None` for a row
            without video, and `None` altogether when no row has one.
    """

    texts: list[str]
    prompt_ids: list[list[int]]
    images: list[list[Any] | None] | None
    videos: list[list[tuple[Any, dict[str, Any]]] | None] | None = None


def _image_parts(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `{"type": "image"}` entries of a conversational prompt in order, tool messages left out (as TRL)."""
    return [
        part
        for m in messages
        if isinstance(m.get("content"), list) and m["role"] != "tool"
        for part in m["content"]
        if part.get("type") == "image"
    ]


def build_vllm_payload(
    processor: Any,
    family: ModelFamily,
    rows: Sequence[dict[str, Any]],
    encoded: Sequence[Any] | None = None,
    chat_template_kwargs: dict[str, Any] | list[dict[str, Any]] | None = None,
) -> VLLMPayload:
    """Render rows for vLLM: chat-templated prompts with unexpanded placeholders and the raw images.

    Args:
        processor (`ProcessorMixin`): the model's processor; only its chat template and tokenizer run.
        family (`ModelFamily`): the family's module; it names the token written once per image.
        rows (`Sequence[dict]`): `{"prompt", "images"}` per row, images loaded (see `vlm_grpo.rollout.batch.load_rows`);
            `prompt` is a list of messages whose content may hold `{"type": "image"}` entries.
        encoded (`Sequence[EncodedPrompt] | None`, defaults to None): the trainer's encodings of the same rows;
            rows sharing one encoding object are one prompt and rendered once. None renders every row.
        chat_template_kwargs (`dict | list[dict] | None`, defaults to None): extra `apply_chat_template` arguments,
            the same as the training prompts are rendered with (TRL's `chat_template_kwargs`, with tools each row's
            tools): one dict for every row, or one per row.

    Returns:
        `VLLMPayload`: one text, id list and image list per row, in row order.

    Raises:
        `VLMGRPOError`: a prompt's image entries do not match its images, or its placeholders are already expanded.
    """
    from trl.data_utils import prepare_multimodal_messages

    tokenizer = processor.tokenizer
    placeholder, placeholder_id = family.prompt_image_token(processor)
    expanded_ids = {family.image_token_id(processor)} - {placeholder_id}
    texts: list[str] = []
    prompt_ids: list[list[int]] = []
    images: list[list[Any] | None] = []
    videos: list[list[tuple[Any, dict[str, Any]]] | None] = []
    for i, row in enumerate(rows):
        if encoded is not None and i > 0 and encoded[i] is encoded[i - 1]:
            texts.append(texts[-1])  # the next copy of the same prompt (groups repeat each prompt G times)
            prompt_ids.append(list(prompt_ids[-1]))
            images.append(images[-1])
            videos.append(videos[-1])
            continue
        prompt, images_of_row = row["prompt"], list(row["images"])
        if not isinstance(prompt, list):
            raise VLMGRPOError(
                f"Row {i}: vLLM payloads need conversational prompts, got {type(prompt).__name__}."
            )
        entries = sum("image" not in part for part in _image_parts(prompt))
        if entries != len(images_of_row) and any(isinstance(m.get("content"), list) for m in prompt):
            raise VLMGRPOError(
                f"Row {i}: the prompt has {entries} image entries but {len(images_of_row)} images."
            )
        messages = prepare_multimodal_messages(prompt, images=images_of_row)
        ordered = [part["image"] for part in _image_parts(messages)]
        row_kwargs = (
            chat_template_kwargs[i] if isinstance(chat_template_kwargs, list) else chat_template_kwargs
        )
        text = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(row_kwargs or {})
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        n_placeholders = ids.count(placeholder_id)
        n_expanded = sum(t in expanded_ids for t in ids)
        if n_placeholders > len(ordered) or n_expanded:
            raise VLMGRPOError(
                f"Row {i}: the prompt holds {n_placeholders + n_expanded} image tokens for {len(ordered)} "
                f"image(s): its placeholders are already expanded, but vLLM expands them itself and needs "
                f"one {placeholder} per image."
            )
        if n_placeholders < len(ordered):
            raise VLMGRPOError(
                f"Row {i}: the chat template wrote {n_placeholders} {placeholder} for {len(ordered)} images."
            )
        row_videos = list(row.get("videos") or [])
        if row_videos:
            video_token, video_id = family.prompt_video_token(processor)
            if ids.count(video_id) != len(row_videos):
                raise VLMGRPOError(
                    f"Row {i}: the prompt holds {ids.count(video_id)} {video_token} for {len(row_videos)} "
                    f"video(s); vLLM expands the placeholders itself and needs one {video_token} per video."
                )
        texts.append(text)
        prompt_ids.append(ids)
        images.append(ordered or None)
        videos.append([family.vllm_video(processor, video) for video in row_videos] or None)
    return VLLMPayload(
        texts,
        prompt_ids,
        images if any(x is not None for x in images) else None,
        videos if any(x is not None for x in videos) else None,
    )


def vllm_generate_kwargs(
    payload: VLLMPayload,
    num_generations: int,
    mode: str = "colocate",
    expanded_prompt_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for TRL's `VLLMGeneration.generate` (add `profiler=` yourself).

    Args:
        payload (`VLLMPayload`): from `build_vllm_payload`, one entry per row.
        num_generations (`int`): G, the consecutive copies of each prompt among the rows.
        mode (`str`, defaults to "colocate"): TRL's `vllm_mode`, "colocate" or "server".
        expanded_prompt_ids (`Sequence[Sequence[int]] | None`, defaults to None): the processor-expanded ids of the
            same rows; required in server mode, whose image features are placed on the runs of image tokens.

    Returns:
        `dict`: `{"prompts": ..., "images": ..., "num_generations": ...}`.
    """
    if mode == "colocate":
        prompts = [list(ids) for ids in payload.prompt_ids]
    elif mode == "server":
        if expanded_prompt_ids is None or len(expanded_prompt_ids) != len(payload.prompt_ids):
            raise VLMGRPOError("vLLM server mode needs the processor-expanded prompt ids of every row.")
        prompts = [list(ids) for ids in expanded_prompt_ids]
    else:
        raise VLMGRPOError(f"vllm_mode must be 'colocate' or 'server', got {mode!r}.")
    return {"prompts": prompts, "images": payload.images, "num_generations": num_generations}


def vllm_history_prompts(
    family: ModelFamily, processor: Any, histories: Sequence[Sequence[int]], mode: str = "colocate"
) -> list[list[int]]:
    """The ids of multi-turn rows (prompt, turns, tool results; placeholders expanded) as TRL's `generate` hands them
    to vLLM for the next turn, as `vllm_generate_kwargs` does for first turns.

    Args:
        family (`ModelFamily`): the family's module (`ModelFamily.vllm_history_ids`).
        processor (`Any`): the family's processor.
        histories (`Sequence[Sequence[int]]`): each row's ids, as TRL's tool loop builds them.
        mode (`str`, defaults to "colocate"): TRL's `vllm_mode`. Colocate: one placeholder per image, which vLLM
            expands itself. Server: as they are, the server placing each image's features on its run of image tokens.

    Returns:
        `list[list[int]]`: one list per row.
    """
    if mode == "server":
        return [list(ids) for ids in histories]
    return [family.vllm_history_ids(processor, ids) for ids in histories]


def vllm_prompt_inputs(payload: VLLMPayload) -> list[dict[str, Any]]:
    """The inputs TRL's colocate mode hands to `vllm.LLM.generate` (with the videos `add_videos` adds), for calling
    vLLM directly (tests, eval)."""
    images = payload.images or [None] * len(payload.prompt_ids)
    inputs = []
    for ids, images_of_row in zip(payload.prompt_ids, images, strict=True):
        item: dict[str, Any] = {"prompt_token_ids": list(ids)}
        if images_of_row:
            item["multi_modal_data"] = {
                "image": images_of_row if len(images_of_row) > 1 else images_of_row[0]
            }
        inputs.append(item)
    return add_videos(inputs, payload.videos)


def add_videos(
    inputs: Sequence[dict[str, Any]], videos: Sequence[list[tuple[Any, dict[str, Any]]] | None] | None
) -> list[dict[str, Any]]:
    """vLLM prompt inputs with each row's videos added to its `multi_modal_data`, and the rate their frames were
    sampled at passed to vLLM's processor (`mm_processor_kwargs`, as the trainer passes it to its own: Qwen2.5-VL
    turns it into each temporal patch's duration).

    Args:
        inputs (`Sequence[dict]`): one `{"prompt_token_ids", "multi_modal_data"?}` per row, as TRL builds them.
        videos (`Sequence[list | None] | None`): `VLLMPayload.videos`, the same rows in the same order.
    """
    from transformers.video_utils import VideoMetadata

    if videos is None:
        return list(inputs)
    if len(videos) != len(inputs):
        raise VLMGRPOError(f"{len(inputs)} vLLM prompts for {len(videos)} rows of videos.")
    out = []
    for item, row_videos in zip(inputs, videos, strict=True):
        if row_videos:
            rates = [
                VideoMetadata(**{k: v for k, v in meta.items() if k != "do_sample_frames"}).sampled_fps
                for _, meta in row_videos
            ]
            data = {
                **item.get("multi_modal_data", {}),
                "video": row_videos if len(row_videos) > 1 else row_videos[0],
            }
            fps = rates[0] if len(set(rates)) == 1 else rates
            item = {**item, "multi_modal_data": data, "mm_processor_kwargs": {"fps": fps}}
        out.append(item)
    return out


def check_vllm_prompts(
    vllm_prompt_ids: Sequence[Sequence[int]], trainer_prompt_ids: Sequence[Sequence[int]]
) -> None:
    """Check that vLLM expanded each row's prompt into the ids the trainer trains on (colocate mode).

    vLLM's own processor expands the image and video placeholders; where its settings differ from the trainer's
    processor (image or video sizes, frame rate), the completions would be sampled for another prompt than the one
    they are trained on.

    Args:
        vllm_prompt_ids (`Sequence[Sequence[int]]`): the prompt ids vLLM returned, one per row.
        trainer_prompt_ids (`Sequence[Sequence[int]]`): the trainer's processor-expanded prompt ids of the same rows.

    Raises:
        `VLMGRPOError`: a row's ids differ.
    """
    for row, (theirs, ours) in enumerate(zip(vllm_prompt_ids, trainer_prompt_ids, strict=True)):
        if list(theirs) != list(ours):
            raise VLMGRPOError(
                f"vLLM expanded row {row}'s prompt into {len(theirs)} tokens where the trainer's processor wrote "
                f"{len(ours)} (or other ids): give the model folder's processor the image and video settings the "
                "training uses, or set use_vllm: false."
            )


def check_vllm_architecture(family: ModelFamily) -> None:
    """Refuse, in one line, a family whose architecture the installed vLLM does not implement.

    Args:
        family (`ModelFamily`): the family's module; its `model_class()` names the architecture vLLM must load.

    Raises:
        `VLMGRPOError`: vLLM has no model class for this architecture.
    """
    import vllm
    from vllm import ModelRegistry

    architecture = family.model_class().__name__
    if architecture not in ModelRegistry.get_supported_archs():
        raise VLMGRPOError(
            f"vLLM {vllm.__version__} does not implement {family.model_type} ({architecture}); set use_vllm: false "
            "to generate with transformers, or install a vLLM that supports it."
        )


def check_vllm_cpu_attention(
    family: ModelFamily, config: PretrainedConfig, device: torch.device | str, model: str = "the model"
) -> None:
    """Refuse, in one line, a model whose attention head dims vLLM's CPU backend cannot run, when `device` is a CPU.

    vLLM's CPU kernels are compiled for a fixed set of head dims (`VLLM_CPU_HEAD_DIMS`, and `VLLM_CPU_LINEAR_HEAD_DIMS`
    for linear attention); with another one, the engine fails in its first forward, after a minute of loading, in a
    long traceback. On a GPU vLLM runs other kernels, and nothing is checked.

    Args:
        family (`ModelFamily`): the family's module (`ModelFamily.attention_head_dims`).
        config (`PretrainedConfig`): the model's config.
        device (`torch.device | str`): the device training runs on (`TrainingArguments.device`).
        model (`str`, *optional*, defaults to `"the model"`): how the message names the model (its path).

    Raises:
        `VLMGRPOError`: on a CPU, an attention or linear-attention head dim vLLM's CPU backend does not run.
    """
    if str(device).split(":")[0] != "cpu":
        return
    for kind, head_dim in family.attention_head_dims(config).items():
        supported = VLLM_CPU_LINEAR_HEAD_DIMS if kind.startswith("linear") else VLLM_CPU_HEAD_DIMS
        if head_dim not in supported:
            raise VLMGRPOError(
                f"{model}: vLLM's CPU backend cannot run {kind} head dim {head_dim}; it runs "
                f"{', '.join(map(str, supported))}. Set use_vllm: false, or use a model with one of those head dims "
                "(a `vlm-grpo tiny-model` folder has head dim hidden_size / 4: rebuild it with the default "
                "--hidden_size 256)."
            )


def warn_vllm_cpu_image_mask(
    family: ModelFamily, config: PretrainedConfig, device: torch.device | str
) -> bool:
    """Log one warning, when `device` is a CPU, if the model attends bidirectionally among an image's tokens.

    vLLM's CPU attention backend has no multimodal-prefix mask (`supports_mm_prefix()` is False, and the CPU platform
    selects it anyway): it attends causally over image tokens where Gemma 3 and Gemma 4 attend bidirectionally among
    them, so its log-probs of a prompt with images differ from the trainer's by more than rounding (a tenth or two on
    the tiny models). Training is unchanged: the trainer computes every log-prob it learns from, and TRL's
    importance-sampling correction weighs the difference. On a GPU, vLLM's attention applies the mask.

    Args:
        family (`ModelFamily`): the family's module (`ModelFamily.bidirectional_image_attention`).
        config (`PretrainedConfig`): the model's config.
        device (`torch.device | str`): the device training runs on (`TrainingArguments.device`).

    Returns:
        `bool`: whether the warning was logged.
    """
    if str(device).split(":")[0] != "cpu" or not family.bidirectional_image_attention(config):
        return False
    logger.warning(
        "vLLM's CPU attention attends causally over image tokens, where %s attends bidirectionally among each "
        "image's tokens: vLLM's log-probs of prompts with images differ from the trainer's (TRL's importance-sampling "
        "correction weighs it; on a GPU vLLM applies the model's mask).",
        family.model_type,
    )
    return True
