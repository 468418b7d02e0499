"""Configuration dataclasses, subclassing TRL's so that `TrlParser` reads them from YAML and the command line.

- `VLMGRPOConfig` (a `trl.GRPOConfig`): trainer options, plus vision-specific ones (freezing, image size).
- `VLMModelConfig` (a `trl.ModelConfig`): how to load the model: dtype, attention, LoRA and QLoRA.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available
from trl import GRPOConfig, ModelConfig

from .device import accelerator_type
from .errors import VLMGRPOError
from .trl_options import refused_options

logger = logging.getLogger(__name__)


@dataclass
class VLMGRPOConfig(GRPOConfig):
    """`trl.GRPOConfig` plus the options of vision-language training.

    Parameters:
        freeze_vision_modules (`bool`, defaults to False): keep the vision tower and projector frozen (their
            parameters get `requires_grad=False`). The names come from the model's module
            (`ModelFamily.vision_module_names`).
        min_pixels (`int | None`, defaults to None): lower bound on pixels per image after resizing (Qwen-VL).
        max_pixels (`int | None`, defaults to None): upper bound on pixels per image; larger images are resized
            down, keeping their aspect ratio (Qwen-VL).
        max_tiles (`int | None`, defaults to None): most tiles per image (InternVL).
        video_fps (`float`, defaults to 2.0): frames per second sampled from a video file (by the video processor's
            own rule, within its min and max frames), and the rate a list of frame files is taken at; 2.0 as
            qwen-vl-utils samples.
        video_max_frames (`int | None`, defaults to None): most frames sampled from one video; None keeps the
            processor's (768 for Qwen-VL).
        video_min_pixels (`int | None`, defaults to None): lower bound on a video's pixels after resizing: the video
            processor's `size`, which bounds each sampled frame on Qwen2-VL and Qwen2.5-VL and all sampled frames
            together on Qwen3-VL, Qwen3.5 and GLM (refused on InternVL and Gemma 4; see docs/families.md).
        video_max_pixels (`int | None`, defaults to None): upper bound on a video's pixels after resizing, as
            `video_min_pixels` bounds them.
        video_sampler (`str`, defaults to `"processor"`): who picks a video's frames and sizes them: `"processor"`,
            the family's video processor, or `"qwen_vl_utils"` (Qwen families only; the `video` extra), qwen-vl-utils'
            `process_vision_info` as the Qwen model cards run it, with `video_fps` as its `fps`, `video_max_frames`
            as its `max_frames` and `video_min_pixels` / `video_max_pixels` as its per-frame `min_pixels` /
            `max_pixels`. Sample as the model will be served (see docs/data.md); refused with `use_vllm`.
        share_prompt_prefix (`str`, defaults to `"auto"`): run each group's prompt (image included) once and share
            its KV cache across the G completions, in generation and in every log-prob pass (old, reference,
            policy). Exact: log-probs match full forwards within float rounding. `"true"` always, `"false"` never,
            `"auto"` per generation batch when the prompt tokens it saves are a large enough share of the pass to
            pay for its second forward call (see `vlm_grpo.policy.sharing_plan.sharing_pays`). Works with (non-reentrant)
            gradient checkpointing; with `use_reentrant: true` the policy's training forward runs full rows.
        fast_generation (`str`, defaults to `"auto"`): transformers' `generate` decodes from a static (preallocated)
            KV cache with a compiled decoding step (see `vlm_grpo.policy.fast_generation`): `"true"` wherever it can run,
            `"false"` never, `"auto"` where it was measured to pay: CUDA GPUs (3.5 times faster steps on an H200),
            not the CPU (no faster). The same sampling distribution (on the CPU, the same tokens for the same random
            draws); compiling costs time on the first step and on each new batch size.
        log_samples_steps (`int`, defaults to 50): every this many steps, write the step's prompts, image paths,
            completions, rewards and advantages to `output_dir/samples/step_NNNNNN.jsonl`; 0 turns it off.
        no_signal_warning_steps (`int`, defaults to 10): warn when this many rollouts in a row had no learning
            signal (every group's rewards with zero spread, or every reward 0); 0 turns the warning off.
        no_signal_warning_every (`int`, defaults to 50): while it lasts, repeat the warning every this many
            rollouts.
        dynamic_sampling (`bool`, defaults to False): drop the groups whose advantages are all zero (they teach
            nothing) and sample fresh prompts until the generation batch holds its number of informative groups, as
            DAPO does (see `vlm_grpo.rollout.dynamic_sampling`).
        dynamic_sampling_max_rounds (`int`, defaults to 3): most extra generation rounds per generation batch.
        dynamic_sampling_at_cap (`str`, defaults to `"fill"`): when the extra rounds are spent and groups are still
            missing: `"error"` stops with a one-line error, as DAPO's reference does; `"fill"` completes the batch
            with dropped groups; `"keep"` trains on the informative groups (a smaller batch, rounded up with dropped
            groups only so that the micro-batches split equally).
        tool_timeout (`float`, *optional*, defaults to `None`): seconds a tool call (sync or async) may take; a call
            still running then is reported to the model as a failed call (`{"error": ...}`), counted in
            `tools/failure_frequency` and `tools/timeout_frequency`. None: no bound, as in TRL.
        async_rollouts (`bool`, defaults to False): sample the next generation batches on the vLLM server
            (`vllm_mode: server`) while this one trains (see `vlm_grpo.rollout.asynchronous` and docs/async.md).
        max_staleness (`int`, defaults to 1): with `async_rollouts`, how many optimizer steps older than the
            trainer's weights a batch's sampling weights may be; older rows are dropped, counted and sampled again.
        weight_sync_steps (`int`, defaults to 1): with `async_rollouts`, send the weights to the server every this
            many optimizer steps.
    """

    freeze_vision_modules: bool = field(
        default=False,
        metadata={"help": "Freeze the vision tower and projector; only the language model trains."},
    )
    min_pixels: int | None = field(
        default=None, metadata={"help": "Minimum pixels per image after resizing (Qwen-VL family)."}
    )
    max_pixels: int | None = field(
        default=None,
        metadata={"help": "Maximum pixels per image; larger images are resized down (Qwen-VL family)."},
    )
    max_tiles: int | None = field(default=None, metadata={"help": "Maximum tiles per image (InternVL)."})
    video_fps: float = field(
        default=2.0,
        metadata={"help": "Frames per second sampled from a video (and the rate of frame lists)."},
    )
    video_max_frames: int | None = field(
        default=None, metadata={"help": "Most frames sampled from one video (default: the processor's)."}
    )
    video_min_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Minimum pixels of a video after resizing: each frame's (Qwen2/2.5-VL) or all frames' together "
            "(Qwen3-VL, Qwen3.5, GLM)."
        },
    )
    video_max_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Maximum pixels of a video after resizing: each frame's (Qwen2/2.5-VL) or all frames' together "
            "(Qwen3-VL, Qwen3.5, GLM)."
        },
    )
    video_sampler: str = field(
        default="processor",
        metadata={
            "help": "Who picks and sizes a video's frames: processor (the family's video processor) or "
            "qwen_vl_utils (qwen-vl-utils, as the Qwen model cards; Qwen families only).",
        },
    )
    share_prompt_prefix: str = field(
        default="auto",
        metadata={
            "help": "Compute each group's prompt once and share its KV cache across the G completions: true, "
            "false, or auto (per batch, when it saves enough).",
        },
    )
    fast_generation: str = field(
        default="auto",
        metadata={
            "help": "Decode from a static KV cache with a compiled step (transformers' generate): true, false, or "
            "auto (where it was measured to pay: no device yet).",
        },
    )
    log_samples_steps: int = field(
        default=50,
        metadata={
            "help": "Write samples (prompts, completions, rewards) every N steps to output_dir/samples; 0: off."
        },
    )
    no_signal_warning_steps: int = field(
        default=10,
        metadata={"help": "Warn after this many rollouts in a row without a learning signal; 0: off."},
    )
    no_signal_warning_every: int = field(
        default=50,
        metadata={"help": "Repeat the no-learning-signal warning every N rollouts while it lasts."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "Replace groups whose rewards all agree by groups of fresh prompts (DAPO)."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=3, metadata={"help": "Most extra generation rounds per generation batch (dynamic sampling)."}
    )
    dynamic_sampling_at_cap: str = field(
        default="fill",
        metadata={
            "help": "When the extra rounds are spent: error (stop, as DAPO's reference), fill (complete the batch "
            "with dropped groups) or keep (train on fewer groups)."
        },
    )
    tool_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds a tool call may take before it is reported to the model as failed (None: no bound, as "
            "TRL)."
        },
    )
    async_rollouts: bool = field(
        default=False,
        metadata={"help": "Sample the next generation batches on the vLLM server while this one trains."},
    )
    max_staleness: int = field(
        default=1,
        metadata={
            "help": "async_rollouts: most optimizer steps a batch's sampling weights may lag the trainer's."
        },
    )
    weight_sync_steps: int = field(
        default=1,
        metadata={"help": "async_rollouts: send the weights to the server every N optimizer steps."},
    )

    def __post_init__(self):
        self.resolve_bf16()
        if accelerator_type() == "cpu":
            self.dataloader_pin_memory = False  # pinned memory needs an accelerator (torch warns otherwise)
        try:
            with warnings.catch_warnings():
                # TRL's own default sets `gradient_checkpointing`, which transformers 5.2x calls deprecated
                warnings.filterwarnings("ignore", message="`gradient_checkpointing", category=FutureWarning)
                # TRL's deprecation notice for an option that is refused below in one line anyway
                warnings.filterwarnings("ignore", message="`use_transformers_paged", category=FutureWarning)
                super().__post_init__()
        except (
            ValueError
        ) as error:  # TRL's and transformers' own checks of these options: bad input, one line
            raise VLMGRPOError(" ".join(str(error).split())) from error
        self.share_prompt_prefix = sharing_mode(self.share_prompt_prefix)
        self.fast_generation = fast_generation_mode(self.fast_generation)
        if self.fast_generation == "true" and self.use_vllm:
            raise VLMGRPOError(
                "fast_generation: true speeds up transformers' generate, but use_vllm: true samples with vLLM; set "
                "fast_generation: auto or false, or use_vllm: false."
            )
        refused = refused_options(self)
        if refused:
            raise VLMGRPOError(refused[0])
        if self.sync_ref_model and self.beta == 0.0:
            raise VLMGRPOError(
                "sync_ref_model: true with beta: 0.0: there is no reference model to sync (as in TRL); set "
                "sync_ref_model: false, or set beta to a non-zero value."
            )
        if self.log_samples_steps < 0:
            raise VLMGRPOError(f"log_samples_steps must be >= 0, got {self.log_samples_steps}.")
        self._check_dynamic_sampling()
        if self.no_signal_warning_steps < 0 or self.no_signal_warning_every < 1:
            raise VLMGRPOError(
                "no_signal_warning_steps must be >= 0 and no_signal_warning_every >= 1, got "
                f"{self.no_signal_warning_steps} and {self.no_signal_warning_every}."
            )
        for name, value in (
            ("min_pixels", self.min_pixels),
            ("max_pixels", self.max_pixels),
            ("max_tiles", self.max_tiles),
            ("video_max_frames", self.video_max_frames),
            ("video_min_pixels", self.video_min_pixels),
            ("video_max_pixels", self.video_max_pixels),
        ):
            if value is not None and value <= 0:
                raise VLMGRPOError(f"{name} must be a positive integer, got {value}.")
        self._check_async_rollouts()
        if self.tool_timeout is not None and not self.tool_timeout > 0:
            raise VLMGRPOError(f"tool_timeout must be a positive number of seconds, got {self.tool_timeout}.")
        if not self.video_fps > 0:
            raise VLMGRPOError(f"video_fps must be a positive number, got {self.video_fps}.")
        if self.video_sampler not in ("processor", "qwen_vl_utils"):
            raise VLMGRPOError(
                f"video_sampler must be processor or qwen_vl_utils, got {self.video_sampler!r}."
            )
        if self.video_sampler == "qwen_vl_utils" and self.use_vllm:
            raise VLMGRPOError(
                "video_sampler: qwen_vl_utils with use_vllm: true: vLLM's processor would resize qwen-vl-utils' frames "
                "again, so vLLM would not sample from the trainer's video; set use_vllm: false, or video_sampler: "
                "processor."
            )
        if self.video_min_pixels and self.video_max_pixels and self.video_min_pixels > self.video_max_pixels:
            raise VLMGRPOError(
                f"video_min_pixels ({self.video_min_pixels}) must not exceed video_max_pixels ({self.video_max_pixels})."
            )
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise VLMGRPOError(
                f"min_pixels ({self.min_pixels}) must not exceed max_pixels ({self.max_pixels})."
            )

    def _check_async_rollouts(self) -> None:
        """Asynchronous rollouts need generation on other devices (a vLLM server), and what they run alongside."""
        if self.max_staleness < 1 or self.weight_sync_steps < 1:
            raise VLMGRPOError(
                f"max_staleness and weight_sync_steps must be >= 1, got {self.max_staleness} and "
                f"{self.weight_sync_steps}."
            )
        if not self.async_rollouts:
            return
        if not self.use_vllm or self.vllm_mode != "server":
            raise VLMGRPOError(
                "async_rollouts overlaps generation with training, which pays only when they run on different "
                "devices: a vLLM server (use_vllm: true, vllm_mode: server, trl vllm-serve on its own devices); with "
                "colocate mode or transformers' generate, one engine shares the trainer's devices, so set "
                "async_rollouts: false."
            )
        if not self.vllm_importance_sampling_correction:
            raise VLMGRPOError(
                "async_rollouts samples with weights up to max_staleness steps old, which "
                "vllm_importance_sampling_correction corrects (without it, off-policy training drifts); set "
                "vllm_importance_sampling_correction: true."
            )

    def _check_dynamic_sampling(self) -> None:
        """Dynamic sampling's options, and whole groups on every process (it keeps or drops groups)."""
        if self.dynamic_sampling_at_cap not in ("error", "fill", "keep"):
            raise VLMGRPOError(
                f"dynamic_sampling_at_cap must be error, fill or keep, got {self.dynamic_sampling_at_cap!r}."
            )
        if self.dynamic_sampling_max_rounds < 0:
            raise VLMGRPOError(
                f"dynamic_sampling_max_rounds must be >= 0, got {self.dynamic_sampling_max_rounds}."
            )
        local = self.per_device_train_batch_size * self.steps_per_generation
        if self.dynamic_sampling and local % self.num_generations:
            raise VLMGRPOError(
                f"dynamic_sampling keeps or drops whole groups, so each process's generation batch "
                f"(per_device_train_batch_size {self.per_device_train_batch_size} x steps_per_generation "
                f"{self.steps_per_generation} = {local}) must be a multiple of num_generations "
                f"{self.num_generations}; change one of them."
            )

    def resolve_bf16(self) -> None:
        """Turn bf16 off where it cannot run, unless the user asked for it.

        TRL's `bf16` defaults to None, read as "on unless fp16 is on"; transformers then refuses bf16 on a machine
        without bf16 support ("Your setup doesn't support bf16/gpu"). Left unset there, bf16 is turned off here
        with one log line, so a recipe trains on a CPU without extra flags. Set to True there (in the YAML or on
        the command line), it is an error naming the flag. With `use_cpu`, transformers runs bf16 on the CPU and
        nothing changes.
        """
        if self.use_cpu or is_torch_bf16_gpu_available() or is_torch_xla_available():
            return
        if self.bf16:
            raise VLMGRPOError(
                "bf16: true, but this machine has no accelerator with bf16 support: remove bf16 (it then turns off "
                "by itself), set bf16: false, or add use_cpu: true to run bf16 on the CPU."
            )
        if self.bf16 is None and not self.fp16:
            logger.info("No accelerator with bf16 support: bf16 is off, training runs in float32.")
            self.bf16 = False

    def image_size_kwargs(self) -> dict[str, Any]:
        """The image-size knobs as keyword arguments for `ModelFamily.load_processor`."""
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "max_tiles": self.max_tiles}

    def video_kwargs(self) -> dict[str, Any]:
        """The video sampling and size knobs as keyword arguments for `ModelFamily.configure_video`; `sampler` only
        when it is not the default, so that a family's `configure_video` that takes none still takes the rest."""
        kwargs: dict[str, Any] = {
            "fps": self.video_fps,
            "max_frames": self.video_max_frames,
            "min_pixels": self.video_min_pixels,
            "max_pixels": self.video_max_pixels,
        }
        if self.video_sampler != "processor":
            kwargs["sampler"] = self.video_sampler
        return kwargs


def sharing_mode(value: str | bool) -> str:
    """`share_prompt_prefix` as one of "true", "false", "auto" (YAML and Python may give booleans)."""
    mode = str(value).lower()
    if mode not in ("true", "false", "auto"):
        raise VLMGRPOError(f"share_prompt_prefix must be true, false or auto, got {value!r}.")
    return mode


def fast_generation_mode(value: str | bool) -> str:
    """`fast_generation` as one of "true", "false", "auto" (YAML and Python may give booleans)."""
    mode = str(value).lower()
    if mode not in ("true", "false", "auto"):
        raise VLMGRPOError(f"fast_generation must be true, false or auto, got {value!r}.")
    return mode


@dataclass
class VLMModelConfig(ModelConfig):
    """`trl.ModelConfig`: model path, dtype, attention, LoRA (`use_peft`, `lora_*`) and QLoRA (`load_in_4bit`).

    With `use_peft` and no `lora_target_modules`, LoRA targets every linear layer of the language model and none of
    the vision tower; a list of names (e.g. `q_proj v_proj`) narrows that set, and the vision tower stays out.
    With `load_in_4bit`, weights load as bitsandbytes NF4 with bf16 compute (QLoRA); it requires `use_peft`.
    """

    def __post_init__(self):
        super().__post_init__()
        if (self.load_in_4bit or self.load_in_8bit) and not self.use_peft:
            raise VLMGRPOError("load_in_4bit/load_in_8bit train only adapters: also set use_peft: true.")
