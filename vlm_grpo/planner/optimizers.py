"""Optimizer states, as each `optim` that transformers builds keeps them.

Bytes per trained tensor, from the optimizer classes transformers' `get_optimizer_cls_and_kwargs` returns:

- AdamW (`adamw_torch`, `adamw_torch_fused`, `adamw_torch_xla`, `adamw_torch_npu_fused`, `adamw_apex_fused`):
  `exp_avg` and `exp_avg_sq`, each in the parameter's dtype;
- Adafactor (`adafactor`, no `beta1`): a tensor of two or more dimensions keeps a row and a column second moment
  (`numel / shape[-1]` and `numel / shape[-2]` elements), any other its full second moment, in the gradient's dtype;
- SGD: a momentum buffer when `optim_args` sets a non-zero `momentum`, else nothing; Adagrad: its `sum`; RMSprop:
  `square_avg`, plus a momentum buffer with `momentum`, plus `grad_avg` when `centered`;
- bitsandbytes (`adamw_bnb_8bit`, `adamw_8bit`, `paged_adamw_8bit`/`32bit`, `lion_*`, `rmsprop_bnb*`, `ademamix*`):
  AdamW 2 states, Lion and RMSprop 1, AdEMAMix 3; 32-bit: float32 each; 8-bit: one byte each plus a float32 absmax
  per block of 256 and a 256-entry float32 quantization map per state map, except for tensors under 4096 elements
  and for `nn.Embedding` weights (transformers registers them for 32-bit states), which keep float32 states.
  Paged optimizers allocate their larger states in CUDA unified memory, outside PyTorch's counters: counted on the
  GPU, where they live until the driver pages them out.

Under DeepSpeed the optimizer steps the float32 flat partitions instead (see `deepspeed.py`), and with
`offload_optimizer` accelerate replaces it by DeepSpeed's CPU Adam (CPU Adagrad for Adagrad). Other optimizers
(GaLore, APOLLO, LOMO, AdaLomo, GrokAdamW, schedule-free, StableAdamW, torchao's 4/8-bit AdamW, AnyPrecision) are
not counted, and the plan says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .measure import TrainableTensor

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit states for smaller tensors
BNB_BLOCK = 256  # elements per float32 absmax of an 8-bit state
BNB_MAP = 256 * 4  # bytes of one quantization map
ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adamw_apex_fused")
BNB_STATES = {"adam": 2, "lion": 1, "rmsprop": 1, "ademamix": 3}  # states per element, by bitsandbytes class
BNB_MAPS = {"adam": 2, "lion": 1, "rmsprop": 1, "ademamix": 2}  # quantization maps per tensor (8-bit)


def parse_optim_args(text: str | None) -> dict[str, str]:
    """`optim_args` ("momentum=0.9,centered=true") as transformers parses it."""
    if not text:
        return {}
    return dict(pair.split("=") for pair in text.replace(" ", "").split(","))


def _true(options: dict[str, str], key: str) -> bool:
    return options.get(key, "false").lower() in ("true", "1", "yes")


def bnb_family(optim: str) -> str | None:
    """The bitsandbytes optimizer class an `optim` name selects ("adam", "lion", "rmsprop", "ademamix"), or None."""
    if optim.startswith(("adamw_bnb", "adamw_8bit", "paged_adamw", "lion_", "paged_lion", "rmsprop_bnb")):
        return next(name for name in ("adam", "lion", "rmsprop") if name in optim)
    return "ademamix" if optim.startswith(("ademamix", "paged_ademamix")) else None


def counted(optim: str) -> bool:
    """Whether the planner knows how `optim` keeps its states."""
    return (
        optim in ADAMW or optim in ("adafactor", "sgd", "adagrad", "rmsprop") or bnb_family(optim) is not None
    )


def _bnb_bytes(optim: str, tensor: TrainableTensor) -> int:
    family = bnb_family(optim)
    states = BNB_STATES[family]
    if "8bit" not in optim or tensor.numel < BNB_MIN_8BIT_SIZE or tensor.embedding:
        return states * 4 * tensor.numel
    blocks = math.ceil(tensor.numel / BNB_BLOCK)
    return states * (tensor.numel + 4 * blocks) + BNB_MAPS[family] * BNB_MAP


def _adafactor_elements(tensor: TrainableTensor) -> int:
    if len(tensor.shape) < 2:
        return tensor.numel
    return tensor.numel // tensor.shape[-1] + tensor.numel // tensor.shape[-2]  # row + column second moments


def _torch_states(optim: str, options: dict[str, str]) -> int:
    """States per element of the torch optimizers, each in the parameter's dtype."""
    if optim in ADAMW:
        return 2
    if optim == "sgd":
        return int(float(options.get("momentum", 0)) != 0)
    if optim == "adagrad":
        return 1
    return 1 + int(float(options.get("momentum", 0)) != 0) + int(_true(options, "centered"))  # rmsprop


def state_bytes(
    optim: str, optim_args: str | None, tensors: Sequence[TrainableTensor], element_bytes: Sequence[int]
) -> int:
    """Bytes of the states `optim` keeps for `tensors` whose elements take `element_bytes` (0 if not `counted`).

    Args:
        optim (`str`): the `optim` option.
        optim_args (`str | None`): the `optim_args` option.
        tensors (`Sequence[TrainableTensor]`): the trained tensors.
        element_bytes (`Sequence[int]`): bytes per element of each tensor (its dtype).
    """
    if bnb_family(optim) is not None:
        return sum(_bnb_bytes(optim, t) for t in tensors)
    if optim == "adafactor":
        return sum(_adafactor_elements(t) * b for t, b in zip(tensors, element_bytes, strict=True))
    if not counted(optim):
        return 0
    states = _torch_states(optim, parse_optim_args(optim_args))
    return states * sum(t.numel * b for t, b in zip(tensors, element_bytes, strict=True))


def describe_states(optim: str, optim_args: str | None) -> str:
    """A short note of what `optim` keeps per trained element."""
    if bnb_family(optim) is not None:
        states = BNB_STATES[bnb_family(optim)]
        return f"{states} bitsandbytes state(s), " + ("8-bit (+ absmax)" if "8bit" in optim else "float32")
    if optim == "adafactor":
        return "Adafactor: factored second moments"
    if not counted(optim):
        return f"{optim}: not counted"
    states = _torch_states(optim, parse_optim_args(optim_args))
    return f"{optim}: {states} state(s) in the parameter dtype"


def foreach_temporaries(optim: str, state_size: int) -> int:
    """Bytes `adamw_torch` (foreach) allocates in its step: `torch._foreach_sqrt(exp_avg_sqs)`, one state's size."""
    return state_size // 2 if optim == "adamw_torch" else 0


def flat_partition_states(
    optim: str, optim_args: str | None, elements: int, offload: bool
) -> tuple[int, str]:
    """`(bytes, note)` of the states kept for DeepSpeed's float32 flat partition of `elements` (one 1-D tensor).

    With `offload`, accelerate swaps the optimizer for DeepSpeed's CPU Adam (CPU Adagrad for Adagrad).
    """
    if offload:
        if optim == "adagrad":
            return 4 * elements, "DeepSpeed CPU Adagrad: 1 float32 state"
        return 8 * elements, "DeepSpeed CPU Adam (accelerate's choice with offload): 2 float32 states"
    flat = TrainableTensor((elements,))
    note = describe_states(optim, optim_args) + ", on the float32 partition"
    return state_bytes(optim, optim_args, [flat], [4]), note
