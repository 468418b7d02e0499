"""What goes into a plan (`Recipe`: the settings of a training config that decide memory, with `SharingInputs`:
what the trainer's prompt-sharing policy is built from) and what comes out (`Term`: one line; `PassSharing`: which
passes share each group's prompt; `Plan`: what is held, and what each phase adds on top)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from ..policy.fast_generation import FastGeneration, decide_fast_generation
from ..policy.sharing_plan import PASSES

GIB = 2**30


@dataclass(frozen=True)
class SharingInputs:
    """What the trainer's `SharingPolicy` is built from, apart from DeepSpeed and checkpointing (in the `Recipe`).

    Attributes:
        mode (`str`): `share_prompt_prefix`, one of "true", "false", "auto".
        model_type (`str`): the family's `model_type`, for the reasons.
        indexable_cache (`bool`): the family's `ModelFamily.indexable_cache`.
        generation_config (`GenerationConfig`): what `generate` samples with (unused when vLLM samples).
        vision_trains (`bool`): the vision tower trains (full fine-tune, `freeze_vision_modules: false`).
        use_reentrant (`bool`): `use_reentrant` of `gradient_checkpointing_kwargs`.
        aux_loss (`bool`): the training forward returns the router aux loss (`router_aux_loss`).
    """

    mode: str = "auto"
    model_type: str = "model"
    indexable_cache: bool = True
    generation_config: GenerationConfig = field(default_factory=lambda: GenerationConfig(do_sample=True))
    vision_trains: bool = False
    use_reentrant: bool = False
    aux_loss: bool = False


@dataclass(frozen=True)
class PassSharing:
    """The policy's answer for the planned batch: which passes share each group's prompt, and why the others don't.

    Attributes:
        generation (`bool`): sampling prefills each group's prompt once.
        scoring (`bool`): the old and reference log-prob passes share.
        training (`bool`): the policy's training forward shares.
        reasons (`dict[str, tuple[str, ...]]`): for each pass that runs full rows, the policy's reasons.
    """

    generation: bool
    scoring: bool
    training: bool
    reasons: dict[str, tuple[str, ...]]

    def lines(self) -> list[str]:
        """One line per pass: shares each group's prompt, or runs full rows and why."""
        shares = {"generation": self.generation, "scoring": self.scoring, "training": self.training}
        return [
            f"{name:<11}" + ("shares each group's prompt" if shares[name] else "full rows: " + "; ".join(why))
            for name in PASSES
            for why in [self.reasons.get(name, ())]
        ]


@dataclass(frozen=True)
class Recipe:
    """The settings that decide memory, read from a training config.

    Attributes:
        weight_bytes (`int`): bytes per weight (2 for bf16/fp16, 4 for fp32).
        lora_r (`int | None`): LoRA rank, None for full fine-tuning.
        load_in_4bit (`bool`): QLoRA (NF4 base weights).
        load_in_8bit (`bool`): LLM.int8 base weights.
        double_quant (`bool`): `use_bnb_nested_quant`.
        beta (`float`): KL coefficient (a reference model when non-zero without PEFT).
        rows (`int`): `per_device_train_batch_size`, completions per micro-batch.
        generation_rows (`int`): completions generated at once per process.
        num_generations (`int`): G.
        prompt_tokens (`int`): tokens of one prompt, images included.
        completion_tokens (`int`): `max_completion_length`.
        gradient_checkpointing (`bool`): recompute layers in backward.
        optim (`str`): the `optim` option.
        optim_args (`str | None`): the `optim_args` option.
        accumulation_steps (`int`): `gradient_accumulation_steps`.
        old_log_probs (`bool`): old log-probs are computed (generation and updates misaligned, or vLLM's sampling
            corrected): a pass without gradient, as the reference log-probs with `beta != 0`.
        cast_lm_head_to_fp32 (`bool`): TRL's float32 LM head.
        processes (`int`): GPUs in all (nodes x GPUs per node).
        zero_stage (`int`): DeepSpeed ZeRO stage, 0 without DeepSpeed.
        offload_optimizer (`bool`): ZeRO optimizer states on the host.
        offload_params (`bool`): ZeRO-3 parameters on the host.
        ds3_gather_for_generation (`bool`): ZeRO-3 gathers every weight for generation.
        vllm_colocate_fraction (`float`): `vllm_gpu_memory_utilization` with `use_vllm` colocate, else 0.
        vllm_sleep (`bool`): `vllm_enable_sleep_mode` (colocate): vLLM releases its weights and cache between
            generations.
        vllm_server (`bool`): generation by a vLLM server on other GPUs.
        scores_every_position (`bool`): TRL's LM head scores every position it is given (devices without
            Triton), not only the completion tokens.
        sharing (`SharingInputs`): what the trainer's prompt-sharing policy is built from.
        fast_generation (`str`): the `fast_generation` option ("auto", "true", "false").
        device (`str`): the device type it trains on ("cuda", "cpu").
    """

    weight_bytes: int = 2
    lora_r: int | None = None
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    double_quant: bool = False
    beta: float = 0.0
    rows: int = 8
    generation_rows: int = 8
    num_generations: int = 8
    prompt_tokens: int = 300
    completion_tokens: int = 512
    gradient_checkpointing: bool = True
    optim: str = "adamw_torch"
    optim_args: str | None = None
    accumulation_steps: int = 1
    old_log_probs: bool = False
    cast_lm_head_to_fp32: bool = False
    processes: int = 1
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    ds3_gather_for_generation: bool = True
    vllm_colocate_fraction: float = 0.0
    vllm_sleep: bool = False
    vllm_server: bool = False
    scores_every_position: bool = False
    sharing: SharingInputs = field(default_factory=SharingInputs)
    fast_generation: str = "auto"
    device: str = "cuda"

    @property
    def scoring_pass(self) -> bool:
        """Whether a log-prob pass without gradient runs (old or reference log-probs)."""
        return self.beta != 0.0 or self.old_log_probs

    @property
    def use_vllm(self) -> bool:
        """Generation is by vLLM, colocated or served from other GPUs."""
        return self.vllm_colocate_fraction > 0 or self.vllm_server

    @property
    def quantized(self) -> bool:
        """The base weights are quantized by bitsandbytes (4-bit or 8-bit)."""
        return self.load_in_4bit or self.load_in_8bit

    @property
    def fast_generation_decision(self) -> FastGeneration:
        """The trainer's `fast_generation` decision for these settings: when enabled, transformers' `generate`
        decodes from a static cache of whole buckets of tokens."""
        return decide_fast_generation(
            self.fast_generation,
            torch.device(self.device),
            None if self.use_vllm else self.sharing.generation_config,
            self.quantized,
            self.zero_stage == 3,
        )

    @property
    def adapter_bytes(self) -> int:
        """Bytes of a LoRA adapter element: bfloat16 on a quantized model (TRL casts them), the weight dtype under
        DeepSpeed (ZeRO-3: TRL builds them so; ZeRO-1/2: DeepSpeed casts the module), else float32 (PEFT's
        `autocast_adapter_dtype`)."""
        if self.quantized:
            return 2
        return self.weight_bytes if self.zero_stage else 4

    @property
    def head_bytes(self) -> int:
        """Bytes of an LM-head weight element: float32 with `cast_lm_head_to_fp32` (outside DeepSpeed, which casts
        the module back at initialization under ZeRO-1/2)."""
        return 4 if self.cast_lm_head_to_fp32 and not self.zero_stage else self.weight_bytes


@dataclass
class Term:
    """One line of the plan: bytes on each GPU and on the host (per process), and how it was counted.

    Attributes:
        name (`str`): what it is.
        gpu (`int`): bytes on one GPU.
        host (`int`, defaults to 0): bytes of host RAM per process.
        note (`str`, defaults to ""): how it was counted.
        state (`bool`, defaults to False): a model state (weights, gradients, optimizer states and the buffers
            that hold them for the run), as DeepSpeed's estimators itemize them; copies made in a step are not.
    """

    name: str
    gpu: int
    host: int = 0
    note: str = ""
    state: bool = False


@dataclass
class Plan:
    """The memory plan of a recipe on one GPU.

    Attributes:
        held (`list[Term]`): held for the whole run: weights, reference model, optimizer states, vLLM's share
            without sleep mode.
        training (`list[Term]`): the policy's forward and backward over one micro-batch.
        generation (`list[Term]`): sampling a generation batch.
        scoring (`list[Term]`, defaults to none): the old/reference log-prob pass (no gradient), when it runs.
        step (`list[Term]`, defaults to none): the optimizer step (gradients still held, the step's copies).
        sharing (`PassSharing | None`, defaults to None): which passes share each group's prompt, and why not.
        unpredicted (`list[str]`, defaults to none): what the total leaves out, and why.
    """

    held: list[Term]
    training: list[Term]
    generation: list[Term]
    scoring: list[Term] = field(default_factory=list)
    step: list[Term] = field(default_factory=list)
    sharing: PassSharing | None = None
    unpredicted: list[str] = field(default_factory=list)

    @property
    def phases(self) -> dict[str, list[Term]]:
        """The phases that never overlap, by name: each adds its terms to what is held."""
        return {
            "generation": self.generation,
            "scoring pass": self.scoring,
            "training pass": self.training,
            "optimizer step": self.step,
        }

    @property
    def peak(self) -> int:
        """Bytes per GPU at the peak: what is held plus the largest phase."""
        held = sum(t.gpu for t in self.held)
        return held + max(sum(t.gpu for t in terms) for terms in self.phases.values())

    def terms(self) -> list[Term]:
        """Every term once (the gradients belong to both the training pass and the step)."""
        every = [t for terms in (self.held, *self.phases.values()) for t in terms]
        return list({id(t): t for t in every}.values())

    @property
    def host(self) -> int:
        """Host RAM per process for offloaded states."""
        return sum(t.host for t in self.terms())

    def model_states(self) -> tuple[int, int]:
        """`(GPU bytes, host bytes per process)` of the model states (`Term.state`), each counted once."""
        states = [t for t in self.terms() if t.state]
        return sum(t.gpu for t in states), sum(t.host for t in states)
