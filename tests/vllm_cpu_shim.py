"""Test-only shim: vLLM-CPU's linear layers keep their weights as plain parameters, so that weight sync can load.

vLLM's CPU backend packs the weight of every unquantized linear layer (and of the LM head) for its own GEMM kernels
once the checkpoint is loaded (`process_weights_after_loading` -> `vllm.model_executor.layers.utils.
dispatch_cpu_unquantized_gemm`): linear layers are left with an empty `layer.weight`, so TRL's weight sync
(`VLLMGeneration.sync_weights`, colocate mode) has nothing to load into ("Attempted to load weight
(torch.Size([96, 32])) into parameter (torch.Size([0]))"), and the LM head keeps computing with the packed copy of
the weights it was loaded with, whatever the sync writes. No vLLM setting turns the packing off. `install()` replaces
that dispatch, for 2-D weights, by vLLM's own fallback: `torch.nn.functional.linear` on the plain `layer.weight`, the
parameter the sync loads into. The convolution weights of linear-attention layers stay packed (vLLM's kernel needs
them so), and a later load goes through vLLM's own loader and packing again instead of into the packed tensor.
Everything else (model code, attention, sampling, the weight loaders TRL calls) is the real vLLM; on a GPU nothing
is patched.

It must run in the process that holds the engine: TRL's colocate mode builds `vllm.LLM` with
`distributed_executor_backend="external_launcher"`, which runs the engine in the trainer's own process, so the test
workers (`vllm_worker.py`) call `install()` before building the trainer. In server mode the engine runs in the
server's processes, where `vllm_server_shim` installs it as a vLLM plugin; there the sync goes through vLLM's
layerwise reload, which re-runs the packing, and completes without the shim, but the server's log-probs then do not
follow the synced weights.
"""

from __future__ import annotations

import torch


def install() -> bool:
    """Patch vLLM-CPU's weight packing out of linear layers; returns whether it was patched (False off CPU)."""
    from vllm.model_executor.layers import utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "keeps_plain_weights", False):
        return True

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if (
            layer.weight.ndim != 2
        ):  # a convolution (linear attention): vLLM's own handling, packed on each load
            original(layer, remove_weight)
            if "_cpu_unpacked_conv_weight" in vars(layer):
                _pack_on_load(layer)
            return
        layer.cpu_linear = torch.nn.functional.linear  # called as (x, layer.weight, bias): the synced weight

    dispatch_cpu_unquantized_gemm.keeps_plain_weights = True
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm  # imported from `utils` at each call
    return True


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
