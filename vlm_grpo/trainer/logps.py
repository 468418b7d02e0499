"""The log-prob passes: one chunk of rows through the policy (or the reference), shared prefix or full rows.

A chunk either runs each group's prompt once (`policy.shared_prefix`), or its full rows, scored by TRL's fused LM
head. Frozen vision's stored features are reused in both. Under ZeRO-3 over several processes with the vision tower
trained, a chunk that lacks a kind of media (image, video) that another process's chunk holds gets a dummy row of
the kinds it lacks (`policy.vision_dummy`), so that every process runs the vision tower alike.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator

from ..models import EncodedPrompt, ModelFamily
from ..policy.adapters import base_model
from ..policy.image_features import ImageFeatureCache, reusing_features
from ..policy.shared_prefix import shared_prefix_logps
from ..policy.vision_dummy import add_dummy_row, drop_dummy_row, dummy_media_prompt, media_needed


class LogProbPasses:
    """Scores chunks of rows (see the module doc).

    Args:
        family (`ModelFamily`): the policy's family module.
        processor (`ProcessorMixin`): the family's processor (for the dummy rows).
        accelerator (`Accelerator`): the trainer's.
        image_features (`ImageFeatureCache`, *optional*): frozen vision's stored features, or None.
        dummy_rows (`bool`): ZeRO-3 over several processes with the vision tower trained.
        pad_token_id (`int`): the tokenizer's pad id.
    """

    def __init__(
        self,
        family: ModelFamily,
        processor: Any,
        accelerator: Accelerator,
        image_features: ImageFeatureCache | None,
        dummy_rows: bool,
        pad_token_id: int,
    ):
        self.family, self.processor, self.accelerator = family, processor, accelerator
        self.image_features, self.dummy_rows, self.pad_token_id = image_features, dummy_rows, pad_token_id
        self._dummies: dict[frozenset[str], EncodedPrompt] = {}  # by the kinds of media they hold

    def chunk(
        self,
        model: torch.nn.Module,
        ids: torch.Tensor,
        mask: torch.Tensor,
        logits_to_keep: int,
        image_inputs: list[dict[str, torch.Tensor]],
        shared: bool,
        compute_entropy: bool,
        compute_aux_loss: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(logps [b, C], entropies [b, C] | None, aux loss | None)` of one chunk of `[b, P+C]` rows.

        Args:
            model (`torch.nn.Module`): the model to call (wrapped or not), patched with TRL's fused LM head.
            ids (`torch.Tensor`): `[b, P+C]` left-padded prompts followed by completions.
            mask (`torch.Tensor`): `[b, P+C]`.
            logits_to_keep (`int`): C.
            image_inputs (`list[dict]`): the b rows' image inputs.
            shared (`bool`): run each group's prompt once.
            compute_entropy (`bool`): also return per-token entropies.
            compute_aux_loss (`bool`): also return the router aux loss (full rows only).
        """
        lacking = (
            media_needed(self.family, image_inputs, self.accelerator.device)
            if self.dummy_rows
            else frozenset()
        )
        if lacking:
            if lacking not in self._dummies:
                self._dummies[lacking] = dummy_media_prompt(
                    self.family, self.processor, self.accelerator.device, lacking
                )
            ids, mask, image_inputs = add_dummy_row(
                ids, mask, logits_to_keep, image_inputs, self._dummies[lacking], self.pad_token_id
            )
        aux = None
        base = base_model(self.accelerator, model)
        with self.accelerator.autocast(), reusing_features(self.image_features, base, image_inputs):
            if shared:
                logps, entropies = shared_prefix_logps(
                    model, base, self.family, ids, mask, logits_to_keep, image_inputs, compute_entropy
                )
            else:
                inputs = self.family.model_inputs(base.config, ids, mask, image_inputs)
                if compute_aux_loss:
                    inputs["output_router_logits"] = True
                labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)  # [b, P+C]
                labels[:, :-logits_to_keep] = -100
                outputs = model(**inputs, labels=labels, fused_lm_head=True)
                logps = outputs.log_probs[:, -logits_to_keep:]  # [b, C]
                entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
                aux = outputs.aux_loss if compute_aux_loss else None
        if lacking:
            logps = drop_dummy_row(logps)
            entropies = drop_dummy_row(entropies) if compute_entropy else None
        return logps, entropies, aux
