"""What the planner reads off the architecture built on the meta device: parameters, saved activations, KV cache.

Nothing here allocates memory: every tensor is on the meta device (shape and dtype only). The activation and cache
figures are not formulas: the language model really runs forward on meta tensors, and what autograd saves for the
backward pass (`torch.autograd.graph.saved_tensors_hooks`) and what the cache holds is added up. Attention runs
through a stand-in that saves what PyTorch's fused attention kernels save (query, repeated key and value, output,
and a float32 log-sum-exp per query), since meta tensors cannot pick a kernel; the projections, norms, MLPs,
experts and rotary embeddings are the model's own code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..models.base import ModelFamily

_ATTENTION = "vlm_grpo_planner"
# bytes of the repeated keys and values each attention call saves, while `token_costs` measures
_ATTENTION_KV: list[int] = []


@dataclass(frozen=True)
class TrainableTensor:
    """One trained tensor, as optimizers see it.

    Attributes:
        shape (`tuple[int, ...]`): its shape.
        embedding (`bool`): the weight of an `nn.Embedding` (transformers gives it 32-bit bitsandbytes states).
        head (`bool`): the LM head's weight (or the embeddings tied to it).
    """

    shape: tuple[int, ...]
    embedding: bool = False
    head: bool = False

    @property
    def numel(self) -> int:
        """Its number of elements."""
        return math.prod(self.shape)


@dataclass
class ParameterCounts:
    """Parameters of one model, by part (numbers of elements).

    Attributes:
        vision (`int`): vision tower and projector.
        language (`int`): language model layers and norms (embeddings and LM head apart).
        embeddings (`int`): input embeddings.
        lm_head (`int`): output projection, 0 when tied to the input embeddings.
        tied (`bool`): whether the LM head shares the input embeddings.
        trainable (`int`): parameters the recipe trains (LoRA adapters included).
        lora (`int`): LoRA adapter parameters (0 without LoRA).
        quantized (`int`): base parameters stored in 4-bit NF4 (QLoRA), 0 otherwise.
        quant_blocks (`int`): NF4 blocks of 64 weights (each has a quantization constant).
        quant_rows (`int`): output rows of the quantized linear layers (LLM.int8 keeps a float32 scale per row).
        largest_module (`int`): parameters of the largest leaf module (what ZeRO-3 gathers at once, at least).
        lm_head_trainable (`bool`): the LM head (or the embeddings tied to it) trains.
        vision_trainable (`bool`): the vision tower trains.
        tensors (`tuple[TrainableTensor, ...]`): the trained tensors (LoRA: each adapter's A and B).
    """

    vision: int
    language: int
    embeddings: int
    lm_head: int
    tied: bool
    trainable: int = 0
    lora: int = 0
    quantized: int = 0
    quant_blocks: int = 0
    quant_rows: int = 0
    largest_module: int = 0
    lm_head_trainable: bool = False
    vision_trainable: bool = False
    tensors: tuple[TrainableTensor, ...] = ()

    @property
    def head(self) -> int:
        """Elements of the LM head's weight (the embeddings when tied)."""
        return self.embeddings if self.tied else self.lm_head

    @property
    def total(self) -> int:
        """All base parameters (LoRA adapters apart)."""
        return self.vision + self.language + self.embeddings + self.lm_head


def build_on_meta(family: ModelFamily, config: Any, dtype: torch.dtype) -> nn.Module:
    """The family's model class instantiated from `config` on the meta device, in `dtype`."""
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTENTION, _attention_as_fused_kernels_save)
    with torch.device("meta"):
        model = family.model_class()._from_config(config, dtype=dtype)
    model.set_attn_implementation(_ATTENTION)
    return model


def count_parameters(
    model: nn.Module,
    family: ModelFamily,
    freeze_vision: bool,
    lora_r: int | None = None,
    lora_targets: list[str] | None = None,
    quantize_4bit: bool = False,
    quantize_8bit: bool = False,
) -> ParameterCounts:
    """Count `model`'s parameters by part and what the recipe trains.

    Args:
        model (`nn.Module`): built by `build_on_meta`.
        family (`ModelFamily`): its per-model module (knows the vision module names).
        freeze_vision (`bool`): `freeze_vision_modules` of the recipe (full fine-tuning only).
        lora_r (`int | None`, defaults to None): LoRA rank; None = full fine-tuning.
        lora_targets (`list[str] | None`, defaults to None): the resolved LoRA target module names.
        quantize_4bit (`bool`, defaults to False): QLoRA: linear layers other than the LM head are NF4 (as
            transformers' bitsandbytes integration converts them; the vision tower too).
        quantize_8bit (`bool`, defaults to False): `load_in_8bit`: the same layers are LLM.int8.
    """
    output = model.get_output_embeddings()
    inputs = model.get_input_embeddings()
    tied = output.weight is inputs.weight
    counts = ParameterCounts(
        vision=sum(p.numel() for n, p in model.named_parameters() if family.is_vision_module(n)),
        language=0,
        embeddings=inputs.weight.numel(),
        lm_head=0 if tied else output.weight.numel(),
        tied=tied,
    )
    counts.language = (
        sum(p.numel() for p in model.parameters()) - counts.vision - counts.embeddings - counts.lm_head
    )
    counts.largest_module = max(
        sum(p.numel() for p in m.parameters(recurse=False))
        for m in model.modules()
        if list(m.parameters(False))
    )
    if quantize_4bit or quantize_8bit:
        linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not output]
        counts.quantized = sum(m.weight.numel() for m in linears)
        counts.quant_blocks = sum(-(-m.weight.numel() // 64) for m in linears)
        counts.quant_rows = sum(m.out_features for m in linears)
    if lora_r is None:
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        trained = [
            p for n, p in model.named_parameters() if not (freeze_vision and family.is_vision_module(n))
        ]
        counts.trainable = sum(p.numel() for p in trained)
        counts.tensors = tuple(
            TrainableTensor(tuple(p.shape), id(p) in embeddings, p is output.weight) for p in trained
        )
        counts.lm_head_trainable = True
        counts.vision_trainable = not freeze_vision and counts.vision > 0
        return counts
    modules = dict(model.named_modules())
    shapes = [(m.in_features, m.out_features) for m in (modules[n] for n in lora_targets or [])]
    counts.tensors = tuple(
        TrainableTensor(shape)
        for fan_in, fan_out in shapes
        for shape in ((lora_r, fan_in), (fan_out, lora_r))
    )  # lora_A [r, in], lora_B [out, r]
    counts.lora = counts.trainable = sum(t.numel for t in counts.tensors)
    return counts


@dataclass
class TokenCosts:
    """Bytes per token of the language model, measured by running it on meta tensors.

    Attributes:
        saved (`int`): what autograd keeps for the backward pass, all layers, per token of a training row.
        layer_input (`int`): one decoder layer's input per token (what gradient checkpointing keeps per layer).
        layers (`int`): decoder layers.
        cache (`int`): the generation KV cache per token, all layers.
        attention_kv (`int`): of `saved`, the keys and values attention saves repeated to every query head (a
            completion row that attends over a shared prompt's cache saves these for the prompt's tokens too).
        hidden_size (`int`): the language model's hidden size.
        vocab_size (`int`): its vocabulary.
    """

    saved: int
    layer_input: int
    layers: int
    cache: int
    hidden_size: int
    vocab_size: int
    attention_kv: int = 0


def token_costs(model: nn.Module, dtype: torch.dtype, tokens: int = 64) -> TokenCosts:
    """Measure `TokenCosts` of `model`'s language model with one row of `tokens` tokens on the meta device."""
    text = model.config.get_text_config()
    decoder = model.get_decoder()
    hidden = torch.empty(1, tokens, text.hidden_size, device="meta", dtype=dtype, requires_grad=True)
    saved = _SavedBytes()
    _ATTENTION_KV.clear()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, _unpack):
        decoder(inputs_embeds=hidden, use_cache=False)
    attention_kv = sum(_ATTENTION_KV)
    with torch.no_grad():
        cache = decoder(inputs_embeds=hidden.detach(), use_cache=True)[
            1
        ]  # `past_key_values` (`cache` from 5.24)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    return TokenCosts(
        saved=saved.total // tokens,
        layer_input=text.hidden_size * itemsize,
        layers=text.num_hidden_layers,
        cache=_cache_bytes(cache) // tokens,
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        attention_kv=attention_kv // tokens,
    )


class _SavedBytes:
    """A `saved_tensors_hooks` pack hook adding up the distinct activations autograd saves (parameters apart)."""

    def __init__(self):
        self.total = 0
        self._seen: dict[int, torch.Tensor] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        base = tensor if tensor._base is None else tensor._base
        if isinstance(base, nn.Parameter) or id(base) in self._seen:
            return tensor
        self._seen[id(base)] = base  # kept alive so that `id` stays unique
        self.total += base.numel() * base.element_size()
        return tensor


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _cache_bytes(cache: Any) -> int:
    """Bytes of every tensor a transformers `Cache` holds, over its layers (keys, values, recurrent states)."""
    return sum(
        value.numel() * value.element_size()
        for layer in cache.layers
        for value in vars(layer).values()
        if isinstance(value, torch.Tensor)
    )


class _FusedAttention(torch.autograd.Function):
    """Saves what a fused attention kernel saves for backward; computes nothing (meta tensors only)."""

    @staticmethod
    def forward(ctx, query, key, value):  # [B, H, L, D] each
        out = torch.empty_like(query)
        log_sum_exp = query.new_empty(query.shape[:-1], dtype=torch.float32)  # [B, H, L]
        ctx.save_for_backward(query, key, value, out, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx, grad):  # never called: the planner runs forward only
        raise NotImplementedError


def _attention_as_fused_kernels_save(module, query, key, value, attention_mask, **kwargs):
    """An attention implementation for meta tensors: transformers' SDPA layout, with keys and values repeated to
    every query head (as its SDPA path does when a padding mask is given, which GRPO batches always have)."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    _ATTENTION_KV.append(2 * key.numel() * key.element_size())
    out = _FusedAttention.apply(query, key, value)  # [B, H, L, D]
    return out.transpose(1, 2).contiguous(), None
