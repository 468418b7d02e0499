"""TRL's vLLM backend (`trainer.vllm_generation`), adapted to vision-language models.

Four changes to what TRL does: the weights TRL syncs are named as the family's vLLM model loads them; after a sync
vLLM's encoder cache is emptied too, so that images it has seen are encoded by the new vision tower; in colocate
mode each row's videos reach the engine beside its images (`ColocatedVideos`); and at the end of a run vLLM's own
process groups are destroyed through vLLM. The prompts vLLM receives are built by
`vllm_payload`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ...models import ModelFamily
from .payload import add_videos


def name_weights_for_vllm(vllm_generation: Any, family: ModelFamily) -> None:
    """Make TRL's weight sync hand vLLM each parameter in the family's vLLM layout (see `ModelFamily.vllm_weights`).

    Args:
        vllm_generation (`Any`): TRL's `VLLMGeneration` of the trainer.
        family (`ModelFamily`): the policy's family.
    """
    trl_weights = vllm_generation._iter_named_params

    def vllm_weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in trl_weights():
            yield from family.vllm_weights(name, tensor)

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
