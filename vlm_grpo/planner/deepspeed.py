"""DeepSpeed ZeRO's model states, as DeepSpeed 0.19.8 allocates them (`runtime/zero/stage_1_and_2.py`, `stage3.py`).

`T` trainable parameters, `N` processes, `b` bytes of the weight dtype: DeepSpeed casts the module to its
mixed-precision dtype and keeps gradients in it (`data_types.grad_accum_dtype` defaults to the model dtype).
Per process:

- weights: every parameter under ZeRO-1/2; `1/N` of them under ZeRO-3 (`ds_tensor`), plus the largest module
  gathered with its prefetch (2 x);
- float32 master weights `4T/N`, and the optimizer's states of that partition (`optimizers.flat_partition_states`);
- gradients in the training pass: ZeRO-1 holds each gradient whole, `bT`, until `reduce_gradients` after backward
  (`partition_grads` is off); ZeRO-2 its partition, `bT/N` (`grads_in_partition`); ZeRO-3 its partition `bT/N`,
  held from initialization (`grad_partitions_flat_buffer`);
- optimizer step: a flattened copy of the gradient partition, converted to float32 (`4T/N`); ZeRO-3 does it per
  sub-group of `S = min(T/N, sub_group_size)` elements (`bS`, then `4S`).

With `offload_optimizer`, the master weights, their states and float32 gradients live on the host for the whole run
(pinned), and so do ZeRO-3's gradient partition and ZeRO-1/2's copy of the updated weights
(`param_buffer_of_bit16_for_cpu_offload_groups`, `bT/N`); ZeRO-1/2 add a gradient buffer of the largest parameter
on the GPU and another on the host (`temp_grad_buffer_for_*_offload`) and, with gradient accumulation, a copy of
the partition's gradients on the host (`accumulated_grads_in_cpu`). With `offload_param` (ZeRO-3), the weight
partitions are on the host. DeepSpeed's estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`) count the same but ZeRO-3's gradient partition, the host copies and
buffers, and ZeRO-1's whole gradients (`tests/test_plan_deepspeed.py` compares).
"""

from __future__ import annotations

from .measure import ParameterCounts
from .optimizers import flat_partition_states
from .plan import Recipe, Term

# DeepSpeed's `sub_group_size` default: ZeRO-3 converts gradients to float32 one sub-group at a time
SUB_GROUP_SIZE = 10**9


def _term(name: str, size: int, on_host: bool, note: str, state: bool = True) -> Term:
    if on_host:
        return Term(name, 0, host=size, note=note + ", on the host", state=state)
    return Term(name, size, note=note, state=state)


def _largest_trainable(params: ParameterCounts) -> int:
    return max((t.numel for t in params.tensors), default=0)


def zero_held(recipe: Recipe, params: ParameterCounts) -> list[Term]:
    """Master weights, optimizer states and the buffers DeepSpeed keeps for the whole run (weights apart)."""
    stage, n, b, offload = recipe.zero_stage, recipe.processes, recipe.weight_bytes, recipe.offload_optimizer
    partition = params.trainable // n
    states, how = flat_partition_states(recipe.optim, recipe.optim_args, partition, offload)
    master = f"{params.trainable / 1e6:.1f}M / {n} x 4 bytes"
    held = [
        _term("fp32 master weights", 4 * partition, offload, master),
        _term("optimizer states", states, offload, how + f" (ZeRO-{stage})"),
    ]
    if stage == 3:
        how = f"{b} bytes x 1/{n}, from initialization"
        held.append(_term("gradient partition", b * partition, offload, how))
        gathered = 2 * params.largest_module * b
        held.append(_term("ZeRO-3 gathered parameters", gathered, False, "largest module and its prefetch"))
    if offload:
        held.append(_term("fp32 gradients", 4 * partition, True, "float32 gradient partition"))
    if offload and stage < 3:
        copy, largest = b * partition, b * _largest_trainable(params)
        held += [
            _term("updated-weights copy", copy, True, "bf16 copy the step writes back from"),
            _term("offload gradient buffers", largest, False, "largest parameter, one more on the host"),
            _term("offload gradient buffers (host)", largest, True, "largest parameter"),
        ]
        if recipe.accumulation_steps > 1:
            held.append(_term("accumulated gradients", copy, True, "gradient accumulation (bf16)"))
    return held


def zero_gradients(recipe: Recipe, params: ParameterCounts) -> list[Term]:
    """The gradients a training pass allocates on the GPU (ZeRO-3's partition is held instead)."""
    stage, n, b = recipe.zero_stage, recipe.processes, recipe.weight_bytes
    if stage == 1:
        whole = "every gradient whole until reduced after backward"
        return [_term("gradients", b * params.trainable, False, whole)]
    if stage == 2 and not recipe.offload_optimizer:
        how = f"{b} bytes x 1/{n} (grads_in_partition)"
        return [_term("gradients", b * params.trainable // n, False, how)]
    return []


def zero_step(recipe: Recipe, params: ParameterCounts, gradients: list[Term]) -> list[Term]:
    """What the optimizer step holds on the GPU: the gradients, their flattened copy and its float32 conversion."""
    if recipe.offload_optimizer:
        return []
    n, b = recipe.processes, recipe.weight_bytes
    partition = params.trainable // n
    if recipe.zero_stage == 3:
        group = min(partition, SUB_GROUP_SIZE)
        how = f"per sub-group of {group / 1e6:.0f}M"
        return [
            _term("flattened gradient copy", b * group, False, how + ", while it converts", state=False),
            _term("fp32 gradients", 4 * group, False, how),
        ]
    if recipe.zero_stage == 1:
        ours = f"those of this process's 1/{n}"
        gradients = [_term("gradients (partition)", b * partition, False, ours, state=False)]
    return [
        *gradients,
        _term("flattened gradient copy", b * partition, False, "while it converts to float32", state=False),
        _term("fp32 gradients", 4 * partition, False, f"float32 gradient partition, 1/{n}"),
    ]
