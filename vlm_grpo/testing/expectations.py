"""What the tests expect of each tiny family: one `TinyFamily` record, declared next to the family's builder.

Tests take every family list and every per-family expectation from these records (through `vlm_grpo.testing`), and
pick families by role (`a_family_with(...)`, `DEFAULT_FAMILY`), so that adding a family is its model module, its
builder with its record, and one registration each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

IMAGE_RULES: tuple[str, ...] = ("grid", "tiles", "fixed")
"""How a family's processor turns an image into image tokens: `"grid"`, one token per merged block of patches
(`image_grid_thw`), written where the prompt's one image token stood; `"tiles"`, a fixed number per tile of the image
(InternVL, between `<img>` and `</img>`); `"fixed"`, a fixed number per image (marked by `token_type_ids`)."""


@dataclass(frozen=True)
class ChatLayout:
    """How a family's chat template and processor lay out a conversation, checked in detail by `test_testing`.

    Args:
        turn_open (`str`): the opening of a turn, with a `{role}` field (`"<|im_start|>{role}\\n"`).
        turn_end (`str`): the token that ends a chat turn; it must be one of the generation eos ids.
        image (`str`): what the template writes for an image part, before the processor expands it.
        vision_prefixes (`tuple[str, ...]`): name prefixes of the vision side (tower and projector) in the loaded
            model's parameters.
        bos (`str`, *optional*, defaults to `""`): text the template writes before the first turn (`"<bos>"`); when
            set, the tokenizer's, the text config's and the generation config's bos ids must agree.
        assistant_role (`str`, *optional*, defaults to `"assistant"`): how the template spells the assistant's role.
        system_turn (`bool`, *optional*, defaults to `True`): a system message is a turn of its own; otherwise its
            text opens the first user turn, followed by a blank line.
        default_system (`str`, *optional*): the system turn the template writes when the messages give none.
        config_tokens (`Mapping[str, str]`, *optional*, defaults to `{}`): model config attributes holding the id
            of a token, by token (`{"video_token_id": "<|video_pad|>"}`).
        video (`bool`, *optional*, defaults to `True`): the processor takes videos.
        presampled_video_kwargs (`Mapping[str, Any]`, *optional*, defaults to `{}`): processor arguments for a video
            given as frames already sampled (Qwen3-VL's video processor would sample them again).
        thinking_prompt (`str`, *optional*, defaults to `""`): what a generation prompt writes after the assistant's
            turn opening (`"<think>\n"` where the template thinks by default, as Qwen3.5 4B and larger).
        history_reasoning (`bool`, *optional*, defaults to `True`): an earlier assistant turn keeps its reasoning
            (`<think> ... </think>`); False where the template keeps only what follows `</think>`.
    """

    turn_open: str
    turn_end: str
    image: str
    vision_prefixes: tuple[str, ...]
    bos: str = ""
    assistant_role: str = "assistant"
    system_turn: bool = True
    default_system: str | None = None
    config_tokens: Mapping[str, str] = field(default_factory=dict)
    video: bool = True
    presampled_video_kwargs: Mapping[str, Any] = field(default_factory=dict)
    thinking_prompt: str = ""
    history_reasoning: bool = True

    def turn(self, role: str, content: str) -> str:
        """A whole turn of `role` holding `content`, as the template writes it in a conversation's history.

        Args:
            role (`str`): the message's role (`"assistant"` is written as `assistant_role`).
            content (`str`): the turn's text.
        """
        if role == "assistant" and not self.history_reasoning:
            content = content.split("</think>")[-1].lstrip("\n")
        return self.opening(role) + content + self.turn_end + "\n"

    def opening(self, role: str) -> str:
        """The opening of a turn of `role`.

        Args:
            role (`str`): the message's role.
        """
        return self.turn_open.format(role=self.assistant_role if role == "assistant" else role)

    def generation_prompt(self) -> str:
        """What `add_generation_prompt` appends: the assistant's turn opening, and the opening of its thinking where
        the template thinks by default."""
        return self.opening("assistant") + self.thinking_prompt


@dataclass(frozen=True)
class TinyFamily:
    """One tiny family: its builder and what the tests expect of the model it builds.

    Args:
        name (`str`): the name `build_tiny_model` takes.
        build (`Callable[..., str]`): `build(out_dir, **options)`, the options of `BuildOptions`; returns the folder.
        title (`str`): the family's name in messages (`"Gemma 4"`).
        architecture (`str`): the model class saved in `config.json`'s `architectures`.
        image_token (`str`): the token repeated once per visual embedding in `input_ids`.
        image_rule (`str`): how images become image tokens, one of `IMAGE_RULES`.
        model_type (`str`, *optional*): `model_type` of the saved config; defaults to `name`.
        checkpoints (`tuple[str, ...]`, *optional*, defaults to `()`): fragments of the hub names of the published
            checkpoints the family stands for (`"Qwen2.5-VL"`).
        core (`bool`, *optional*, defaults to `False`): one of the families the costlier cross-checks run on
            (matching stock TRL over every schedule, the planner's activation measure), and among which tests pick
            the families of their spot checks; `test_families_coverage` runs those spot checks on every other
            family.
        tied_embeddings (`bool`, *optional*, defaults to `True`): the LM head shares the input embedding.
        mrope (`bool`, *optional*, defaults to `False`): the language model places tokens by multimodal rotary
            positions (`get_rope_index`).
        moe (`bool`, *optional*, defaults to `False`): the language model has mixture-of-experts layers.
        bidirectional_images (`bool`, *optional*, defaults to `False`): the language model attends bidirectionally
            among each image's tokens (Gemma 3 and 4), where other families attend causally.
        byte_level (`bool`, *optional*, defaults to `False`): the tokenizer is a byte-level BPE (every vocabulary
            word one token, with or without its leading space) rather than the word-level one.
        tool_calls (`bool`, *optional*, defaults to `False`): the builder's chat template is the published one, with
            its tool definitions, tool calls and tool results, and the tokenizer has its tool-call tags: TRL's tool
            loop runs on it (`tools`, `environment_factory`).
        stock_tool_images (`bool`, *optional*, defaults to `True`): stock TRL 1.16's tool loop runs a turn after a tool
            that returned an image (False for Gemma 4: TRL hands its image processor's `num_soft_tokens_per_image`
            to `generate`, which refuses it).
        fixed_image_tokens (`int`, *optional*): image tokens every image gets whatever its size (Gemma 4's budget);
            otherwise one per merged patch block, 4 at the default image size.
        sampling (`Mapping[str, Any]`, *optional*, defaults to `{}`): the sampling fields the builder writes into
            `generation_config.json`, those of the published checkpoints.
        unused_parameters (`frozenset[str]`, *optional*, defaults to `frozenset()`): parameters the forward never
            uses, so that no loss reaches them.
        refused_inputs (`tuple[str, ...]`, *optional*, defaults to `()`): message content types the family's module
            refuses (Gemma 4: audio and video).
        placeholder_tokens (`frozenset[str]`, *optional*, defaults to `frozenset()`): tokens that must be among the
            family's placeholder ids (never sampled), where a test checks them.
        vllm_logprob_gaps (`tuple[str, ...]`, *optional*, defaults to `()`): vLLM checks (`"sync"`, `"steps"`) in
            which vLLM's log-probs are known to stay apart from the trainer's; the vLLM tests mark them strict xfail.
        layout (`ChatLayout`, *optional*): the chat layout, tokenizer and processor details `test_testing` checks;
            None where the family's own test file checks them.
    """

    name: str
    build: Callable[..., str]
    title: str
    architecture: str
    image_token: str
    image_rule: str
    model_type: str = ""
    checkpoints: tuple[str, ...] = ()
    core: bool = False
    tied_embeddings: bool = True
    mrope: bool = False
    moe: bool = False
    bidirectional_images: bool = False
    byte_level: bool = False
    tool_calls: bool = False
    stock_tool_images: bool = True
    fixed_image_tokens: int | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    unused_parameters: frozenset[str] = frozenset()
    refused_inputs: tuple[str, ...] = ()
    placeholder_tokens: frozenset[str] = frozenset()
    vllm_logprob_gaps: tuple[str, ...] = ()
    layout: ChatLayout | None = None

    def __post_init__(self) -> None:
        if self.image_rule not in IMAGE_RULES:
            raise ValueError(f"{self.name}: image_rule must be one of {IMAGE_RULES}, got {self.image_rule!r}")
        if not self.model_type:
            object.__setattr__(self, "model_type", self.name)

    @property
    def indexable_cache(self) -> bool:
        """Whether the model module indexes the family's cache from groups to rows (`ModelFamily.indexable_cache`)."""
        return _indexable_cache(self.model_type)

    def image_tokens(self, image_size: int) -> int:
        """Image tokens of one square image of `image_size` pixels, built at `image_size` (56 or 112).

        Args:
            image_size (`int`): the image side and the builder's `image_size`.
        """
        return self.fixed_image_tokens or (image_size // 28) ** 2


@cache
def _indexable_cache(model_type: str) -> bool:
    from transformers import AutoConfig

    from ..models import get_model_family

    return get_model_family(AutoConfig.for_model(model_type)).indexable_cache
