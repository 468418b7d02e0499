"""TRL's vLLM backend (`trainer.vllm_generation`), adapted to vision-language models: `VLLMSampler`.

Four changes to what TRL does: the weights TRL syncs are named as the family's vLLM model loads them; after a sync
vLLM's encoder cache is emptied too, so that images it has seen are encoded by the new vision tower; in colocate
mode each row's videos reach the engine beside its images (`ColocatedVideos`); and at the end of a run vLLM's own
process groups are destroyed through vLLM. The prompts vLLM receives are built by
`vllm_payload`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from accelerate.utils import is_peft_model

from ...errors import VLMGRPOError
from ...models import EncodedPrompt, ModelFamily
from .payload import (
    add_videos,
    build_vllm_payload,
    check_vllm_prompts,
    vllm_generate_kwargs,
    vllm_history_prompts,
)


def name_weights_for_vllm(vllm_generation: Any, family: ModelFamily, copied: bool = False) -> None:
    """Make TRL's weight sync hand vLLM each parameter in the family's vLLM layout (see `ModelFamily.vllm_weights`).

    Args:
        vllm_generation (`Any`): TRL's `VLLMGeneration` of the trainer.
        family (`ModelFamily`): the policy's family.
        copied (`bool`, *optional*, defaults to `False`): hand over copies of the parameters. Server mode with LoRA
            needs them: TRL merges the adapter, iterates the parameters and unmerges it once the iteration ends, while
            the weight transfer packs the last tensors it was handed only after that, so without copies the server
            got the base model's weights for them (on a tiny model, for all of them) and kept sampling the base model.
    """
    trl_weights = vllm_generation._iter_named_params

    def vllm_weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in trl_weights():
            yield from family.vllm_weights(name, tensor.detach().clone() if copied else tensor)

    vllm_generation._iter_named_params = vllm_weights


class ColocatedVideos:
    """Hands each row's videos to the colocated engine, beside the images TRL's `generate` passes.

    TRL's `VLLMGeneration.generate` builds one `{"prompt_token_ids", "multi_modal_data": {"image": ...}}` per row and
    passes no video; inside `passing(videos)`, the engine's `generate` receives those prompts with each row's videos
    added (`vllm_payload.add_videos`). Colocate mode with one process per engine hands the rows in order, one prompt
    per row (`n=1`), which is what lets the rows and their videos be matched.

    Args:
        vllm_generation (`Any`): TRL's `VLLMGeneration` of the trainer, in colocate mode.
    """

    def __init__(self, vllm_generation: Any):
        self._videos: list | None = None
        engine_generate = vllm_generation.llm.generate

        def generate(prompts: Any, *args: Any, **kwargs: Any) -> Any:
            if self._videos is not None:
                prompts = add_videos(prompts, self._videos)
            return engine_generate(prompts, *args, **kwargs)

        vllm_generation.llm.generate = generate

    @contextmanager
    def passing(self, videos: list | None) -> Iterator[None]:
        """Add `videos` (`VLLMPayload.videos`, one entry per row) to the prompts of the engine's next `generate`."""
        self._videos = videos
        try:
            yield
        finally:
            self._videos = None


def sync_weights(vllm_generation: Any, vllm_mode: str, is_main_process: bool) -> None:
    """TRL's weight sync into vLLM, then vLLM's encoder cache is emptied (the engine's, or the server's).

    vLLM reuses the image features it computed for an image it has seen (its encoder cache); TRL resets only the
    prefix cache after a sync, so the same images would keep the features of the old vision tower.

    Args:
        vllm_generation (`Any`): TRL's `VLLMGeneration` of the trainer.
        vllm_mode (`str`): `"colocate"` or `"server"`.
        is_main_process (`bool`): whether this process holds TRL's client of the server (server mode).
    """
    vllm_generation.sync_weights()
    if vllm_mode == "colocate":
        vllm_generation.llm.llm_engine.reset_encoder_cache()
    elif is_main_process:  # an empty answer, which the client's JSON `_post` cannot read
        client = vllm_generation.vllm_client
        client.session.post(f"{client.base_url}/reset_encoder_cache").raise_for_status()


def release_process_groups() -> None:
    """Destroy the process groups vLLM set up in this process (colocate), through vLLM.

    vLLM keeps its groups in its own state and destroys them again when it is finalized at exit; destroyed from
    outside first, they make that finalizer print "Exception ignored ... Invalid process group specified".
    """
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


class VLLMSampler:
    """Samples completions with TRL's vLLM backend, colocated or through `trl vllm-serve`.

    The first turn hands vLLM raw images, sampled video frames (colocate mode) and prompts with unexpanded
    placeholders (`vllm_payload`); the turns after a tool result hand it each row's history (`vllm_history_prompts`).
    The engine's weights follow the policy: `sync` sends them when the policy's version (the optimizer steps taken)
    differs from the one the engine holds, as TRL does once per optimizer step.

    Where TRL's backend collects every process's prompts (server mode, and colocate mode with tensor parallelism), it
    hands each process back the slice of its own index times its own row count, which holds only when every process
    sends as many rows: the turns after a tool result, whose row counts differ between processes, are padded to the
    largest count with copies of a row and the copies' completions dropped (`next_turns`).

    Args:
        vllm_generation (`Any`): TRL's `VLLMGeneration` of the trainer.
        mode (`str`): `"colocate"` or `"server"`.
        family (`ModelFamily`): the policy's family.
        processor (`ProcessorMixin`): the family's processor.
        is_main_process (`bool`): whether this process holds TRL's client of the server (server mode).
        collects_processes (`bool`): TRL's backend gathers the prompts of several processes into one call.
    """

    def __init__(
        self,
        vllm_generation: Any,
        mode: str,
        family: ModelFamily,
        processor: Any,
        is_main_process: bool,
        collects_processes: bool,
    ):
        self.backend, self.mode, self.family, self.processor = vllm_generation, mode, family, processor
        self.is_main_process, self.collects_processes = is_main_process, collects_processes
        name_weights_for_vllm(
            vllm_generation, family, copied=mode == "server" and is_peft_model(vllm_generation.model)
        )
        self._videos = ColocatedVideos(vllm_generation) if mode == "colocate" else None
        self.version: int | None = None  # the policy version whose weights the engine holds
        self._step = 1

    def sync(self, version: int, profile: Any = None) -> None:
        """Send the policy's weights to the engine unless it holds `version` already.

        Args:
            version (`int`): the policy's version (TRL's `state.global_step`).
            profile (`Callable[[str], AbstractContextManager]`, *optional*): times a named block (TRL's profiling).
        """
        self._step = version + 1  # the step the next batch trains as, counted from 1 as on the console
        if version != self.version:
            self.push(profile)
            self.version = version

    def push(self, profile: Any = None) -> None:
        """Send the policy's weights to the engine now (TRL's sync, then vLLM's encoder cache emptied).

        Args:
            profile (`Callable[[str], AbstractContextManager]`, *optional*): times a named block (TRL's profiling).
        """
        with profile("sync_weights") if profile else nullcontext(), self._server_answers("the weight sync"):
            sync_weights(self.backend, self.mode, self.is_main_process)

    def sample(
        self,
        rows: list[dict[str, Any]],
        encoded: list[EncodedPrompt],
        num_generations: int,
        template_kwargs: dict[str, Any] | list[dict[str, Any]],
        profile: Any = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The first turn: `(completion ids, the sampled tokens' log-probs)`, one per row.

        Args:
            rows (`list[dict]`): `{"prompt", "images", "videos"}` per row (`data.rows.load_rows`).
            encoded (`list[EncodedPrompt]`): the rows' prompts as the trainer encodes them.
            num_generations (`int`): G, the consecutive copies of each prompt.
            template_kwargs (`dict | list[dict]`): `apply_chat_template`'s arguments (tools included), one dict or one
                per row.
            profile (`Callable[[str], AbstractContextManager]`, *optional*): times a named block.
        """
        payload = build_vllm_payload(self.processor, self.family, rows, encoded, template_kwargs)
        kwargs = vllm_generate_kwargs(
            payload, num_generations, self.mode, expanded_prompt_ids=[e.input_ids for e in encoded]
        )
        videos = self._videos.passing(payload.videos) if self._videos else nullcontext()
        with videos, self._server_answers("generation"):
            vllm_prompt_ids, completion_ids, logprobs, _ = self.backend.generate(
                **kwargs, profiler=profile("vLLM.generate") if profile else None
            )
        if self.mode == "colocate":
            check_vllm_prompts(vllm_prompt_ids, [e.input_ids for e in encoded])
        return [list(ids) for ids in completion_ids], [[lp[0] for lp in seq] for seq in logprobs]

    def next_turns(
        self,
        histories: list[list[int]],
        images: list[list | None],
        most_rows: int,
        profile: Any = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The next turn of rows that called a tool, from their histories (prompt, turns, tool results).

        Args:
            histories (`list[list[int]]`): the rows' ids, placeholders expanded.
            images (`list`): each row's images (the prompt's, then the tools').
            most_rows (`int`): the most rows any process sends this turn (agreed by every process).
            profile (`Callable[[str], AbstractContextManager]`, *optional*): times a named block.
        """
        count = len(histories)
        if self.collects_processes and count < most_rows:
            histories = histories + [histories[0]] * (most_rows - count)
            images = images + [images[0]] * (most_rows - count)
        ids = vllm_history_prompts(self.family, self.processor, histories, self.mode)
        with self._server_answers("a tool turn's generation"):
            _, completion_ids, logprobs, _ = self.backend.generate(
                prompts=ids,
                images=images if any(images) else None,
                num_generations=1,
                profiler=profile("vLLM.generate") if profile else None,
            )
        return (
            [list(c) for c in completion_ids[:count]],
            [[lp[0] for lp in seq] for seq in logprobs[:count]],
        )

    @contextmanager
    def _server_answers(self, what: str) -> Iterator[None]:
        """Server mode: a server that stops answering (killed, crashed, unreachable after the client's retries) stops
        the run with one line naming it and the step; the last complete checkpoint stays as it was. Its end shows as
        an HTTP error, or, during the weight sync, as the weight-transfer group losing its peer."""
        import requests

        try:
            yield
        except (requests.exceptions.RequestException, RuntimeError) as error:
            lost_peer = isinstance(error, RuntimeError) and "by peer" in str(error)
            if self.mode != "server" or not (
                lost_peer or isinstance(error, requests.exceptions.RequestException)
            ):
                raise
            url = self.backend.vllm_client.base_url
            reason = " ".join(str(error).split())[:200]
            raise VLMGRPOError(
                f"The vLLM server at {url} stopped answering during {what} for step {self._step} "
                f"({type(error).__name__}: {reason}). Restart it (trl vllm-serve ...), then resume from the last "
                "complete checkpoint with resume_from_checkpoint: true."
            ) from error
