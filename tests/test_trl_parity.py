"""A TRL user's config gives the same training with `VLMGRPOTrainer` as with stock `trl.GRPOTrainer`, or an error.

`test_one_step_matches_trl` runs TRL 1.16's own trainer and ours side by side on one tiny Qwen2-VL, from one seed,
for each option set in `CASES`: two optimizer steps over one rollout (`num_iterations=2`, so old log-probs, ratios
and clipping are live in the second step), plain SGD (Adam's first step is lr * sign(g), which turns rounding noise
into full-size steps). The completions sampled, every metric both log, and the final weights must agree.
The other tests each cover one behaviour that differed from TRL before.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from conftest import (
    FAMILIES,
    FULL_ROW_FAMILIES,
    color_dataset,
    color_rows,
    grpo_args,
    length_reward,
    square_image,
)
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForImageTextToText
from trl import GRPOConfig, GRPOTrainer

from vlm_grpo import VLMGRPOConfig, VLMGRPOTrainer, get_model_family
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.rollout.batch import is_truncated
from vlm_grpo.testing import DEFAULT_FAMILY, a_family_with, families_with, tiny_family
from vlm_grpo.trainer.setup import trl_view_of

COMMON = dict(
    max_steps=2,
    num_iterations=2,
    per_device_train_batch_size=4,
    num_generations=2,
    max_completion_length=6,
    learning_rate=0.1,
    optim="sgd",
    logging_steps=1,
    report_to="none",
    bf16=False,
    gradient_checkpointing=False,
    save_strategy="no",
    seed=0,
    disable_tqdm=True,
    use_cpu=True,
)


def vowel_reward(completions, **kwargs) -> list[float]:
    """A second reward for the multi-objective cases: the share of vowels in the completion."""
    texts = [c[0]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


CASES = {
    "default": {},
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "cispo": {"loss_type": "cispo"},
    "sapo": {"loss_type": "sapo", "sapo_temperature_neg": 1.2, "sapo_temperature_pos": 0.9},
    "luspo": {"loss_type": "luspo"},
    "vespo": {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_neg": 1.5},
    "beta": {"beta": 0.04},
    "clipping": {"epsilon": 0.05, "epsilon_high": 0.1, "delta": 1.2},
    "sequence_level": {"importance_sampling_level": "sequence"},
    "entropy": {"top_entropy_quantile": 0.5, "entropy_coef": 0.01},
    "adaptive_entropy": {"use_adaptive_entropy": True, "entropy_target": 0.3, "entropy_coef_delta": 0.01},
    "off_policy": {"off_policy_mask_threshold": 1e-4},
    "scale_batch": {"scale_rewards": "batch"},
    "normalize_then_sum": {"multi_objective_aggregation": "normalize_then_sum", "reward_weights": [1.0, 0.5]},
    "mask_truncated": {"mask_truncated_completions": True, "max_completion_length": 3},
    "pad_to_multiple_of": {"pad_to_multiple_of": 8},
    "sampling": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repetition_penalty": 1.1},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}},
    "disable_dropout": {"disable_dropout": True},
    "no_shuffle": {"shuffle_dataset": False},
    "log_completions": {"log_completions": True, "num_completions_to_print": 2, "log_unique_prompts": True},
}

# A chat template that renders `enable_thinking: false` into the prompt (as Qwen3-style templates do).
THINKING_PREFIX = (
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ 'no think ' }}{%- endif -%}"
)


@pytest.fixture(scope="module")
def qwen(tiny_model):
    """`(model path, processor with a template that reads enable_thinking, placeholder ids)` of the tiny Qwen2-VL."""
    path = tiny_model(DEFAULT_FAMILY)
    family = get_model_family(path)
    processor = family.load_processor(path)
    processor.chat_template = THINKING_PREFIX + processor.chat_template
    placeholders = family.placeholder_token_ids(
        processor, AutoModelForImageTextToText.from_pretrained(path).config
    )
    return path, processor, placeholders


def train_one(trainer_cls, config_cls, qwen, tmp_path, options):
    """Train `trainer_cls` for COMMON's two steps with `options`; return the trainer and its logged metrics."""
    path, processor, placeholders = qwen
    options = dict(options)
    rewards = [length_reward, vowel_reward] if "reward_weights" in options else [length_reward]
    # Stock TRL suppresses only the image token unless told otherwise; give it ours so sampling sees equal logits.
    options.setdefault("generation_kwargs", {"suppress_tokens": placeholders})
    args = config_cls(output_dir=str(tmp_path / trainer_cls.__name__), **{**COMMON, **options})
    torch.manual_seed(0)
    trainer = trainer_cls(
        model=path,
        reward_funcs=rewards,
        args=args,
        train_dataset=color_dataset(8),
        processing_class=processor,
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return trainer, logs


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_matches_trl(case, qwen, tmp_path):
    stock, stock_logs = train_one(GRPOTrainer, GRPOConfig, qwen, tmp_path, CASES[case])
    ours, our_logs = train_one(VLMGRPOTrainer, VLMGRPOConfig, qwen, tmp_path, CASES[case])
    assert ours._logs["completion"] == stock._logs["completion"]  # the same tokens were sampled
    assert len(our_logs) == len(stock_logs) == 2
    assert {"loss", "reward", "completions/mean_terminated_length"} <= set(our_logs[0])
    for stock_entry, our_entry in zip(stock_logs, our_logs, strict=True):
        shared = [k for k in stock_entry if k in our_entry and "time" not in k]
        assert "loss" in shared and "grad_norm" in shared
        for key in shared:
            if stock_entry[key] is None or our_entry[key] is None:
                assert stock_entry[key] is our_entry[key], key
                continue
            assert math.isclose(our_entry[key], stock_entry[key], rel_tol=1e-4, abs_tol=1e-5), key
    stock_params = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        torch.testing.assert_close(param, stock_params[name], rtol=1e-4, atol=1e-5, msg=name)


ROLLOUT_FAMILIES = families_with(core=True)
SCHEDULES = {  # (steps_per_generation, num_iterations): each rollout feeds spg * iterations optimizer steps
    "one_step_per_rollout": (1, 1),
    "two_micro_batches": (2, 1),
    "two_iterations": (1, 2),
    "two_micro_batches_two_iterations": (2, 2),
}


def recorded_length(completions, seen: list, **kwargs) -> list[float]:
    """`length_reward` that also records every batch of completions it scores (training and evaluation)."""
    seen.append([c[0]["content"] for c in completions])
    return length_reward(completions)


def train_rollouts(trainer_cls, config_cls, path, processor, placeholders, tmp_path, options):
    """Train 3 rollouts with an evaluation after every step; return the trainer and the completions scored."""
    seen: list[list[str]] = []
    args = config_cls(
        output_dir=str(tmp_path / trainer_cls.__name__),
        **{**COMMON, "generation_kwargs": {"suppress_tokens": placeholders}, **options},
    )
    torch.manual_seed(0)
    trainer = trainer_cls(
        model=path,
        reward_funcs=partial(recorded_length, seen=seen),
        args=args,
        train_dataset=color_dataset(8),
        eval_dataset=color_dataset(4),
        processing_class=processor,
    )
    trainer.train()
    return trainer, seen


def stock_and_ours(path: str, tmp_path, options: dict) -> tuple[tuple, tuple]:
    """`(trainer, completions)` of stock TRL and of ours (`share_prompt_prefix: false`), trained on the model at `path`
    with the family's processor and `options` (see `train_rollouts`)."""
    family = get_model_family(path)
    processor = family.load_processor(path)
    config = AutoModelForImageTextToText.from_pretrained(path).config
    placeholders = family.placeholder_token_ids(processor, config)
    stock = train_rollouts(GRPOTrainer, GRPOConfig, path, processor, placeholders, tmp_path, options)
    ours = train_rollouts(
        VLMGRPOTrainer, VLMGRPOConfig, path, processor, placeholders, tmp_path,
        {**options, "share_prompt_prefix": False},
    )  # fmt: skip
    return stock, ours


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("family", ROLLOUT_FAMILIES)
def test_three_rollouts_match_trl(family, schedule, tiny_model, tmp_path):
    """Three rollouts, evaluated after every step: the same completions, metrics and weights as stock TRL.

    `share_prompt_prefix: false` runs the passes TRL runs, so everything must agree to rounding, from the first
    sampled token of the first rollout to the last weight, whatever the micro-batch split.
    """
    spg, iterations = SCHEDULES[schedule]
    options = dict(
        steps_per_generation=spg, num_iterations=iterations, max_steps=3 * spg * iterations,
        eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4,
    )  # fmt: skip
    (stock, stock_seen), (ours, our_seen) = stock_and_ours(tiny_model(family), tmp_path, options)
    assert our_seen == stock_seen  # every completion of every rollout, training and evaluation
    # 3 rollouts, and an evaluation after each of the 3 * spg * iterations steps: 4 prompts x 2 in batches of 4
    assert len(stock_seen) == 3 + 2 * (3 * spg * iterations)
    assert len(ours.state.log_history) == len(stock.state.log_history)
    for stock_entry, our_entry in zip(stock.state.log_history, ours.state.log_history, strict=True):
        timings = {k for k in stock_entry if "time" in k or "per_second" in k}
        shared = set(stock_entry) - timings
        assert shared and shared <= set(our_entry)  # every metric stock logs, ours logs too
        for key in shared:
            assert math.isclose(our_entry[key], stock_entry[key], rel_tol=1e-4, abs_tol=1e-5), key
    stock_params = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        torch.testing.assert_close(param, stock_params[name], rtol=1e-4, atol=1e-5, msg=name)


SAMPLING_FIELDS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "cache_implementation",
)


@pytest.mark.parametrize("family", [*FAMILIES, *FULL_ROW_FAMILIES])
def test_generate_samples_with_trls_settings(family, tiny_model, tmp_path, monkeypatch):
    """The tiny models carry their published sampling defaults (Qwen2.5-VL: temperature 1e-6, repetition penalty
    1.05; Qwen3-VL: top_k 20; Gemma 3: top_k 64, a hybrid cache ...); `generate` runs with the settings TRL chose."""
    from transformers import GenerationMixin

    used = []
    original = GenerationMixin._prepare_generation_config

    def recording(self, generation_config, **kwargs):
        config, model_kwargs = original(self, generation_config, **kwargs)
        used.append({name: getattr(config, name) for name in SAMPLING_FIELDS})
        return config, model_kwargs

    monkeypatch.setattr(GenerationMixin, "_prepare_generation_config", recording)
    args = grpo_args(tmp_path, max_steps=1, temperature=0.9, share_prompt_prefix=True)
    trainer = VLMGRPOTrainer(tiny_model(family), length_reward, args=args, train_dataset=color_dataset(4))
    published = trainer.model.generation_config
    assert published.do_sample or not tiny_family(family).sampling.get("do_sample")
    trainer.train()
    chosen = dict(
        do_sample=True, temperature=0.9, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, cache_implementation=None,
    )  # fmt: skip
    assert used and all(u == chosen for u in used), (used, published)


@pytest.mark.parametrize("family", [*FAMILIES, *FULL_ROW_FAMILIES])
def test_evaluation_ends_completions_on_the_training_eos_ids(family, tiny_model, tmp_path):
    """`vlm-grpo eval` stops on `ModelFamily.eos_token_ids`, which are the ids TRL's trainer stops on."""
    args = grpo_args(tmp_path)
    trainer = VLMGRPOTrainer(tiny_model(family), length_reward, args=args, train_dataset=color_dataset(4))
    assert trainer.family.eos_token_ids(trainer.processing_class, trainer.model) == trainer.eos_token_ids


def test_cast_lm_head_to_fp32_as_trl_on_an_untied_model(tiny_model, tmp_path):
    options = dict(max_steps=2, beta=0.04, cast_lm_head_to_fp32=True)
    path = tiny_model(a_family_with(tied_embeddings=False))  # the language model keeps its own LM head
    (stock, stock_seen), (ours, our_seen) = stock_and_ours(path, tmp_path, options)
    assert our_seen == stock_seen
    stock_params = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        torch.testing.assert_close(param, stock_params[name], rtol=1e-4, atol=1e-5, msg=name)


def test_cast_lm_head_to_fp32_with_tied_embeddings(tiny_model, tmp_path):
    """Stock TRL 1.16 fails on a tied VLM (it looks for `model.model.embed_tokens`); ours computes the LM head of the
    policy and of the reference in float32 while the shared embedding's outputs keep the model's dtype."""
    path = tiny_model(a_family_with(tied_embeddings=True))  # as the 2B-4B Qwen-VL checkpoints
    args = dict(
        max_steps=1, beta=0.04, cast_lm_head_to_fp32=True, model_init_kwargs={"dtype": torch.bfloat16}
    )
    with pytest.raises(AttributeError, match="embed_tokens"):
        GRPOTrainer(
            path, length_reward, args=GRPOConfig(output_dir=str(tmp_path / "stock"), **{**COMMON, **args}),
            train_dataset=color_dataset(4),
        )  # fmt: skip
    trainer = VLMGRPOTrainer(
        path, length_reward, args=grpo_args(tmp_path, **args), train_dataset=color_dataset(4)
    )
    trainer.train()
    for model in (trainer.model, trainer.ref_model):
        embedding = model.get_input_embeddings()
        assert model.lm_head.weight is embedding.weight and model.config.tie_word_embeddings
        assert model.lm_head.weight.dtype == torch.float32
        assert embedding(torch.tensor([[1, 2]])).dtype == torch.bfloat16
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


def test_chat_template_kwargs_reach_the_training_prompt(qwen, tmp_path):
    path, processor, _ = qwen
    rows = color_rows(2)
    plain = VLMGRPOTrainer(
        path,
        length_reward,
        args=grpo_args(tmp_path),
        train_dataset=color_dataset(4),
        processing_class=processor,
    )
    kwargs = grpo_args(tmp_path, chat_template_kwargs={"enable_thinking": False})
    thinking_off = VLMGRPOTrainer(
        path, length_reward, args=kwargs, train_dataset=color_dataset(4), processing_class=processor
    )
    from vlm_grpo.data.rows import load_rows

    ids_plain = plain.rollout.encode_prompts(load_rows(rows))[0].input_ids
    ids_off = thinking_off.rollout.encode_prompts(load_rows(rows))[0].input_ids
    text = processor.apply_chat_template(
        [rows[0]["prompt"]], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    expected = processor(text=text, images=[rows[0]["images"]])["input_ids"][0]
    assert len(ids_off) > len(ids_plain) and list(ids_off) == list(expected)


def test_chat_template_kwargs_reach_the_vllm_prompt(qwen):
    """The vLLM payload renders prompts with the same `chat_template_kwargs` as the training prompts."""
    from vlm_grpo.data.rows import load_rows
    from vlm_grpo.rollout.vllm.payload import build_vllm_payload

    path, processor, _ = qwen
    rows, family = load_rows(color_rows(2)), get_model_family(path)
    plain = build_vllm_payload(processor, family, rows)
    thinking_off = build_vllm_payload(
        processor, family, rows, chat_template_kwargs={"enable_thinking": False}
    )
    assert [f"no think {text}" for text in plain.texts] == thinking_off.texts


def test_pretrained_adapter_is_its_own_reference(qwen, tmp_path):
    """A PEFT model with a trained adapter and beta > 0: the reference is a frozen copy of that adapter (KL 0)."""
    path, processor, _ = qwen
    model = AutoModelForImageTextToText.from_pretrained(path)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a trained adapter: the policy is not the base model
    args = grpo_args(tmp_path, beta=0.1, learning_rate=0.0, max_steps=1)
    trainer = VLMGRPOTrainer(
        model, length_reward, args=args, train_dataset=color_dataset(4), processing_class=processor
    )
    assert "ref" in trainer.model.peft_config
    trainer.train()
    kl = [e["kl"] for e in trainer.state.log_history if "kl" in e]
    assert kl and abs(kl[0]) < 1e-6


def test_reward_log_metric_and_log_extra_are_flushed(qwen, tmp_path):
    def logging_reward(completions, log_metric, log_extra, **kwargs):
        log_metric("my_metric", 1.5)
        log_extra("my_column", [len(c[0]["content"]) for c in completions])
        return [float(len(c[0]["content"])) for c in completions]

    path, processor, _ = qwen
    trainer = VLMGRPOTrainer(
        path,
        logging_reward,
        args=grpo_args(tmp_path),
        train_dataset=color_dataset(8),
        processing_class=processor,
    )
    trainer.train()
    assert [e["my_metric"] for e in trainer.state.log_history if "my_metric" in e] == [1.5, 1.5]
    assert len(trainer._logs["extra"]["my_column"]) == 4 and not trainer._pending_metrics  # the last rollout
    assert not trainer._pending_extra_logs


def test_images_given_as_file_paths_train(qwen, tmp_path):
    path, processor, _ = qwen
    rows = color_rows(8)
    for i, row in enumerate(rows):
        file = tmp_path / f"{i}.png"
        row["images"][0].save(file)
        row["images"] = [str(file)]
    seen = []

    def reward(completions, images, **kwargs):
        seen.extend(images)
        return [float(len(c[0]["content"])) for c in completions]

    trainer = VLMGRPOTrainer(
        path,
        reward,
        args=grpo_args(tmp_path),
        train_dataset=Dataset.from_list(rows),
        processing_class=processor,
    )
    trainer.train()
    assert seen and all(
        isinstance(x, list) and isinstance(x[0], str) for x in seen
    )  # as TRL: the column as given


def test_rewards_receive_the_multimodal_prompt(qwen, tmp_path):
    path, processor, _ = qwen
    prompts_seen = []

    def reward(prompts, completions, **kwargs):
        prompts_seen.extend(prompts)
        return [1.0] * len(completions)

    args = grpo_args(tmp_path, max_steps=1)
    trainer = VLMGRPOTrainer(
        path, reward, args=args, train_dataset=color_dataset(4), processing_class=processor
    )
    trainer.train()
    parts = prompts_seen[0][0]["content"]
    assert parts[0]["type"] == "image" and parts[0]["image"].size == square_image("red").size
    assert parts[1] == {"type": "text", "text": "What color is the square ?"}


def test_generation_kwargs_merge_with_placeholder_suppression(qwen, tmp_path):
    path, processor, placeholders = qwen
    stop = processor.tokenizer.convert_tokens_to_ids("red")
    banned = processor.tokenizer.convert_tokens_to_ids("blue")
    args = grpo_args(tmp_path, generation_kwargs={"suppress_tokens": [banned], "eos_token_id": stop})
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(4), processing_class=processor
    )
    assert set(trainer.generation_config.suppress_tokens) == {*placeholders, banned}
    assert stop in trainer.eos_token_ids and processor.tokenizer.eos_token_id in trainer.eos_token_ids
    assert set(trainer.generation_config.eos_token_id) == set(trainer.eos_token_ids)


def test_sync_ref_model_checks_as_trl(qwen, tmp_path):
    path, processor, _ = qwen
    with pytest.raises(VLMGRPOError, match="sync_ref_model: true with beta: 0.0"):
        grpo_args(tmp_path, sync_ref_model=True)
    args = grpo_args(tmp_path, sync_ref_model=True, beta=0.1)
    with pytest.raises(VLMGRPOError, match="sync_ref_model with PEFT"):
        VLMGRPOTrainer(
            path, length_reward, args=args, processing_class=processor, peft_config=LoraConfig(r=4)
        )
    args = grpo_args(
        tmp_path, sync_ref_model=True, beta=0.1, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0
    )
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(4), processing_class=processor
    )
    trainer.train()  # alpha 1.0 copies the policy into the reference at every sync step
    for (name, ref), param in zip(
        trainer.ref_model.named_parameters(), trainer.model.parameters(), strict=True
    ):
        torch.testing.assert_close(ref, param, msg=name)


def test_reward_model_path_loads_with_model_init_kwargs(qwen, tmp_path):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    path, processor, _ = qwen
    config = Qwen2Config(
        vocab_size=len(processor.tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=processor.tokenizer.pad_token_id,
    )  # fmt: skip
    Qwen2ForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    processor.tokenizer.save_pretrained(tmp_path / "rm")
    args = grpo_args(tmp_path, model_init_kwargs={"attn_implementation": "eager"})
    trainer = VLMGRPOTrainer(
        path, str(tmp_path / "rm"), args=args, train_dataset=color_dataset(4), processing_class=processor
    )
    assert isinstance(trainer.reward_funcs[0], Qwen2ForSequenceClassification)
    assert trainer.reward_funcs[0].config._attn_implementation == "eager"
    assert trainer.model.config._attn_implementation == "eager"


@pytest.mark.parametrize("share_prompt_prefix", [True, False])
def test_cache_implementation_with_shared_prefix(share_prompt_prefix, qwen, tmp_path):
    path, processor, _ = qwen
    args = grpo_args(tmp_path, cache_implementation="static", share_prompt_prefix=share_prompt_prefix)
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(8), processing_class=processor
    )
    assert trainer.generation_config.cache_implementation == "static"
    trainer.train()
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


def test_numpy_and_bool_rewards_are_accepted(qwen, tmp_path):
    def reward(completions, **kwargs):
        kinds = (np.float32, bool, np.bool_, np.int64)
        return [kinds[i % 4](len(c[0]["content"]) % 3) for i, c in enumerate(completions)]

    path, processor, _ = qwen
    trainer = VLMGRPOTrainer(
        path, reward, args=grpo_args(tmp_path), train_dataset=color_dataset(8), processing_class=processor
    )
    trainer.train()
    assert all(math.isfinite(e["reward"]) for e in trainer.state.log_history if "reward" in e)


@pytest.mark.parametrize("log_multimodal", [True, False])
def test_log_multimodal_records_images(log_multimodal, qwen, tmp_path):
    path, processor, _ = qwen
    args = grpo_args(tmp_path, max_steps=1, log_multimodal=log_multimodal)
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(4), processing_class=processor
    )
    trainer.train()
    assert len(trainer._logs["images"]) == (4 if log_multimodal else 0)


def test_evaluation_uses_num_generations_eval(qwen, tmp_path):
    path, processor, _ = qwen
    args = grpo_args(
        tmp_path,
        max_steps=1,
        num_generations_eval=4,
        per_device_eval_batch_size=4,
        eval_strategy="steps",
        eval_steps=1,
    )
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(4), eval_dataset=color_dataset(4),
        processing_class=processor,
    )  # fmt: skip
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_reward" in e]
    assert evals and trainer.num_generations_eval == 4


def test_num_iterations_reuses_one_rollout(qwen, tmp_path):
    path, processor, _ = qwen
    args = grpo_args(tmp_path, max_steps=4, num_iterations=2)
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(8), processing_class=processor
    )
    rollouts = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: rollouts.append(1) or original(inputs)
    trainer.train()
    assert len(rollouts) == 2  # 4 optimizer steps, 2 iterations over each rollout


def test_off_policy_mask_uses_old_logps(qwen, tmp_path):
    path, processor, _ = qwen
    args = grpo_args(
        tmp_path, max_steps=2, num_iterations=2, off_policy_mask_threshold=0.0, learning_rate=0.5
    )
    trainer = VLMGRPOTrainer(
        path, length_reward, args=args, train_dataset=color_dataset(8), processing_class=processor
    )
    batch = trainer._generate_and_score_completions([r for r in color_rows(2) for _ in range(2)])
    assert "old_per_token_logps" in batch  # generation and updates misaligned: old log-probs are kept
    trainer.train()


def test_aux_loss_pass_runs_full_rows(qwen, tmp_path):
    path, processor, _ = qwen
    trainer = VLMGRPOTrainer(
        path,
        length_reward,
        args=grpo_args(tmp_path, share_prompt_prefix=True),
        train_dataset=color_dataset(4),
        processing_class=processor,
    )
    plan = trainer._generate_and_score_completions([r for r in color_rows(2) for _ in range(2)])["sharing"]
    assert plan.shares(builds_graph=True) and plan.shares(builds_graph=False)
    # the pass returning the aux loss is the training forward; a MoE model's plan runs it on full rows
    assert plan.shares(builds_graph=False, aux_loss=True) is plan.training


def test_truncation_is_judged_on_eos_or_pad():
    assert not is_truncated([5, 2], eos_token_ids=[2], pad_token_id=0)
    assert not is_truncated([5, 0], eos_token_ids=[2], pad_token_id=0)
    assert is_truncated([5, 6], eos_token_ids=[2], pad_token_id=0) and is_truncated([], [2], 0)


def test_vllm_sampling_logps_are_kept(qwen, tmp_path):
    path, processor, _ = qwen
    trainer = VLMGRPOTrainer(
        path,
        length_reward,
        args=grpo_args(tmp_path),
        train_dataset=color_dataset(4),
        processing_class=processor,
    )
    from vlm_grpo.data.rows import load_rows
    from vlm_grpo.rollout.batch import Sampled

    encoded = trainer.rollout.encode_prompts(load_rows(color_rows(2)))
    sampled = Sampled(color_rows(2), encoded, [[5, 6, 7], [5]], [[-0.1, None, -0.3], [-0.5]], [], False)
    batch = trainer._pad_batch(sampled, [e.image_inputs for e in encoded])
    logps = batch["sampling_per_token_logps"]  # [B, C]
    assert logps.shape == (2, 3) and torch.isnan(logps[0, 1]) and logps[1, 0] == -0.5 and logps[1, 1] == 0.0


def test_vllm_placeholders_get_a_logit_bias(qwen, tmp_path):
    path, processor, placeholders = qwen
    args = VLMGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_importance_sampling_correction=False,
        generation_kwargs={"logit_bias": {7: 2.0}},
    )  # fmt: skip
    with trl_view_of(args, builds_reference=False, placeholders=placeholders):
        bias = args.generation_kwargs["logit_bias"]
    assert bias == {**{i: -100.0 for i in placeholders}, 7: 2.0}
    assert args.generation_kwargs == {"logit_bias": {7: 2.0}}  # restored for the user


@pytest.mark.parametrize(
    "options, message",
    [
        ({"fsdp": "full_shard"}, "FSDP is not supported"),
        ({"use_transformers_continuous_batching": True}, "does not support images"),
        ({"num_generations": 3}, "divisible"),  # TRL's own check, reported as one line
    ],
)
def test_refused_options_fail_at_construction(options, message, tmp_path):
    with pytest.raises(VLMGRPOError, match=message):
        grpo_args(tmp_path, **options)
