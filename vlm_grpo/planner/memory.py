"""Per-GPU memory of a GRPO recipe, term by term, from parameter counts and measured per-token costs.

Held for the whole run (bytes per parameter `b` of the weight dtype; `N` processes):
- weights: every base parameter in its dtype (QLoRA: NF4 linear layers at half a byte plus one float32 constant per
  block of 64, or 1 byte per block and a float32 per 256 blocks with double quantization; `load_in_8bit`: one byte
  and a float32 scale per output row); `cast_lm_head_to_fp32` keeps the LM head (or the embeddings tied to it) in
  float32; ZeRO-3 divides by N, and `offload_param` puts them on the host;
- LoRA adapters, in `Recipe.adapter_bytes` (float32 by PEFT, bfloat16 on a quantized model as TRL casts them, the
  weight dtype under DeepSpeed);
- reference model: a second copy of the base weights when `beta != 0` without PEFT (ZeRO-3 divides by N);
- optimizer states: as `optimizers.py` counts them, or under DeepSpeed what `deepspeed.py` counts;
- vLLM in colocate mode without sleep mode: its `vllm_gpu_memory_utilization` share of the GPU, beside training.
Then the phases, which never overlap; the peak is what is held plus the largest:
- generation: vLLM's share when sleep mode woke it (`llm.sleep(level=2)` between generations releases its weights
  and KV cache, keeping neither on the GPU nor on the host); or transformers' KV cache of the rows generated at
  once with the prefill or the sampling logits, plus under ZeRO-3 every weight when `ds3_gather_for_generation`
  (`deepspeed.zero.GatheredParameters(model.parameters())` around `generate`), or with vLLM and PEFT (TRL gathers
  the whole model to merge the adapters for the weight sync);
- scoring: the old/reference log-prob pass, when it runs (`activations.py`);
- training: the gradients and the activations of one micro-batch (`activations.py`); without DeepSpeed and
  gradient accumulation, backward frees each layer's kept activations while it allocates that layer's gradients,
  so the two overlap by the smaller of them;
- optimizer step: the gradients still held and what the step adds (AdamW foreach's temporaries, DeepSpeed's
  float32 gradient conversion).
Which passes share each group's prompt is the trainer's own decision (`sharing.py`).
"""

from __future__ import annotations

from .activations import generation_terms, scoring_terms, training_terms
from .deepspeed import zero_gradients, zero_held, zero_step
from .measure import ParameterCounts, TokenCosts
from .optimizers import counted, describe_states, foreach_temporaries, state_bytes
from .plan import GIB, PassSharing, Plan, Recipe, Term
from .sharing import plan_sharing

__all__ = ["GIB", "Plan", "Recipe", "Term", "plan_memory"]


def plan_memory(recipe: Recipe, params: ParameterCounts, costs: TokenCosts, gpu_memory: int) -> Plan:
    """The `Plan` of `recipe` for a model with `params` and `costs` on GPUs of `gpu_memory` bytes."""
    sharing = plan_sharing(recipe)
    held = weight_terms(recipe, params)
    if recipe.vllm_colocate_fraction and not recipe.vllm_sleep:
        share = int(recipe.vllm_colocate_fraction * gpu_memory)
        note = f"vllm_gpu_memory_utilization {recipe.vllm_colocate_fraction}, held beside training (no sleep mode)"
        held.append(Term("vLLM (colocate)", share, note=note))
    if recipe.zero_stage:
        held += zero_held(recipe, params)
        gradients = zero_gradients(recipe, params)
        step = zero_step(recipe, params, gradients)
    else:
        optimizer = _optimizer(recipe, params)
        held.append(optimizer)
        gradients = [_gradients(recipe, params)]
        step = list(gradients)
        temporaries = foreach_temporaries(recipe.optim, optimizer.gpu)
        if temporaries:
            step.append(
                Term("AdamW foreach temporaries", temporaries, note="torch._foreach_sqrt(exp_avg_sqs)")
            )
    activations = training_terms(recipe, params, costs, sharing.training)
    training = [*gradients, *activations]
    if not recipe.zero_stage and recipe.accumulation_steps == 1:  # no gradient is held when a forward starts
        freed = min(gradients[0].gpu, activations[0].gpu)
        note = "backward frees each layer's kept activations as its gradients are allocated"
        training.append(Term("freed while gradients fill", -freed, note=note))
    scoring = scoring_terms(recipe, params, costs, sharing.scoring) if recipe.scoring_pass else []
    generation = _generation(recipe, params, costs, gpu_memory, sharing)
    return Plan(held, training, generation, scoring, step, sharing, _unpredicted(recipe, params))


def _base_bytes(recipe: Recipe, params: ParameterCounts) -> tuple[int, str]:
    """Bytes of one copy of the base weights, and how they were counted."""
    rest = params.total - params.quantized
    head = params.head * (recipe.head_bytes - recipe.weight_bytes)
    fp32_head = ", LM head in float32" if head else ""
    if recipe.load_in_4bit:
        blocks = params.quant_blocks
        constants = blocks * 4 if not recipe.double_quant else blocks + blocks // 64
        size = params.quantized // 2 + constants + rest * recipe.weight_bytes + head
        return size, f"NF4 for {params.quantized / 1e9:.2f}B linear weights, bf16 for the rest" + fp32_head
    if recipe.load_in_8bit:
        size = params.quantized + 4 * params.quant_rows + rest * recipe.weight_bytes + head
        return size, f"int8 for {params.quantized / 1e9:.2f}B linear weights, bf16 for the rest" + fp32_head
    size = params.total * recipe.weight_bytes + head
    return size, f"{params.total / 1e9:.2f}B parameters x {recipe.weight_bytes} bytes" + fp32_head


def weight_terms(recipe: Recipe, params: ParameterCounts) -> list[Term]:
    """Weights, LoRA adapters and the reference model, as held on each GPU (on the host with `offload_param`)."""
    shard = recipe.processes if recipe.zero_stage == 3 else 1
    split = f", / {shard} (ZeRO-3)" if shard > 1 else ""
    base, note = _base_bytes(recipe, params)
    terms = [Term("weights", base // shard, note=note + split, state=True)]
    if params.lora:
        note = f"{params.lora / 1e6:.1f}M x {recipe.adapter_bytes} bytes" + split
        terms.append(
            Term("LoRA adapters", params.lora * recipe.adapter_bytes // shard, note=note, state=True)
        )
    if recipe.beta != 0.0 and recipe.lora_r is None:
        size = params.total * recipe.weight_bytes + params.head * (recipe.head_bytes - recipe.weight_bytes)
        terms.append(Term("reference model", size // shard, note="beta != 0, no PEFT" + split))
    if recipe.zero_stage == 3 and recipe.offload_params:
        terms = [Term(t.name, 0, host=t.gpu, note=t.note + ", on the host", state=t.state) for t in terms]
    return terms


def _element_bytes(recipe: Recipe, params: ParameterCounts) -> list[int]:
    """Bytes per element of each trained tensor (without DeepSpeed)."""
    if recipe.lora_r is not None:
        return [recipe.adapter_bytes] * len(params.tensors)
    return [recipe.head_bytes if t.head else recipe.weight_bytes for t in params.tensors]


def _gradients(recipe: Recipe, params: ParameterCounts) -> Term:
    size = sum(t.numel * b for t, b in zip(params.tensors, _element_bytes(recipe, params), strict=True))
    return Term(
        "gradients", size, note=f"{params.trainable / 1e6:.1f}M trainable, in their dtype", state=True
    )


def _optimizer(recipe: Recipe, params: ParameterCounts) -> Term:
    size = state_bytes(recipe.optim, recipe.optim_args, params.tensors, _element_bytes(recipe, params))
    return Term("optimizer states", size, note=describe_states(recipe.optim, recipe.optim_args), state=True)


def _generation(
    recipe: Recipe, params: ParameterCounts, costs: TokenCosts, gpu_memory: int, sharing: PassSharing
) -> list[Term]:
    vllm = recipe.use_vllm
    terms = []
    if recipe.zero_stage == 3 and (recipe.lora_r is not None if vllm else recipe.ds3_gather_for_generation):
        whole = _base_bytes(recipe, params)[0] + params.lora * recipe.adapter_bytes
        if vllm:  # TRL's `VLLMGeneration._iter_named_params`: merging adapters needs the whole model
            note = "PEFT under ZeRO-3: TRL gathers every weight to merge the adapters for vLLM's weight sync"
        else:
            note = "ds3_gather_for_generation: every weight on every GPU while it generates"
        terms.append(Term("ZeRO-3 gathered policy", whole, note=note))
    if recipe.vllm_colocate_fraction:
        share = int(recipe.vllm_colocate_fraction * gpu_memory)
        if not recipe.vllm_sleep:
            return [*terms, Term("vLLM (colocate)", 0, note="its share is held (above)")]
        note = f"vllm_gpu_memory_utilization {recipe.vllm_colocate_fraction}, woken from sleep(level=2)"
        return [*terms, Term("vLLM (colocate)", share, note=note)]
    if recipe.vllm_server:
        return [*terms, Term("generation", 0, note="on the vLLM server's GPUs")]
    return [*terms, *generation_terms(recipe, costs, sharing.generation)]


def _unpredicted(recipe: Recipe, params: ParameterCounts) -> list[str]:
    unpredicted = [
        "the CUDA context and allocator cache (outside PyTorch's counted memory, about 0.3-1 GiB)",
        "the vision tower's own forward (once per distinct image, without gradient when frozen)",
    ]
    if params.vision_trainable:
        unpredicted.append(
            "the vision tower's activations (it trains; freeze_vision_modules: true removes them)"
        )
    if recipe.zero_stage:
        unpredicted.append(
            "DeepSpeed's communication buckets (reduce_bucket_size, prefetch) and a module's whole gradients "
            "before they are reduced"
        )
    if not counted(recipe.optim) and not (recipe.zero_stage and recipe.offload_optimizer):
        unpredicted.append(f"optimizer {recipe.optim!r}: its states are not counted")
    if recipe.optim.startswith("paged_"):
        unpredicted.append("paged optimizer states live in CUDA unified memory (counted on the GPU)")
    if recipe.cast_lm_head_to_fp32 and recipe.zero_stage == 3:
        unpredicted.append(
            "cast_lm_head_to_fp32 under ZeRO-3 (partitioned before TRL casts it): the head in bf16"
        )
    if recipe.vllm_colocate_fraction and recipe.vllm_sleep:
        unpredicted.append("what a sleeping vLLM keeps besides its weights and cache (CUDA graphs, buffers)")
    return unpredicted
