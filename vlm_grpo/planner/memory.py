"""Per-GPU memory of a GRPO recipe, term by term, from parameter counts and measured per-token costs.

Accounting (bytes per parameter `b` of the weight dtype; `N` processes; stage = DeepSpeed ZeRO stage, 0 without):
- weights: every base parameter in its dtype (QLoRA: NF4 linear layers at half a byte plus one float32 constant per
  block of 64, or 1 byte per block and a float32 per 256 blocks with double quantization); ZeRO-3 divides by N;
  LoRA adapters in float32 (PEFT upcasts them), in the weight dtype under ZeRO-3 (as TRL sets it);
- gradients: one per trainable parameter in its dtype (ZeRO-2/3 divide by N);
- optimizer: AdamW keeps two states per trainable parameter in its dtype (8-bit AdamW one byte each); under
  DeepSpeed, float32 master weights and float32 states (12 bytes) divided by N from stage 1, on the host with
  `offload_optimizer`;
- reference model: a second copy of the base weights when `beta != 0` without PEFT (ZeRO-3 divides by N);
- activations of one training micro-batch: the saved bytes per token measured on the meta device (`measure.py`)
  times the tokens the pass holds (with a shared prompt, each group's prompt once); with gradient checkpointing,
  each layer's input plus one layer's saved activations (recomputed in backward); plus TRL's chunked LM-head
  log-probs (a [min(N, 4096), 32768] tile, float32 gradients of the hidden states and, when the head trains, of
  its weight);
- generation: the KV cache of the rows generated at once (transformers), or vLLM's share of the GPU
  (`vllm_gpu_memory_utilization`) in colocate mode.
Weights, reference and optimizer are held throughout; the training pass (activations and gradients) and generation
never overlap, so the peak is the larger of the two on top of what is held.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .measure import ParameterCounts, TokenCosts

GIB = 2**30
LM_HEAD_TILE = (4096, 32768)  # TRL's chunked log-prob tile: tokens x vocabulary columns
ADAM_LIKE = ("adamw", "adam_", "adam", "lamb", "lion")


@dataclass(frozen=True)
class Recipe:
    """The settings that decide memory, read from a training config.

    Attributes:
        weight_bytes (`int`): bytes per weight (2 for bf16/fp16, 4 for fp32).
        lora_r (`int | None`): LoRA rank, None for full fine-tuning.
        load_in_4bit (`bool`): QLoRA (NF4 base weights).
        double_quant (`bool`): `use_bnb_nested_quant`.
        beta (`float`): KL coefficient (a reference model when non-zero without PEFT).
        rows (`int`): `per_device_train_batch_size`, completions per micro-batch.
        generation_rows (`int`): completions generated at once per process.
        num_generations (`int`): G.
        prompt_tokens (`int`): tokens of one prompt, images included.
        completion_tokens (`int`): `max_completion_length`.
        gradient_checkpointing (`bool`): recompute layers in backward.
        share_prompt (`bool`): the training pass holds each group's prompt once.
        optim (`str`): the `optim` option.
        processes (`int`): GPUs in all (nodes x GPUs per node).
        zero_stage (`int`): DeepSpeed ZeRO stage, 0 without DeepSpeed.
        offload_optimizer (`bool`): ZeRO optimizer states on the host.
        offload_params (`bool`): ZeRO-3 parameters on the host.
        vllm_colocate_fraction (`float`): `vllm_gpu_memory_utilization` with `use_vllm` colocate, else 0.
        vllm_server (`bool`): generation by a vLLM server on other GPUs.
        scores_every_position (`bool`): TRL's LM head scores every position it is given (devices without
            Triton), not only the completion tokens.
    """

    weight_bytes: int = 2
    lora_r: int | None = None
    load_in_4bit: bool = False
    double_quant: bool = False
    beta: float = 0.0
    rows: int = 8
    generation_rows: int = 8
    num_generations: int = 8
    prompt_tokens: int = 300
    completion_tokens: int = 512
    gradient_checkpointing: bool = True
    share_prompt: bool = True
    optim: str = "adamw_torch"
    processes: int = 1
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    vllm_colocate_fraction: float = 0.0
    vllm_server: bool = False
    scores_every_position: bool = False


@dataclass
class Term:
    """One line of the plan: bytes on each GPU and on the host (per process), and how it was counted."""

    name: str
    gpu: int
    host: int = 0
    note: str = ""


@dataclass
class Plan:
    """The memory plan of a recipe on one GPU.

    Attributes:
        held (`list[Term]`): weights, reference, optimizer: held for the whole run.
        training (`list[Term]`): gradients and activations of one micro-batch.
        generation (`list[Term]`): the KV cache or vLLM's share.
        unpredicted (`list[str]`): what the total leaves out, and why.
    """

    held: list[Term]
    training: list[Term]
    generation: list[Term]
    unpredicted: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        """Bytes per GPU at the peak: what is held plus the larger of the training pass and generation."""
        held = sum(t.gpu for t in self.held)
        return held + max(sum(t.gpu for t in self.training), sum(t.gpu for t in self.generation))

    @property
    def host(self) -> int:
        """Host RAM per process for offloaded states."""
        return sum(t.host for t in self.held + self.training + self.generation)


def plan_memory(recipe: Recipe, params: ParameterCounts, costs: TokenCosts, gpu_memory: int) -> Plan:
    """The `Plan` of `recipe` for a model with `params` and `costs` on GPUs of `gpu_memory` bytes."""
    shard = recipe.processes if recipe.zero_stage == 3 else 1
    held = [_weights(recipe, params, shard)]
    if recipe.beta != 0.0 and recipe.lora_r is None:
        held.append(
            Term("reference model", params.total * recipe.weight_bytes // shard, note="beta != 0, no PEFT")
        )
    if recipe.zero_stage == 3 and recipe.offload_params:  # ZeRO-3 offload_param: the shards live on the host
        held = [Term(t.name, 0, host=t.gpu, note=t.note + ", on the host") for t in held]
    held.append(_optimizer(recipe, params))
    if recipe.zero_stage == 3:
        gathered = 2 * params.largest_module * recipe.weight_bytes
        held.append(Term("ZeRO-3 gathered parameters", gathered, note="largest module and its prefetch"))
    training = [_gradients(recipe, params), *_activations(recipe, params, costs)]
    generation = _generation(recipe, costs, gpu_memory)
    unpredicted = ["the CUDA context and allocator cache (outside PyTorch's counted memory, about 0.3-1 GiB)"]
    if params.vision_trainable:
        unpredicted.append(
            "the vision tower's activations (it trains; freeze_vision_modules: true removes them)"
        )
    if recipe.zero_stage:
        unpredicted.append("DeepSpeed's communication buckets (reduce_bucket_size, prefetch)")
    if not any(recipe.optim.startswith(p) for p in ADAM_LIKE) and recipe.optim not in ("sgd", "adafactor"):
        unpredicted.append(f"optimizer {recipe.optim!r}: counted as AdamW")
    return Plan(held, training, generation, unpredicted)


def _weights(recipe: Recipe, params: ParameterCounts, shard: int) -> Term:
    if recipe.load_in_4bit:
        constants = (
            params.quant_blocks * 4
            if not recipe.double_quant
            else params.quant_blocks + params.quant_blocks // 64
        )
        base = params.quantized // 2 + constants + (params.total - params.quantized) * recipe.weight_bytes
        note = f"NF4 for {params.quantized / 1e9:.2f}B linear weights, bf16 for the rest"
    else:
        base = params.total * recipe.weight_bytes
        note = f"{params.total / 1e9:.2f}B parameters x {recipe.weight_bytes} bytes"
    adapter_bytes = recipe.weight_bytes if recipe.zero_stage == 3 and not recipe.load_in_4bit else 4
    adapters = params.lora * adapter_bytes
    if shard > 1:
        note += f", / {shard} (ZeRO-3)"
    return Term(
        "weights",
        (base + adapters) // shard,
        note=note + (f", LoRA {params.lora / 1e6:.1f}M" if adapters else ""),
    )


def _trainable_bytes(recipe: Recipe) -> int:
    """Bytes of one trainable parameter: LoRA adapters are float32 (bf16 under ZeRO-3), full weights their dtype."""
    if recipe.lora_r is not None and not (recipe.zero_stage == 3 and not recipe.load_in_4bit):
        return 4
    return recipe.weight_bytes


def _gradients(recipe: Recipe, params: ParameterCounts) -> Term:
    shard = recipe.processes if recipe.zero_stage >= 2 else 1
    size = params.trainable * _trainable_bytes(recipe) // shard
    return Term(
        "gradients",
        size,
        note=f"{params.trainable / 1e6:.1f}M trainable" + (f", / {shard}" if shard > 1 else ""),
    )


def _optimizer(recipe: Recipe, params: ParameterCounts) -> Term:
    if recipe.zero_stage:
        size = params.trainable * 12 // recipe.processes
        note = f"fp32 master + 2 Adam states, / {recipe.processes} (ZeRO-{recipe.zero_stage})"
        if recipe.offload_optimizer:
            return Term("optimizer states", 0, host=size, note=note + ", on the host")
        return Term("optimizer states", size, note=note)
    if "8bit" in recipe.optim:
        return Term("optimizer states", params.trainable * 2, note="2 states x 1 byte (8-bit)")
    if recipe.optim == "sgd":
        return Term("optimizer states", 0, note="SGD without momentum keeps none")
    states = params.trainable * 2 * _trainable_bytes(recipe)
    return Term("optimizer states", states, note=f"2 AdamW states x {_trainable_bytes(recipe)} bytes")


def _activations(recipe: Recipe, params: ParameterCounts, costs: TokenCosts) -> list[Term]:
    groups = max(1, recipe.rows // recipe.num_generations)
    prompt_rows = groups if recipe.share_prompt else recipe.rows
    tokens = prompt_rows * recipe.prompt_tokens + recipe.rows * recipe.completion_tokens
    if recipe.gradient_checkpointing:
        per_token = costs.layer_input * costs.layers + costs.saved // costs.layers
        how = "layer inputs + one layer recomputed"
    else:
        per_token, how = costs.saved, "every layer's saved tensors"
    shared = (
        f"{prompt_rows} prompt x {recipe.prompt_tokens} + {recipe.rows} x {recipe.completion_tokens} tokens"
    )
    scored = recipe.rows * recipe.completion_tokens
    if recipe.scores_every_position and not recipe.share_prompt:
        scored += recipe.rows * recipe.prompt_tokens
    tile = min(scored, LM_HEAD_TILE[0]) * LM_HEAD_TILE[1] * recipe.weight_bytes
    head = scored * costs.hidden_size * (recipe.weight_bytes + 4) + tile
    if params.lm_head_trainable:
        head += costs.vocab_size * costs.hidden_size * 4
    return [
        Term("activations", tokens * per_token, note=f"{shared}; {how}"),
        Term("LM-head log-probs", head, note="TRL's chunked log-probs: tile, fp32 gradients"),
    ]


def _generation(recipe: Recipe, costs: TokenCosts, gpu_memory: int) -> list[Term]:
    if recipe.vllm_colocate_fraction:
        share = int(recipe.vllm_colocate_fraction * gpu_memory)
        return [
            Term(
                "vLLM (colocate)", share, note=f"vllm_gpu_memory_utilization {recipe.vllm_colocate_fraction}"
            )
        ]
    if recipe.vllm_server:
        return [Term("generation", 0, note="on the vLLM server's GPUs")]
    tokens = recipe.generation_rows * (recipe.prompt_tokens + recipe.completion_tokens)
    logits = recipe.generation_rows * costs.vocab_size * 4 * 2
    return [
        Term(
            "KV cache",
            tokens * costs.cache,
            note=f"{recipe.generation_rows} rows x {recipe.prompt_tokens + recipe.completion_tokens} tokens",
        ),
        Term("sampling logits", logits, note="last-token logits and probabilities, fp32"),
    ]


def suggestions(
    recipe: Recipe, params: ParameterCounts, costs: TokenCosts, gpu_memory: int
) -> list[tuple[str, int]]:
    """The settings that lower the peak most: `(change, bytes saved)`, largest first, at most three."""
    base = plan_memory(recipe, params, costs, gpu_memory).peak
    options: list[tuple[str, Recipe]] = []
    if not recipe.gradient_checkpointing:
        options.append(("gradient_checkpointing: true", replace(recipe, gradient_checkpointing=True)))
    if recipe.rows > recipe.num_generations or recipe.rows > 1:
        half = max(1, recipe.rows // 2)
        options.append(
            (f"per_device_train_batch_size: {half} (and twice the gradient_accumulation_steps)",
             replace(recipe, rows=half, generation_rows=max(half, recipe.generation_rows // 2)))
        )  # fmt: skip
    if recipe.beta != 0.0 and recipe.lora_r is None:
        options.append(("beta: 0.0 (no reference model)", replace(recipe, beta=0.0)))
    if recipe.processes > 1 and recipe.zero_stage < 3:
        options.append(("DeepSpeed ZeRO-3 (local_scripts/zero3.json)", replace(recipe, zero_stage=3)))
    if recipe.zero_stage and not recipe.offload_optimizer:
        options.append(("offload_optimizer to the CPU (local_scripts/zero3_offload.json)",
                        replace(recipe, offload_optimizer=True)))  # fmt: skip
    if recipe.vllm_colocate_fraction > 0.2:
        options.append(("vllm_gpu_memory_utilization: 0.2", replace(recipe, vllm_colocate_fraction=0.2)))
    if recipe.completion_tokens > 256:
        half = recipe.completion_tokens // 2
        options.append((f"max_completion_length: {half}", replace(recipe, completion_tokens=half)))
    saved = [(change, base - plan_memory(r, params, costs, gpu_memory).peak) for change, r in options]
    return sorted([s for s in saved if s[1] > 0], key=lambda s: -s[1])[:3]
