"""vLLM's CPU backend, made to take weight syncs: its linear layers keep their weights as plain parameters.

vLLM's CPU backend packs the weight of every unquantized linear layer (and of the LM head) for its own GEMM kernels
once the checkpoint is loaded (`process_weights_after_loading` -> `vllm.model_executor.layers.utils.
dispatch_cpu_unquantized_gemm`): the layers are left with an empty `layer.weight`, so TRL's weight sync (colocate
mode) has nothing to load into ("Attempted to load weight (torch.Size([96, 32])) into parameter
(torch.Size([0]))"), and the LM head keeps computing with the packed copy of the weights it was loaded with,
whatever the sync writes. No vLLM setting turns the packing off. `keep_linear_weights_plain()` replaces that
dispatch, for 2-D weights, by vLLM's own fallback: `torch.nn.functional.linear` on the plain `layer.weight`, the
parameter the sync loads into (slower than the packed kernels, and exact). The convolution weights of
linear-attention layers stay packed (vLLM's kernel needs them so), and a later load goes through vLLM's own loader
and packing again instead of into the packed tensor. Everything else is vLLM's own; on a GPU nothing is patched.

It must run in the process that holds the engine before the engine loads the model: TRL's colocate mode builds
`vllm.LLM` with `distributed_executor_backend="external_launcher"` inside the trainer's own process, and
`VLMGRPOTrainer` calls it before TRL builds the engine.
"""

from __future__ import annotations

import torch


def keep_linear_weights_plain() -> bool:
    """Patch vLLM-CPU's weight packing out of linear layers; returns whether vLLM runs on the CPU (then patched)."""
    from vllm.model_executor.layers import utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    original = utils.dispatch_cpu_unquantized_gemm
    if original in _INSTALLED:
        return True

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if (
            layer.weight.ndim != 2
        ):  # a convolution (linear attention): vLLM's own handling, packed on each load
            original(layer, remove_weight)
            if "_cpu_unpacked_conv_weight" in vars(layer):
                _pack_on_load(layer)
            return
        layer.cpu_linear = torch.nn.functional.linear  # called as (x, layer.weight, bias): the synced weight

    _INSTALLED.append(dispatch)
    utils.dispatch_cpu_unquantized_gemm = dispatch  # imported from `utils` at each call
    return True


_INSTALLED: list = []
"""The installed replacement, so that a second call changes nothing."""


def _pack_on_load(layer: torch.nn.Module) -> None:
    """A packed convolution weight (`[C, 1, K]` in the checkpoint) takes later loads through vLLM's own loader and
    packing: the loader fills a plain `[C, 1, K]` tensor, which is packed as vLLM packs it when the model loads."""
    from vllm import _custom_ops as ops

    param = layer.weight
    load = param.weight_loader
    channels, width = layer._cpu_unpacked_conv_weight.shape

    def weight_loader(target: torch.nn.Parameter, loaded: torch.Tensor, *args, **kwargs) -> None:
        plain = torch.nn.Parameter(torch.empty(channels, 1, width, dtype=loaded.dtype), requires_grad=False)
        load(plain, loaded, *args, **kwargs)
        unpacked = plain.data.view(channels, width).to(target.dtype).contiguous()
        layer._cpu_unpacked_conv_weight = unpacked
        target.data = ops.causal_conv1d_weight_pack(unpacked)

    param.weight_loader = weight_loader
