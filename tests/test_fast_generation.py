"""Fast generation: prompts prefilled into transformers' static cache and a compiled decoding step give the tokens of
the growing cache for the same draws, on every family, and compile once over varying prompt lengths."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import color_rows, grpo_args, length_reward
from datasets import Dataset
from peft import LoraConfig
from test_shared_prefix import rollout_batch
from torch._dynamo.utils import counters
from transformers import GenerationConfig

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.data.rows import load_rows
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.policy.adapters import base_model
from vlm_grpo.policy.fast_generation import CACHE_BUCKET, FastGeneration, decide_fast_generation
from vlm_grpo.policy.shared_prefix import shared_prefix_generate
from vlm_grpo.testing import DEFAULT_FAMILY, TINY_FAMILIES

TOKENS = 6  # sampled per row


def trainer_for(path, tmp_path, lora: bool, **overrides) -> VLMGRPOTrainer:
    return VLMGRPOTrainer(
        model=path, reward_funcs=length_reward, args=grpo_args(tmp_path, max_completion_length=TOKENS, **overrides),
        train_dataset=Dataset.from_list(color_rows(6, text_only_every=3)),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False) if lora else None,
    )  # fmt: skip


def sampling_config(trainer: VLMGRPOTrainer) -> GenerationConfig:
    """Sampling with every logit returned, placeholders suppressed, exactly TOKENS tokens."""
    return GenerationConfig(
        do_sample=True, temperature=0.9, top_k=20, top_p=0.95, max_new_tokens=TOKENS, min_new_tokens=TOKENS,
        output_logits=True, return_dict_in_generate=True, pad_token_id=trainer._tokenizer.pad_token_id,
        suppress_tokens=trainer.placeholder_token_ids,
    )  # fmt: skip


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_static_cache_samples_the_growing_caches_tokens(family, lora, tiny_model, tmp_path):
    """Image and text-only prompts: each group's prompt (or each row's) prefilled into a static cache gives the
    tokens and logits of `generate` with its growing cache, from the same seed."""
    trainer = trainer_for(tiny_model(family), tmp_path, lora)
    model, base = trainer.model.eval(), base_model(trainer.accelerator, trainer.model)
    config = sampling_config(trainer)
    batch = rollout_batch(trainer, color_rows(6, text_only_every=3))
    ids, mask, images = batch["prompt_ids"], batch["prompt_mask"], batch["image_inputs"]
    torch.manual_seed(0)
    with torch.no_grad():
        reference = model.generate(
            **trainer.family.model_inputs(base.config, ids, mask, images), generation_config=config
        )
    shares = (False, True) if trainer.family.indexable_cache else (False,)
    for share in shares:
        torch.manual_seed(0)
        with torch.no_grad():
            fast = shared_prefix_generate(
                model, base, trainer.family, ids, mask, images, max_cache_len=CACHE_BUCKET, share=share,
                generation_config=config,
            )  # fmt: skip
        assert torch.equal(fast.sequences, reference.sequences), share
        for a, b in zip(fast.logits, reference.logits, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=0), share


def test_compiled_decoding_compiles_once_over_prompt_lengths(tiny_model, tmp_path, caplog):
    """`fast_generation: true` on the CPU: the trainer's generation (shared and full rows, LoRA on) gives today's
    tokens, and batches of other prompt lengths within one cache bucket reuse the compiled step."""
    with caplog.at_level(logging.INFO, logger="vlm_grpo"):
        trainer = trainer_for(tiny_model(DEFAULT_FAMILY), tmp_path, lora=True, fast_generation="true")
    fast = trainer.rollout.transformers.fast
    assert fast.enabled and "decoding compiled (cpu)" in caplog.text
    trainer.model.eval()
    batches = [color_rows(4, text_only_every=2), color_rows(4, images_per_prompt=2)]  # 8 rows each
    graphs = []
    for rows in batches:
        encoded = trainer.rollout.encode_prompts(
            load_rows([r for r in rows for _ in range(2)])
        )  # 2 rows per group
        for shared in (True, False):
            sampled = {}
            for decision in (fast, FastGeneration(False, "the growing cache")):
                trainer.rollout.transformers.fast = decision
                torch.manual_seed(0)
                sampled[decision.enabled] = trainer.rollout.transformers.sample(encoded, shared)
            graphs.append(counters["stats"]["unique_graphs"])
            assert sampled[True] == sampled[False]
    widths = [
        max(len(e.input_ids) for e in trainer.rollout.encode_prompts(load_rows(rows))) for rows in batches
    ]
    assert widths[0] != widths[1]  # batches of other prompt lengths (the same number of rows) ...
    assert graphs[0] >= 1 and len(set(graphs)) == 1  # ... share one compiled step


@pytest.mark.parametrize(
    ("mode", "device", "kwargs", "enabled", "reason"),
    [
        (
            "auto",
            "cpu",
            {},
            False,
            "auto: off on cpu, where a static cache and a compiled step were measured",
        ),
        ("auto", "cuda", {}, True, "fast_generation: auto: prompts prefilled into a static cache"),
        (
            "auto",
            "mps",
            {},
            False,
            "auto: off on mps, where a static cache and a compiled step have not been",
        ),
        (
            "auto",
            "cuda",
            {"zero3": True},
            False,
            "fast_generation: auto, but ZeRO-3 gathers the weights anew",
        ),
        ("true", "cuda", {}, True, "decoding compiled (cuda)"),
        ("true", "cpu", {}, True, "decoding compiled (cpu)"),
        ("false", "cuda", {}, False, "fast_generation: false"),
        (
            "true",
            "cuda",
            {"cache_implementation": "static"},
            False,
            "cache_implementation 'static' makes generate",
        ),
        ("true", "cuda", {"num_beams": 2}, False, "select beam_search decoding"),
        ("true", "cuda", {"quantized": True}, False, "the weights are quantized"),
        ("true", "cuda", {"zero3": True}, False, "ZeRO-3 gathers the weights anew"),
    ],
)
def test_the_decision_says_why_in_one_line(mode, device, kwargs, enabled, reason):
    flags = {k: kwargs.pop(k) for k in ("quantized", "zero3") if k in kwargs}
    config = GenerationConfig(do_sample=kwargs.pop("num_beams", 1) == 1, max_new_tokens=8, **kwargs)
    if not config.do_sample:
        config.num_beams = 2
    decision = decide_fast_generation(
        mode, torch.device(device), config, flags.get("quantized", False), flags.get("zero3", False)
    )
    assert decision.enabled == enabled and reason in decision.reason and "\n" not in decision.reason
    if (
        enabled
    ):  # CUDA graphs on a GPU; elsewhere inductor without them, which transformers is told to compile
        assert decision.compile_config.mode == ("reduce-overhead" if device == "cuda" else "default")
        assert decision.compile_config._compile_all_devices == (device != "cuda" or None)
        assert (
            decision.max_cache_len(300, 128) == 2 * CACHE_BUCKET
            and decision.max_cache_len(10, 8) == CACHE_BUCKET
        )
        assert not decision.generation_config(config).disable_compile
    else:
        assert decision.max_cache_len(300, 128) is None and decision.generation_config(config) is config
    assert not decide_fast_generation(mode, torch.device(device), None, False, False).enabled  # vLLM samples


def test_option_values(tmp_path):
    assert grpo_args(tmp_path, fast_generation=True).fast_generation == "true"
    assert grpo_args(tmp_path).fast_generation == "auto"
    with pytest.raises(VLMGRPOError, match="fast_generation must be true, false or auto, got 'fast'"):
        grpo_args(tmp_path, fast_generation="fast")
    with pytest.raises(
        VLMGRPOError, match="^fast_generation: true speeds up transformers' generate, but use_vllm"
    ):
        grpo_args(tmp_path, fast_generation="true", use_vllm=True)


def test_an_option_that_builds_its_own_cache_keeps_generate_as_configured(tiny_model, tmp_path, caplog):
    """`cache_implementation` (TRL's option) makes `generate` build its own cache: the fast path steps aside, with one
    log line, and training runs as configured."""
    with caplog.at_level(logging.INFO, logger="vlm_grpo"):
        trainer = trainer_for(
            tiny_model(DEFAULT_FAMILY),
            tmp_path,
            lora=False,
            fast_generation="true",
            cache_implementation="static",
        )
    assert not trainer.rollout.transformers.fast.enabled
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fast_generation:")]
    assert lines == ["fast_generation: true, but cache_implementation 'static' makes generate build its own cache: "
                     "generate runs as it is configured"]  # fmt: skip
    trainer.train()
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)


def test_training_steps_reuse_one_compiled_decoding_step(tiny_model, tmp_path):
    """Three steps with LoRA, gradient checkpointing and a reference pass: generation compiles once, and nothing in
    the steps between (checkpointing turned off and on, weights updated) makes it compile again."""
    trainer = trainer_for(
        tiny_model(DEFAULT_FAMILY), tmp_path, lora=True, fast_generation="true", max_steps=3,
        gradient_checkpointing=True, beta=0.04,
    )  # fmt: skip
    before = counters["stats"]["unique_graphs"]
    trainer.train()
    assert counters["stats"]["unique_graphs"] == before + 1
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)
