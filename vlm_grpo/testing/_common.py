"""Shared helpers for the tiny offline test models: builder options, word-level tokenizer, seeding, saving."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast, ProcessorMixin

UNK_TOKEN = "[UNK]"

# Tags used by reasoning/answer formats: single, non-special tokens so they survive
# `decode(..., skip_special_tokens=True)`.
TAG_TOKENS: tuple[str, ...] = ("<think>", "</think>", "<answer>", "</answer>")

_BASE_WORDS: tuple[str, ...] = tuple(
    """
    red green blue yellow purple orange white black gray grey pink brown cyan magenta
    square circle triangle rectangle star line dot helpful
    what which where how why many color colour shape is are the of in on at to for as from by with
    image picture photo answer question a an and or not no yes this that it its there
    box left right top bottom center middle inside between object objects brand option options choices
    choose one two three first then step please output final tags think thinking reasoning process
    you your i see shown background number count letter text describe describes short only be should
    must can do does has have format true false none all correct best give provide following
    system user assistant model
    """.split()
)
_DIGITS: tuple[str, ...] = tuple(str(i) for i in range(21))
# Words the processors themselves put into video prompts ("<1.5 seconds>" for Qwen3-VL, "Frame3:" for InternVL).
_VIDEO_WORDS: tuple[str, ...] = ("seconds", *(f"Frame{i}" for i in range(1, 17)))
_PUNCTUATION: tuple[str, ...] = tuple("?.,:;!'\"()[]{}<>/-+=*#%&_|")

ROLE_WORDS: tuple[str, ...] = ("system", "user", "assistant", "model", "You", "are", "a", "helpful", ".")
"""Words the chat templates write (roles, and Qwen2/2.5-VL's default system turn "You are a helpful assistant.");
the smallest sensible base vocabulary."""

NEWLINE_TOKENS: tuple[str, ...] = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
"""Runs of newlines that every published tokenizer of these families holds as tokens (vLLM's Gemma 3 processor looks
them up); the longest run matches first."""

DEFAULT_WORDS: tuple[str, ...] = (
    _BASE_WORDS
    + tuple(w.capitalize() for w in _BASE_WORDS)
    + ("A", "B", "C", "D", "E")
    + _DIGITS
    + _VIDEO_WORDS
    + _PUNCTUATION
)
"""Default vocabulary (besides special tokens and tags): words in lower and capitalised form, numbers
0-20, the words processors insert into video prompts, and single punctuation characters."""


@dataclass
class TokenizerSpec:
    """What a family needs from the word-level tokenizer.

    Args:
        special_tokens (`list[str]`): family control tokens, registered as special added tokens; the
            first ids of the vocabulary, in this order.
        named_tokens (`dict[str, str]`): standard and model-specific named tokens passed to the tokenizer
            (e.g. `{"eos_token": "<|im_end|>", "image_token": "<|image_pad|>"}`); each becomes an attribute
            `tokenizer.<name>` with a matching `tokenizer.<name>_id`.
    """

    special_tokens: list[str]
    named_tokens: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildOptions:
    """The options every tiny builder takes, as keyword arguments (`build_tiny_model`'s).

    Args:
        words (`Sequence[str]`, *optional*, defaults to `None`): extra vocabulary words (no whitespace), added after
            `base_words`; duplicates are ignored.
        base_words (`Sequence[str]`, *optional*, defaults to `DEFAULT_WORDS`): the vocabulary before `words`.
        seed (`int`, *optional*, defaults to 0): seed of the random weights; the caller's torch RNG state is left
            untouched.
        hidden_size (`int`, *optional*, defaults to 64): text hidden size, a multiple of 8 (4 attention heads,
            2 KV heads); vision towers are 32 wide with 2 heads.
        num_hidden_layers (`int`, *optional*, defaults to 2): depth of both the text and the vision tower.
        image_size (`int`, *optional*, defaults to 56): target image side in pixels, which each builder rounds to
            its patch layout: a square image of this size gives 4 image tokens at the default.
    """

    words: Sequence[str] | None = None
    base_words: Sequence[str] = DEFAULT_WORDS
    seed: int = 0
    hidden_size: int = 64
    num_hidden_layers: int = 2
    image_size: int = 56

    def tokenizer(
        self, special_tokens: Sequence[str], named_tokens: dict[str, str], chat_template: str
    ) -> tuple[PreTrainedTokenizerFast, dict[str, int]]:
        """The family's word-level tokenizer over these words, and the id of each of its special tokens.

        Args:
            special_tokens (`Sequence[str]`): the family's control tokens, the first ids, in this order.
            named_tokens (`dict[str, str]`): named tokens of the tokenizer (see `TokenizerSpec`).
            chat_template (`str`): the family's chat template.
        """
        spec = TokenizerSpec(list(special_tokens), dict(named_tokens))
        tokenizer = build_word_tokenizer(spec, self.words, chat_template, self.base_words)
        return tokenizer, {token: token_id(tokenizer, token) for token in special_tokens}


def build_word_tokenizer(
    spec: TokenizerSpec,
    words: Sequence[str] | None = None,
    chat_template: str | None = None,
    base_words: Sequence[str] = DEFAULT_WORDS,
) -> PreTrainedTokenizerFast:
    """Build a word-level fast tokenizer entirely offline.

    Args:
        spec (`TokenizerSpec`): special and named tokens of the family.
        words (`Sequence[str]`, *optional*, defaults to `None`): extra vocabulary words, appended after
            `DEFAULT_WORDS` (duplicates are ignored); a word holding punctuation is matched whole.
        chat_template (`str`, *optional*, defaults to `None`): Jinja chat template stored on the tokenizer.
        base_words (`Sequence[str]`, defaults to `DEFAULT_WORDS`): the vocabulary before `words`; a small
            one (e.g. `ROLE_WORDS` plus a task's words) makes random exploration find rewarded answers sooner.

    Returns:
        `PreTrainedTokenizerFast`: runs of newlines (`NEWLINE_TOKENS`) are tokens, other text is split on
        whitespace and every punctuation character is its own token; unknown words map to `[UNK]`; `decode`
        joins tokens with single spaces.
    """
    vocab: dict[str, int] = {}
    for token in [*spec.special_tokens, UNK_TOKEN, *TAG_TOKENS, *base_words, *(words or ())]:
        if not isinstance(token, str) or not token or any(ch.isspace() for ch in token):
            raise ValueError(
                f"vocabulary entries must be non-empty strings without whitespace, got {token!r}"
            )
        vocab.setdefault(token, len(vocab))

    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    backend.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok in [*spec.special_tokens, UNK_TOKEN]]
    )
    # Extra words holding punctuation ("Coca-Cola", "e.g.") would be split by the pre-tokenizer: match
    # them as whole added tokens instead, like the tags.
    glued = [w for w in dict.fromkeys(words or ()) if not w.isalnum() and w not in vocab_words_default()]
    backend.add_tokens(
        [AddedToken(tok, special=False, normalized=False) for tok in [*TAG_TOKENS, *NEWLINE_TOKENS, *glued]]
    )

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK_TOKEN,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        **spec.named_tokens,
    )
    return tokenizer


def vocab_words_default() -> set[str]:
    """Tokens every built vocabulary has (tags, default words, punctuation), besides the family's specials."""
    return {UNK_TOKEN, *TAG_TOKENS, *DEFAULT_WORDS}


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    """Id of `token` in `tokenizer`; raises `KeyError` when it is not in the vocabulary.

    Args:
        tokenizer (`PreTrainedTokenizerFast`): the tokenizer.
        token (`str`): a token string.
    """
    idx = tokenizer.convert_tokens_to_ids(token)
    if idx is None or (token != tokenizer.unk_token and idx == tokenizer.unk_token_id):
        raise KeyError(f"{token!r} is not in the vocabulary")
    return int(idx)


def round_to_multiple(value: int, multiple: int) -> int:
    """Round `value` to the nearest positive multiple of `multiple` (at least `multiple`).

    Args:
        value (`int`): value to round.
        multiple (`int`): the step.
    """
    return max(multiple, int(math.floor(value / multiple + 0.5)) * multiple)


def check_sizes(hidden_size: int, num_hidden_layers: int, num_heads: int = 4) -> int:
    """Validate the text tower sizes and return the attention head dimension.

    Args:
        hidden_size (`int`): text hidden size; must be divisible by `num_heads` with an even quotient.
        num_hidden_layers (`int`): number of text decoder layers (>= 1).
        num_heads (`int`, *optional*, defaults to 4): number of attention heads.
    """
    if num_hidden_layers < 1:
        raise ValueError(f"num_hidden_layers must be >= 1, got {num_hidden_layers}")
    if hidden_size % (2 * num_heads) or hidden_size < 4 * num_heads:
        raise ValueError(
            f"hidden_size must be a multiple of {2 * num_heads} and >= {4 * num_heads}, got {hidden_size}"
        )
    return hidden_size // num_heads


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's CPU random state seeded by `seed`, restoring the caller's state after.

    Args:
        seed (`int`): seed for `torch.manual_seed`.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def save_all(
    out_dir: str | os.PathLike,
    model: PreTrainedModel,
    processor: ProcessorMixin,
    eos_token_ids: list[int],
    pad_token_id: int,
    bos_token_id: int | None,
    sampling: dict | None = None,
) -> str:
    """Save model (float32 safetensors), generation config and processor into `out_dir`.

    Args:
        out_dir (`str | os.PathLike`): target directory (created if missing).
        model (`PreTrainedModel`): the model.
        processor (`ProcessorMixin`): processor holding tokenizer, image/video processors and chat template.
        eos_token_ids (`list[int]`): generation stop ids, the chat turn end first.
        pad_token_id (`int`): padding id.
        bos_token_id (`int`, *optional*): begin-of-sequence id, when the family has one.
        sampling (`dict`, *optional*): the sampling fields of the published checkpoints' `generation_config.json`
            (`do_sample`, `temperature`, `top_k`, ...), which `generate` merges under the caller's.

    Returns:
        `str`: `str(out_dir)`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        **(sampling or {}),
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return str(out_dir)


def save_tiny(
    out_dir: str | os.PathLike,
    model_class: Callable[[Any], PreTrainedModel],
    config: Any,
    processor: ProcessorMixin,
    options: BuildOptions,
    *,
    eos_token_ids: list[int],
    pad_token_id: int,
    bos_token_id: int | None = None,
    sampling: dict | None = None,
    init: Callable[[PreTrainedModel], None] | None = None,
) -> str:
    """Instantiate `model_class(config)` in float32 from `options.seed` and save it with `processor`.

    Args:
        out_dir (`str | os.PathLike`): target directory (created if missing).
        model_class (`Callable[[Any], PreTrainedModel]`): the model class.
        config (`Any`): the model's config.
        processor (`ProcessorMixin`): processor holding tokenizer, image/video processors and chat template.
        options (`BuildOptions`): the builder's options (their `seed` seeds the weights).
        eos_token_ids (`list[int]`): generation stop ids (see `save_all`).
        pad_token_id (`int`): padding id.
        bos_token_id (`int`, *optional*, defaults to `None`): begin-of-sequence id, when the family has one.
        sampling (`dict`, *optional*, defaults to `None`): the published sampling fields (see `save_all`).
        init (`Callable[[PreTrainedModel], None]`, *optional*, defaults to `None`): changes the fresh weights in
            place, under the same seed (e.g. a projection initialised to zeros).

    Returns:
        `str`: `str(out_dir)`.
    """
    with seeded(options.seed):
        model = model_class(config).float().eval()
        if init is not None:
            with torch.no_grad():
                init(model)
    return save_all(out_dir, model, processor, eos_token_ids, pad_token_id, bos_token_id, sampling)
