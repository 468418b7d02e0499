"""The per-model module interface: everything that differs between vision-language model families.

The trainer never asks which model it runs. It asks the module chosen by `config.model_type`
(see `vlm_grpo.models.get_model_family`) to load the model and processor, to encode a prompt with its images,
to assemble generate/forward inputs for a batch, which parameters belong to the vision tower, which tokens must
never be sampled, and which tokens end a completion. A module never owns a prompt or a reward.

Image tensors are kept **per sample** (`EncodedPrompt.image_inputs`): a dict of tensors whose first dimension indexes
this sample's images, patches or tiles. Slicing a batch is then list slicing, and mixing image and text-only
prompts, or several images per prompt, needs no bookkeeping. `collate` concatenates them back for a forward. A
family that reads video keeps a prompt's video tensors in the same dict, under its `video_input_keys`, or as images
where its model takes a video as the images of its frames (InternVL, GLM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, PreTrainedModel, ProcessorMixin
from trl.chat_template_utils import parse_response

from ..data.video_frames import decode_video, processor_video_kwargs, video_name
from ..data.videos import MIN_VIDEO_FRAMES
from ..device import resolve_attn_implementation, resolve_dtype
from ..errors import VLMGRPOError

REASONING_OPEN = "<think>"
"""The tag that opens a reasoning block in the chat templates that write one."""


def _parses_responses(tokenizer: Any) -> bool:
    """Whether the tokenizer declares how to parse its responses (`response_template`, or the older
    `response_schema`): TRL's `parse_response` then reads completions (tool calls, reasoning)."""
    return (
        getattr(tokenizer, "response_template", None) is not None
        or getattr(tokenizer, "response_schema", None) is not None
    )


@dataclass
class EncodedPrompt:
    """One prompt after the chat template and the processor.

    Attributes:
        input_ids (`list[int]`): prompt token ids, image placeholders already expanded.
        image_inputs (`dict[str, torch.Tensor]`): this sample's image and video tensors (e.g. `pixel_values`
            `[N_patches, D]` and `image_grid_thw` `[N_images, 3]` for Qwen, and `pixel_values_videos`, `video_grid_thw`
            for its videos). Empty for a text-only prompt.
        num_images (`int`): number of images in the prompt.
        num_videos (`int`, defaults to 0): number of videos in the prompt.
    """

    input_ids: list[int]
    image_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    num_images: int = 0
    num_videos: int = 0


class ModelFamily:
    """Base class of a model family module. Subclass it in one file per family and register it in `registry.py`.

    Class attributes a subclass sets:
        model_types (`tuple[str, ...]`): the `config.model_type` values it serves.
        vision_module_names (`tuple[str, ...]`): name fragments of the vision tower and projector modules
            (matched against `named_modules()` names split on "."), frozen by `freeze_vision_modules` and kept out
            of LoRA.
        image_input_keys (`tuple[str, ...]`): processor outputs that are per-image tensors (first dim = images,
            patches or tiles).
        reads_video (`bool`): whether the family's model reads video; a prompt with a video is refused otherwise.
        video_input_keys (`tuple[str, ...]`): processor outputs that are per-video tensors (first dim = videos or
            patches); empty where the processor returns a video as images (`image_input_keys`).
        video_frames_uncapped (`bool`): whether the family's video processor samples `fps` frames per second and caps
            no frame count; `video_max_frames` is then refused, and the folder's fixed `num_frames` (which would take
            precedence over `fps`) cleared.
        vllm_video_refusal (`str`): why videos with `use_vllm` are refused for the family (e.g. vLLM expands a video
            placeholder into other ids than the family's processor writes); empty where vLLM takes them.
        video_feature_keys (`tuple[str, ...]`): the arguments of the inner model's `get_video_features`, in order
            (as `image_input_keys` are those of its `get_image_features`); empty without video.
        placeholder_config_attrs (`tuple[str, ...]`): model-config attributes holding ids of the special tokens
            that stand for or delimit images/videos; they are suppressed during generation.
        placeholder_processor_attrs (`tuple[str, ...]`): processor or tokenizer attributes naming more such tokens.
        prompt_image_token_attr (`str`): the processor attribute naming the token the chat template writes once per
            image, before the processor expands it (vLLM expands it itself).
        indexable_cache (`bool`): whether the family's cache can be indexed from groups to rows exactly (see
            `vlm_grpo.policy.shared_prefix`); a family whose layers keep other state sets False and runs full rows.
    """

    model_types: ClassVar[tuple[str, ...]] = ()
    vision_module_names: ClassVar[tuple[str, ...]] = ()
    image_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values",)
    reads_video: ClassVar[bool] = False
    video_input_keys: ClassVar[tuple[str, ...]] = ()
    video_frames_uncapped: ClassVar[bool] = False
    vllm_video_refusal: ClassVar[str] = ""
    video_feature_keys: ClassVar[tuple[str, ...]] = ()
    placeholder_config_attrs: ClassVar[tuple[str, ...]] = ("image_token_id", "video_token_id")
    placeholder_processor_attrs: ClassVar[tuple[str, ...]] = ("image_token", "video_token")
    prompt_image_token_attr: ClassVar[str] = "image_token"
    indexable_cache: ClassVar[bool] = True

    def __init__(self, model_type: str | None = None):
        """Args: model_type (`str | None`): the `config.model_type` served; defaults to the first of `model_types`."""
        self.model_type = model_type or self.model_types[0]
        self.video_sampling = "processor"
        """How videos are sampled and sized (`configure_video`'s `sampler`): one of `video_samplers()`."""

    # ----------------------------------------------------------------------------------------------- loading
    def model_class(self) -> type:
        """The `transformers` class used to load the model (default: `AutoModelForImageTextToText`)."""
        return AutoModelForImageTextToText

    def model_init_kwargs(
        self,
        dtype: str | torch.dtype | None = None,
        attn_implementation: str | None = None,
        quantization_config: Any = None,
        trust_remote_code: bool = False,
        **extra: Any,
    ) -> dict[str, Any]:
        """Keyword arguments for `from_pretrained`.

        Args:
            dtype (`str | torch.dtype | None`, defaults to None): weight dtype; None = bf16 on GPU/NPU, fp32 on CPU.
            attn_implementation (`str | None`, defaults to None): attention kernel; falls back to sdpa when
                flash-attn is absent.
            quantization_config (`BitsAndBytesConfig | None`, defaults to None): 4-bit/8-bit quantization.
            trust_remote_code (`bool`, defaults to False): allow code from the checkpoint to run.
            **extra: passed through unchanged.
        """
        kwargs = dict(extra)
        kwargs["dtype"] = resolve_dtype(dtype)
        kwargs["attn_implementation"] = resolve_attn_implementation(attn_implementation)
        kwargs["trust_remote_code"] = trust_remote_code
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        return kwargs

    def load_model(self, path: str, **init_kwargs: Any) -> PreTrainedModel:
        """Load the model at `path` with the family's class; `init_kwargs` as from `model_init_kwargs`."""
        return self.model_class().from_pretrained(path, **init_kwargs)

    def load_processor(
        self,
        path: str,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
        trust_remote_code: bool = False,
    ) -> ProcessorMixin:
        """Load the processor, left-padding, and apply the family's image-size knobs.

        Args:
            path (`str`): model folder.
            min_pixels (`int | None`): lower bound on pixels per image after resizing (families that resize).
            max_pixels (`int | None`): upper bound on pixels per image after resizing; larger images are resized.
            max_tiles (`int | None`): most tiles per image (families that tile).
            trust_remote_code (`bool`, defaults to False): allow code from the checkpoint to run.
        """
        processor = AutoProcessor.from_pretrained(
            path, trust_remote_code=trust_remote_code, padding_side="left"
        )
        processor.tokenizer.padding_side = "left"
        self.configure_image_size(
            processor, min_pixels=min_pixels, max_pixels=max_pixels, max_tiles=max_tiles
        )
        return processor

    def configure_image_size(
        self,
        processor: ProcessorMixin,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> None:
        """Apply image-size limits to `processor` in place. The base family has none and rejects them."""
        given = {
            k: v
            for k, v in dict(min_pixels=min_pixels, max_pixels=max_pixels, max_tiles=max_tiles).items()
            if v is not None
        }
        if given:
            raise VLMGRPOError(
                f"{type(self).__name__} has no image-size knob {sorted(given)}; remove it from the config."
            )

    def configure_video(
        self,
        processor: ProcessorMixin,
        fps: float,
        max_frames: int | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        sampler: str = "processor",
    ) -> None:
        """Set how the family's video processor samples and sizes videos, in place. Nothing for a family that reads no
        video (a prompt with a video is refused when it is encoded).

        Args:
            processor (`ProcessorMixin`): the family's processor.
            fps (`float`): frames per second sampled from a video file, and the rate of a list of frame files.
            max_frames (`int | None`, defaults to None): most frames sampled from a video (None: the processor's).
            min_pixels (`int | None`, defaults to None): the video processor's lower pixel bound (family-specific).
            max_pixels (`int | None`, defaults to None): the video processor's upper pixel bound (family-specific).
            sampler (`str`, *optional*, defaults to `"processor"`): who samples and sizes videos, one of
                `video_samplers()`: `"processor"`, the family's video processor, or `"qwen_vl_utils"`, qwen-vl-utils
                as the Qwen model cards run it (`config.video_sampler`).

        Raises:
            `VLMGRPOError`: a bound or `sampler` the family does not take.
        """
        offered = self.video_samplers()
        if sampler not in offered:
            raise VLMGRPOError(
                f"video_sampler: {sampler} is not offered for {self.model_type} models, whose videos are sampled by: "
                f"{', '.join(offered)} (qwen_vl_utils is the Qwen-VL model cards' pipeline, for the Qwen families); "
                "set video_sampler: processor."
            )
        self.video_sampling = sampler
        if max_frames is not None and self.video_frames_uncapped:
            raise VLMGRPOError(
                f"{self.model_type}'s video processor samples video_fps frames per second and caps no frame count: "
                "remove video_max_frames (lower video_fps for long clips)."
            )
        if max_frames is not None and max_frames < MIN_VIDEO_FRAMES:
            raise VLMGRPOError(
                f"video_max_frames is {max_frames}, and a video needs at least {MIN_VIDEO_FRAMES} frames (the Qwen-VL "
                f"and GLM video encoders read frames in pairs); set video_max_frames: {MIN_VIDEO_FRAMES} or more."
            )
        if not self.reads_video:
            return
        video_processor = processor.video_processor
        video_processor.fps = fps
        if self.video_frames_uncapped:
            video_processor.num_frames = None
        elif max_frames is not None:
            video_processor.max_frames = max_frames
        if min_pixels is not None or max_pixels is not None:
            raise VLMGRPOError(
                f"{type(self).__name__} has no video pixel bounds; remove video_min_pixels and video_max_pixels."
            )

    def video_samplers(self) -> tuple[str, ...]:
        """The values of `config.video_sampler` the family takes: `"processor"` (its video processor's own sampling)
        only, by default."""
        return ("processor",)

    def video_sampler(self, processor: ProcessorMixin) -> Callable[..., Any]:
        """How the family picks the frames of a video file: `fn(metadata=VideoMetadata) -> indices`, by default its
        video processor's own `sample_frames` at the configured `fps` (see `configure_video`).

        Args:
            processor (`ProcessorMixin`): the family's processor, its video processor configured.
        """
        video_processor = processor.video_processor
        return partial(video_processor.sample_frames, fps=video_processor.fps)

    def no_video_reason(self) -> str:
        """Why the family reads no video, as the start of a one-line error (e.g. "gemma3 models read no video")."""
        return f"{self.model_type} models read no video"

    # ---------------------------------------------------------------------------------------------- tokens
    def placeholder_token_ids(self, processor: ProcessorMixin, model_config: Any) -> list[int]:
        """Ids of the image/video placeholder and delimiter tokens: they must never appear in a completion."""
        tokenizer = processor.tokenizer
        ids = [getattr(model_config, a, None) for a in self.placeholder_config_attrs]
        ids = [int(i) for i in ids if isinstance(i, int)]
        for attr in self.placeholder_processor_attrs:
            token = getattr(processor, attr, None) or getattr(tokenizer, attr, None)
            if token is None:
                continue
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is not None and token_id != tokenizer.unk_token_id:
                ids.append(int(token_id))
        return sorted(set(ids))

    def eos_token_ids(self, processor: ProcessorMixin, model: PreTrainedModel) -> list[int]:
        """Tokens that end a completion, as TRL's trainer takes them: the generation config's eos ids, preceded by the
        tokenizer's eos when they lack it. Evaluation ends completions on these, as training does."""
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        tokenizer_eos = processor.tokenizer.eos_token_id
        if tokenizer_eos is not None and tokenizer_eos not in eos:
            eos = [tokenizer_eos, *eos]
        return [int(e) for e in eos]

    def image_token_id(self, processor: ProcessorMixin) -> int:
        """Id of the token that stands for image features in the processor-expanded prompt."""
        return int(processor.tokenizer.convert_tokens_to_ids(processor.image_token))

    def prompt_image_token(self, processor: ProcessorMixin) -> tuple[str, int]:
        """`(token, id)` the chat template writes once per image (Qwen `<|image_pad|>`, Gemma 3 `<start_of_image>`)."""
        token = getattr(processor, self.prompt_image_token_attr)
        return token, int(processor.tokenizer.convert_tokens_to_ids(token))

    def prompt_video_token(self, processor: ProcessorMixin) -> tuple[str, int]:
        """`(token, id)` the chat template writes once per video (Qwen `<|video_pad|>`), which vLLM expands itself."""
        token = processor.video_token
        return token, int(processor.tokenizer.convert_tokens_to_ids(token))

    def vllm_video(self, processor: ProcessorMixin, video: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """One video as vLLM takes it in `multi_modal_data`: the frames the family's video processor samples (as
        `encode_prompt` decodes them) and their metadata, marked as already sampled so that vLLM samples no further.

        Args:
            processor (`ProcessorMixin`): the family's processor, its video processor configured.
            video (`dict`): the video as the dataset stores it (`{"path", "frames"}`).

        Raises:
            `VLMGRPOError`: videos are sampled by another than the processor (`video_sampler`), whose frames vLLM's
                processor would resize again.
        """
        if self.video_sampling != "processor":
            raise VLMGRPOError(
                f"video_sampler: {self.video_sampling} frames do not reach vLLM unchanged (its processor resizes them "
                "again); set use_vllm: false, or video_sampler: processor."
            )
        decoded = decode_video(
            video, processor.video_processor, processor.video_processor.fps, self.video_sampler(processor)
        )
        metadata = {
            "total_num_frames": decoded.metadata.total_num_frames,
            "fps": decoded.metadata.fps,
            "width": decoded.metadata.width,
            "height": decoded.metadata.height,
            "duration": decoded.metadata.duration,
            "video_backend": decoded.metadata.video_backend,
            "frames_indices": list(decoded.metadata.frames_indices),
            "do_sample_frames": False,
        }
        return decoded.frames, metadata

    def vllm_history_ids(self, processor: ProcessorMixin, ids: Sequence[int]) -> list[int]:
        """A row's ids as vLLM takes them with the row's images: one placeholder per image, which vLLM's processor
        expands itself (it would expand an already expanded one again). The trainer's rows hold them expanded, as the
        history of a turn after a tool result does: where the template's placeholder is the expanded token itself
        (Qwen's `<|image_pad|>`), each run of it is one image.

        Args:
            processor (`ProcessorMixin`): the family's processor.
            ids (`Sequence[int]`): the row's ids, placeholders expanded (an empty row checks that the family can).

        Raises:
            `VLMGRPOError`: the family's placeholder is not its expanded token (it would need a mapping of its own).
        """
        placeholder, placeholder_id = self.prompt_image_token(processor)
        if placeholder_id != self.image_token_id(processor):
            raise VLMGRPOError(
                f"tools with use_vllm on {self.model_type}: its image placeholder {placeholder} is not the token it "
                "expands to, so a tool-calling history cannot be handed to vLLM yet; set use_vllm: false."
            )
        collapsed: list[int] = []
        for token in ids:
            if not (token == placeholder_id and collapsed and collapsed[-1] == placeholder_id):
                collapsed.append(token)
        return collapsed

    def image_tokens(
        self,
        model_config: Any,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_tiles: int | None = None,
    ) -> int | None:
        """Placeholder tokens one image of `width` x `height` pixels takes in a prompt, as the family's processor
        expands it with these image-size settings (None: the checkpoint's); None when the family cannot say
        without running its processor. Used by `vlm-grpo plan`."""
        return None

    def video_tokens(
        self,
        model_config: Any,
        frames: int,
        width: int,
        height: int,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> int | None:
        """Placeholder tokens one video of `frames` sampled frames of `width` x `height` pixels takes in a prompt, as
        the family's video processor counts them with these size bounds (None: its own); None for a family that reads
        no video. Used by `vlm-grpo plan`."""
        return None

    def attention_head_dims(self, model_config: Any) -> dict[str, int]:
        """The language model's head dims by attention kind (`"attention"`, and for hybrid models `"linear-attention
        key"` / `"linear-attention value"`): what an inference engine's kernels must support.

        Args:
            model_config (`PretrainedConfig`): the model's config.
        """
        text = model_config.get_text_config()
        return {"attention": getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads}

    def context_length(self, model_config: Any) -> int | None:
        """Most tokens (prompt + completion) the language model places, or None when its config does not say."""
        return getattr(model_config.get_text_config(), "max_position_embeddings", None)

    # --------------------------------------------------------------------------------------------- encoding
    def encode_prompt(
        self,
        processor: ProcessorMixin,
        messages: list[dict],
        images: Sequence[Any] | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        videos: Sequence[dict[str, Any]] | None = None,
    ) -> EncodedPrompt:
        """Apply the chat template and the processor to one conversational prompt.

        Args:
            processor (`ProcessorMixin`): the family's processor.
            messages (`list[dict]`): conversational prompt whose user content holds `{"type": "image"}` and
                `{"type": "video"}` entries.
            images (`Sequence[PIL.Image.Image] | None`): the images, in placeholder order.
            chat_template_kwargs (`dict | None`, defaults to None): extra arguments of `apply_chat_template` (e.g.
                `{"enable_thinking": False}`), as TRL's `chat_template_kwargs`.
            videos (`Sequence[dict] | None`, defaults to None): the videos as the dataset stores them
                (`{"path", "frames"}`), in placeholder order; decoded here with the configured sampling
                (`video_inputs`).
        """
        text = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
        )
        images = list(images) if images else []
        videos = list(videos) if videos else []
        for kind, given in (("image", images), ("video", videos)):
            num_placeholders = sum(
                1
                for m in messages
                if isinstance(m["content"], list)
                for part in m["content"]
                if part["type"] == kind
            )
            if num_placeholders != len(given):
                raise VLMGRPOError(
                    f"The prompt has {num_placeholders} {kind} entries but {len(given)} {kind}s were given; "
                    f"each {kind} needs exactly one {{'type': '{kind}'}} entry in the prompt."
                )
        video_kwargs = {}
        if videos:
            if not self.reads_video:
                raise VLMGRPOError(
                    f"{self.no_video_reason()}, but a prompt holds {len(videos)} (first: {video_name(videos[0])}); "
                    "remove the videos from the data, or train a family that reads video (see docs/families.md)."
                )
            video_kwargs = self.video_inputs(processor, videos)
        encoded = processor(text=[text], images=images or None, return_tensors="pt", **video_kwargs)
        keys = self.image_input_keys + self.video_input_keys if images or videos else ()
        image_inputs = {k: torch.as_tensor(encoded[k]) for k in keys if k in encoded}
        return EncodedPrompt(
            input_ids=encoded["input_ids"][0].tolist(),
            image_inputs=image_inputs,
            num_images=len(images),
            num_videos=len(videos),
        )

    def video_inputs(self, processor: ProcessorMixin, videos: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The processor arguments of a prompt's videos: each decoded with the frames its video processor samples
        (`video_sampler`, `vlm_grpo.data.video_frames.decode_video`), and no second sampling.

        Args:
            processor (`ProcessorMixin`): the family's processor, its video processor configured.
            videos (`Sequence[dict]`): the videos as the dataset stores them (`{"path", "frames"}`), in placeholder
                order (not empty).
        """
        fps, sampler = processor.video_processor.fps, self.video_sampler(processor)
        return processor_video_kwargs(
            [decode_video(v, processor.video_processor, fps, sampler) for v in videos]
        )

    def encode_images(self, processor: ProcessorMixin, images: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The image inputs of `images` as the processor makes them inside a prompt (one placeholder each), e.g. for
        the images a tool returned in the middle of a completion.

        Args:
            processor (`ProcessorMixin`): the family's processor.
            images (`Sequence[PIL.Image.Image]`): the images, in order.
        """
        token, _ = self.prompt_image_token(processor)
        encoded = processor(text=[token * len(images)], images=list(images), return_tensors="pt")
        return {k: encoded[k] for k in self.image_input_keys if k in encoded}

    def decode_completions(
        self,
        processor: ProcessorMixin,
        completion_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[Sequence[int]],
        tools: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Conversational completions `[[{"role": "assistant", ...}], ...]` from sampled ids, as TRL builds them.

        A tokenizer that declares how to parse its responses (`response_template` or `response_schema`, e.g. to
        split out reasoning or tool calls) is used through TRL's `parse_response`; otherwise the ids are decoded
        without special tokens.

        Args:
            processor (`ProcessorMixin`): the family's processor.
            completion_ids (`Sequence[Sequence[int]]`): the sampled ids of each row.
            prompt_ids (`Sequence[Sequence[int]]`): each row's prompt ids (the parser's prefix).
            tools (`Sequence`, *optional*, defaults to `None`): each row's tools, which type the tool calls'
                arguments.
        """
        tokenizer = processor.tokenizer
        if _parses_responses(tokenizer):
            tools = tools or [None] * len(completion_ids)
            return [
                [parse_response(tokenizer, ids, prefix=p, tools=t or None)]
                for ids, p, t in zip(completion_ids, prompt_ids, tools, strict=True)
            ]
        texts = processor.batch_decode(completion_ids, skip_special_tokens=True)
        return [[{"role": "assistant", "content": text}] for text in texts]

    def completions_open_in_reasoning(
        self, processor: ProcessorMixin, chat_template_kwargs: dict[str, Any] | None = None
    ) -> bool:
        """Whether the decoded completions start inside a reasoning block that the generation prompt opened: the
        template writes `<think>` at the end of it (Qwen3.5 4B and larger, unless `enable_thinking: false`), so the
        model's text holds `</think>` but not `<think>`. False where the tokenizer parses responses
        (`decode_completions`), which splits the reasoning out as `reasoning_content`.

        Args:
            processor (`ProcessorMixin`): the family's processor.
            chat_template_kwargs (`dict[str, Any]`, *optional*, defaults to `None`): the template options the
                prompts are rendered with (`GRPOConfig.chat_template_kwargs`).
        """
        if _parses_responses(processor.tokenizer):
            return False
        conversation = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
        text = processor.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
        )
        return text.rstrip().endswith(REASONING_OPEN)

    def collate(self, image_inputs: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Concatenate per-sample image (and video) tensors of a batch along dim 0 (text-only samples contribute
        nothing)."""
        keys = [
            k for k in self.image_input_keys + self.video_input_keys if any(k in row for row in image_inputs)
        ]
        return {k: torch.cat([row[k] for row in image_inputs if k in row], dim=0) for k in keys}

    def token_type_inputs(self, input_ids: torch.Tensor, model_config: Any) -> dict[str, torch.Tensor]:
        """Per-token inputs the family derives from the ids (e.g. which tokens are image tokens). None by default."""
        return {}

    def bidirectional_image_attention(self, model_config: Any) -> bool:
        """Whether the language model attends bidirectionally among each image's tokens, a mask its token types
        (`token_type_inputs`) carry and nothing else. False by default: causal attention over every token.

        Args:
            model_config (`PretrainedConfig`): the model's config.
        """
        return False

    def model_inputs(
        self,
        model_config: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_inputs: Sequence[dict[str, torch.Tensor]],
        causal_images: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Inputs for `generate` or `forward` of a batch.

        Args:
            model_config (`PretrainedConfig`): the model's config (token ids of image placeholders).
            input_ids (`torch.Tensor`): `[B, L]` token ids (left-padded prompts, maybe followed by completions).
            attention_mask (`torch.Tensor`): `[B, L]`.
            image_inputs (`Sequence[dict]`): the per-sample image tensors of the same B samples, in order.
            causal_images (`bool`, *optional*, defaults to `False`): attend causally over image tokens where the
                model attends bidirectionally among them (`bidirectional_image_attention`), as vLLM's CPU attention
                does (see `vlm_grpo.rollout.vllm.payload.warn_vllm_cpu_image_mask`).
        """
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        images = self.collate(image_inputs)
        if images:
            device = input_ids.device
            inputs.update({k: v.to(device) for k, v in images.items()})
            if not (causal_images and self.bidirectional_image_attention(model_config)):
                inputs.update(self.token_type_inputs(input_ids, model_config))
        return inputs

    # ----------------------------------------------------------------------------------------- image encoder
    def image_encoder_owner(self, model: PreTrainedModel) -> torch.nn.Module:
        """The submodule whose `get_image_features(pixel_values, ...)` the forward calls (the inner model)."""
        return model.model

    def join_image_features(self, outputs: Sequence[Any]) -> Any:
        """One `get_image_features` output from the outputs of several rows, as one batched call returns it.

        Tensors are concatenated along dim 0 and sequences (per-image tuples) chained; fields that are None stay None.
        """
        joined = {}
        for key, first in outputs[0].items():
            values = [o[key] for o in outputs]
            if isinstance(first, torch.Tensor):
                joined[key] = torch.cat(values, dim=0)
            elif isinstance(first, (tuple, list)):
                joined[key] = type(first)(item for value in values for item in value)
        return type(outputs[0])(**joined)

    # -------------------------------------------------------------------------------------------- positions
    def position_ids(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_inputs: Sequence[dict[str, torch.Tensor]],
        generation: bool = False,
    ) -> torch.Tensor | None:
        """Position ids of full rows, for running a prompt and its completions in two calls over a KV cache.

        Both calls must see the positions one full pass would: a full forward counts tokens (None: the model's
        default, which two calls over a cache reproduce by themselves); `generate` counts only unpadded tokens
        (`attention_mask` cumsum), and the prefill computed outside it must agree.

        Args:
            model (`PreTrainedModel`): the unwrapped transformers model.
            input_ids (`torch.Tensor`): `[B, L]`.
            attention_mask (`torch.Tensor`): `[B, L]`.
            image_inputs (`Sequence[dict]`): the B per-sample image dicts.
            generation (`bool`, defaults to False): positions as `generate` computes them.
        """
        if not generation:
            return None
        positions = attention_mask.long().cumsum(-1) - 1  # [B, L]
        return positions.masked_fill(attention_mask == 0, 0)

    def prepare_generation_from_cache(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_inputs: Sequence[dict[str, torch.Tensor]],
    ) -> None:
        """Set the state `generate` reads when it continues from a prompt cache computed elsewhere. None by default.

        Args are those of `position_ids`, for the `[B, P]` prompts about to be continued.
        """

    # ------------------------------------------------------------------------------------------------- vLLM
    def vllm_weights(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """A transformers parameter as vLLM's model loads it (TRL's weight sync): one or more `(name, tensor)`.

        vLLM's models load the published checkpoints' layout (each maps it with its `hf_to_vllm_mapper`); a family
        whose transformers names or tensor layouts differ from that layout maps them back here. Defaults to the
        parameter unchanged.

        Args:
            name (`str`): the parameter's transformers name, as TRL hands it to vLLM.
            tensor (`torch.Tensor`): its value.
        """
        yield name, tensor

    # ---------------------------------------------------------------------------------------------- modules
    def is_vision_module(self, name: str) -> bool:
        """Whether a module or parameter name belongs to the vision tower or the projector."""
        parts = name.split(".")
        return any(fragment in parts for fragment in self.vision_module_names)
