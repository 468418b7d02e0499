"""Sampling with transformers' `generate`: each group's prompt prefilled once where the batch shares it.

`TransformersSampler` samples the first turn of a generation batch (`sample`: one completion per row, cut after its
first eos) and the turns after a tool result (`next_turns`). The model is the policy the trainer trains, gathered
under ZeRO-3 as TRL gathers it (`unwrap_model_for_generation`), without gradients, with frozen vision's stored image
features (`policy.image_features`). Where the batch shares each group's prompt, or `fast_generation` decodes from a
static cache, the prompts are prefilled here (`policy.shared_prefix`) and `generate` continues from their cache.

Under ZeRO-3 over several processes every forward call starts with a collective (DeepSpeed's parameter
coordinator, even with the whole model gathered), and `generate` keeps every process decoding until all are done: so
every process calls it the same number of times per batch, by the same path (shared prefix or full rows), with at
least one row (the tool loop hands a process whose rows made no call a filler row; see `tools.ToolLoop`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from transformers import GenerationConfig
from trl.models import unwrap_model_for_generation

from ..models import EncodedPrompt, ModelFamily
from ..policy.adapters import base_model, drop_repeated_input_grad_hooks
from ..policy.fast_generation import FastGeneration
from ..policy.image_features import ImageFeatureCache, reusing_features
from ..policy.image_rows import ToolImageInputs, row_image_inputs
from ..policy.shared_prefix import shared_prefix_continue, shared_prefix_generate
from .batch import pad_rows


@dataclass(frozen=True)
class GenerateSettings:
    """What `generate` runs with, fixed for a run.

    Attributes:
        generation_config (`GenerationConfig`): TRL's config for `generate` (eos ids and suppressed placeholders merged).
        generation_kwargs (`dict`): TRL's `generation_kwargs`, set on the model while it generates.
        eos_token_ids (`list[int]`): a completion ends after the first of these.
        pad_token_id (`int`): the tokenizer's pad id.
        pad_to_multiple_of (`int`, *optional*): TRL's `pad_to_multiple_of`.
        gather_for_generation (`bool`): TRL's `ds3_gather_for_generation`.
        gradient_checkpointing (`bool`): TRL turns checkpointing off for generation and on after it.
        gradient_checkpointing_kwargs (`dict`, *optional*): its arguments.
    """

    generation_config: GenerationConfig
    generation_kwargs: dict[str, Any]
    eos_token_ids: list[int]
    pad_token_id: int
    pad_to_multiple_of: int | None
    gather_for_generation: bool
    gradient_checkpointing: bool
    gradient_checkpointing_kwargs: dict[str, Any] | None


class TransformersSampler:
    """Samples completions with the policy's `generate`.

    Args:
        policy (`Callable[[], torch.nn.Module]`): the policy as the trainer wraps it now (`model_wrapped`: DeepSpeed,
            DDP), which `Trainer.train` wraps after construction.
        accelerator (`Accelerator`): the trainer's.
        family (`ModelFamily`): the policy's family module.
        processor (`ProcessorMixin`): the family's processor.
        settings (`GenerateSettings`): what `generate` runs with.
        fast (`FastGeneration`): whether prompts are prefilled into a static cache and decoding compiled.
        image_features (`ImageFeatureCache`, *optional*): frozen vision's stored features, or None.
    """

    def __init__(
        self,
        policy: Callable[[], torch.nn.Module],
        accelerator: Accelerator,
        family: ModelFamily,
        processor: Any,
        settings: GenerateSettings,
        fast: FastGeneration,
        image_features: ImageFeatureCache | None,
    ):
        self.policy, self.accelerator, self.family, self.processor = policy, accelerator, family, processor
        self.settings, self.image_features = settings, image_features
        self.fast = fast

    @property
    def fast(self) -> FastGeneration:
        """Whether prompts are prefilled into a static cache and decoding compiled."""
        return self._fast

    @fast.setter
    def fast(self, decision: FastGeneration) -> None:
        self._fast = decision
        # `generate`'s config with the compiled decoding step, built once per decision
        self.fast_generation_config = decision.generation_config(self.settings.generation_config)

    def sample(self, encoded: Sequence[EncodedPrompt], shared: bool) -> list[list[int]]:
        """One completion per row, cut after its first eos.

        Args:
            encoded (`Sequence[EncodedPrompt]`): the rows' prompts; rows of one group share one object.
            shared (`bool`): prefill each group's prompt once (see `SharingPolicy.shares_generation`).
        """
        prompt_ids, prompt_mask = self._left_padded([e.input_ids for e in encoded])  # [B, P]
        image_inputs = [e.image_inputs for e in encoded]
        max_new = self.settings.generation_config.max_new_tokens
        max_cache_len = self.fast.max_cache_len(prompt_ids.size(1), max_new)
        with self.generating(image_inputs) as model:
            if shared or max_cache_len is not None:  # the rows continue from a cache prefilled here
                output = shared_prefix_generate(
                    model, base_model(self.accelerator, model), self.family, prompt_ids, prompt_mask,
                    image_inputs, max_cache_len=max_cache_len, share=shared,
                    generation_config=self.fast_generation_config,
                )  # fmt: skip
            else:
                config = self.accelerator.unwrap_model(self.policy()).config
                inputs = self.family.model_inputs(config, prompt_ids, prompt_mask, image_inputs)
                output = model.generate(**inputs, generation_config=self.settings.generation_config)
        return self.cut(output[:, prompt_ids.size(1) :])

    def next_turns(
        self,
        histories: list[list[int]],
        images: list[list | None],
        prompts: list[EncodedPrompt] | None,
        tool_inputs: ToolImageInputs,
    ) -> list[list[int]]:
        """The next turn of rows that called a tool, from their histories (prompt, turns so far, tool results).

        Args:
            histories (`list[list[int]]`): the rows' ids.
            images (`list`): each row's images, the prompt's then the tools'.
            prompts (`list[EncodedPrompt]`, *optional*): the prompt each row starts with, when each group's prompt is
                prefilled once (see `tools.history_prompts`); None: each row runs whole.
            tool_inputs (`ToolImageInputs`): the batch's encoded tool images, which the training passes read too.
        """
        if prompts is not None:
            return self._continue_turns(histories, images, prompts, tool_inputs)
        device = self.accelerator.device
        encoded = []
        for ids, pictures in zip(histories, images, strict=True):
            inputs = self.family.encode_images(self.processor, pictures) if pictures else {}
            inputs = {k: v.to(device) for k, v in inputs.items()}
            encoded.append(
                EncodedPrompt(input_ids=list(ids), image_inputs=inputs, num_images=len(pictures or []))
            )
        return self.sample(encoded, shared=False)

    def _continue_turns(
        self,
        histories: list[list[int]],
        images: list[list | None],
        prompts: list[EncodedPrompt],
        tool_inputs: ToolImageInputs,
    ) -> list[list[int]]:
        """The next turn of multi-turn rows, each group's prompt prefilled once (see `shared_prefix_continue`): the
        rows' continuations (turns so far, tool results) and the tools' images run per row over the prompt's cache."""
        returned = [
            (pictures or [])[prompt.num_images :] for prompt, pictures in zip(prompts, images, strict=True)
        ]
        image_inputs = row_image_inputs(self.family, prompts, returned, tool_inputs)
        prompt_ids, prompt_mask = self._left_padded([p.input_ids for p in prompts])  # [B, P]
        continuation_ids, continuation_mask = self._left_padded(
            [h[len(p.input_ids) :] for h, p in zip(histories, prompts, strict=True)]
        )  # [B, T]
        with self.generating(image_inputs) as model:
            output = shared_prefix_continue(
                model, base_model(self.accelerator, model), self.family, prompt_ids, prompt_mask,
                continuation_ids, continuation_mask, image_inputs,
                generation_config=self.settings.generation_config,
            )  # fmt: skip
        return self.cut(output[:, prompt_ids.size(1) + continuation_ids.size(1) :])

    @contextmanager
    def generating(self, image_inputs: Sequence[dict]) -> Iterator[torch.nn.Module]:
        """The model to call `generate` on (ZeRO-3 parameters gathered as TRL does), without gradients, its stored
        image features reused. Every process must enter it together under ZeRO-3, rows or not."""
        settings = self.settings
        with (
            unwrap_model_for_generation(
                self.policy(),
                self.accelerator,
                gather_deepspeed3_params=settings.gather_for_generation,
                generation_kwargs=settings.generation_kwargs,
                gradient_checkpointing_kwargs=settings.gradient_checkpointing_kwargs,
            ) as unwrapped_model,
            torch.no_grad(),
            reusing_features(
                self.image_features, base_model(self.accelerator, unwrapped_model), image_inputs
            ),
        ):
            yield unwrapped_model
        if settings.gradient_checkpointing:  # TRL turned it off for generation and on again
            drop_repeated_input_grad_hooks(self.accelerator.unwrap_model(self.policy()))

    def cut(self, sampled: torch.Tensor) -> list[list[int]]:
        """Each row's sampled tokens `[B, N]` up to and including its first eos."""
        completion_ids = sampled.cpu()  # [B, N]
        is_eos = torch.isin(completion_ids, torch.tensor(self.settings.eos_token_ids))  # [B, N]
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, completion_ids.size(1))  # eos kept
        return [row[:n].tolist() for row, n in zip(completion_ids, lengths.tolist(), strict=True)]

    def _left_padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`(ids [B, L], mask [B, L])`: the rows left-padded as TRL pads prompts, on the device."""
        ids, mask = pad_rows(rows, self.settings.pad_token_id, "left", self.settings.pad_to_multiple_of)
        return ids.to(self.accelerator.device), mask.to(self.accelerator.device)
