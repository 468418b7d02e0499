"""Shared-prefix passes (`share_prompt_prefix`) equal full passes on every family, and really compute prompts once.

Each case compares the shared path with the unshared one on the same model and batch: per-token log-probs and
entropies within 1e-5 (fp32), gradients within 1e-5 relative, greedy generation token for token with logits within
1e-5, and 2 training steps from one seed giving parameters within 1e-5. Batches mix image and text-only prompts,
completions of different lengths, and micro-batches smaller than the batch.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, color_rows, grpo_args, length_reward
from datasets import Dataset
from transformers import GenerationConfig
from trl.trainer.utils import pad

from vlm_grpo import VLMGRPOTrainer
from vlm_grpo.data.rows import load_rows
from vlm_grpo.policy.shared_prefix import find_groups, shared_prefix_generate, shuffle_batch
from vlm_grpo.policy.sharing_plan import FULL_ROWS, SharingPlan, SharingPolicy, sharing_pays
from vlm_grpo.testing import DEFAULT_FAMILY, a_family_with, families_with

G = 3  # completions per prompt in the hand-built batches
SHARED = SharingPlan(generation=True, scoring=True, training=True)


def make_trainer(path, tmp_path, **overrides) -> VLMGRPOTrainer:
    rows = color_rows(6, text_only_every=3)
    return VLMGRPOTrainer(
        model=path,
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, **overrides),
        train_dataset=Dataset.from_list(rows),
    )


def rollout_batch(trainer: VLMGRPOTrainer, rows: list[dict], seed: int = 0):
    """Rows repeated G times, encoded by the trainer, with random completions of 1 to 5 tokens."""
    batch = [r for r in rows for _ in range(G)]
    encoded = trainer.rollout.encode_prompts(load_rows(batch))
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(60) if i not in trainer.placeholder_token_ids])
    completions = [
        allowed[torch.randint(0, len(allowed), (int(torch.randint(1, 6, (), generator=gen)),), generator=gen)]
        for _ in batch
    ]
    pad_id = trainer._tokenizer.pad_token_id
    prompt_ids = pad([torch.tensor(e.input_ids) for e in encoded], pad_id, "left")  # [B, P]
    prompt_mask = pad([torch.ones(len(e.input_ids), dtype=torch.long) for e in encoded], 0, "left")
    completion_ids = pad(completions, pad_id, "right")  # [B, C]
    completion_mask = pad([torch.ones(len(c), dtype=torch.long) for c in completions], 0, "right")
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "input_ids": torch.cat([prompt_ids, completion_ids], 1),  # [B, P+C]
        "attention_mask": torch.cat([prompt_mask, completion_mask], 1),
        "completion_mask": completion_mask,
        "image_inputs": [e.image_inputs for e in encoded],
    }


def sharing_plan(trainer: VLMGRPOTrainer, share: bool) -> SharingPlan:
    """The plan a `share_prompt_prefix: true/false` policy makes for the trainer's family (some never share)."""
    policy = SharingPolicy(
        "true" if share else "false", trainer.family.model_type, trainer.family.indexable_cache, None
    )
    return policy.plan(prompt_len=2, completion_len=1, group_sizes=[2], agree=bool, generation=False)


def logps_and_grads(trainer: VLMGRPOTrainer, batch: dict, share: bool, micro_batch: int = 4):
    model = trainer.model
    model.zero_grad()
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_mask"].size(1),
        micro_batch,  # default 4 rows: smaller than the batch of 18, and cutting groups of G=3
        compute_entropy=True,
        image_inputs=batch["image_inputs"],
        sharing=sharing_plan(trainer, share),
    )
    weights = torch.linspace(-1, 1, logps.numel()).view_as(
        logps
    )  # a loss that weights every token differently
    (logps * weights * batch["completion_mask"]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropies.detach(), grads


@pytest.mark.parametrize("family", FAMILIES)
def test_logps_entropies_and_gradients_match_full_forward(family, tiny_model, tmp_path):
    trainer = make_trainer(tiny_model(family), tmp_path)
    batch = rollout_batch(trainer, color_rows(6, text_only_every=3))
    full_logps, full_ent, full_grads = logps_and_grads(trainer, batch, share=False)
    shared_logps, shared_ent, shared_grads = logps_and_grads(trainer, batch, share=True)

    mask = batch["completion_mask"].bool()
    assert torch.allclose(shared_logps[mask], full_logps[mask], atol=1e-5, rtol=0)
    assert torch.allclose(shared_ent[mask], full_ent[mask], atol=1e-5, rtol=0)
    assert (shared_logps[~mask] == 0).all()
    assert set(shared_grads) == set(full_grads) and any(
        trainer.family.is_vision_module(n) for n in shared_grads
    )  # gradients reach the vision tower through the shared prompt
    scale = max(g.abs().max().item() for g in full_grads.values())
    for name, full in full_grads.items():
        err = (shared_grads[name] - full).abs().max().item()
        # The absolute term covers parameters whose true gradient is 0 (attention key biases: softmax ignores a
        # constant shift), where both paths hold only rounding noise.
        assert err <= 1e-5 * full.abs().max().item() + 1e-6 * scale, (name, err)


@pytest.mark.parametrize("family", families_with(mrope=True, indexable_cache=True))
def test_mrope_positions_equal_the_models_own(family, tiny_model, tmp_path):
    """M-RoPE positions computed once per distinct prompt (text after it filled in) equal the model's per-row rule.

    Rows: image and text-only prompts repeated G times, left-padded, with completions of 1 to 5 tokens right-padded;
    then the prompts alone. Positions must match on every unpadded token, and `rope_deltas` on every row.
    """
    trainer = make_trainer(tiny_model(family), tmp_path)
    model = trainer.model
    batch = rollout_batch(trainer, color_rows(6, text_only_every=3))
    for ids, mask in (
        (batch["input_ids"], batch["attention_mask"]),
        (batch["prompt_ids"], batch["prompt_mask"]),
    ):
        types = trainer.family.token_type_inputs(ids, model.config)["mm_token_type_ids"]
        grids = trainer.family.collate(batch["image_inputs"])["image_grid_thw"]
        expected, expected_deltas = model.model.get_rope_index(
            ids, mm_token_type_ids=types, image_grid_thw=grids, attention_mask=mask
        )  # [3, B, L], [B, 1]
        positions = trainer.family.position_ids(model, ids, mask, batch["image_inputs"])
        assert positions.shape == expected.shape
        valid = mask.bool().expand_as(positions)
        assert torch.equal(positions[valid], expected[valid])
        _, deltas = trainer.family._rope_index(model, ids, mask, batch["image_inputs"])
        assert torch.equal(deltas.view(-1), expected_deltas.view(-1).to(deltas.dtype))


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prefix_generation_matches_generate(family, tiny_model, tmp_path):
    trainer = make_trainer(tiny_model(family), tmp_path)
    model = trainer.model.eval()
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=4,
        min_new_tokens=4,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=trainer._tokenizer.pad_token_id,
        suppress_tokens=trainer.placeholder_token_ids,
    )
    # image and text-only prompts mixed, then a batch of text-only prompts only (positions without images)
    for rows in (color_rows(6, text_only_every=3), [color_rows(3, text_only_every=1)[i] for i in (0, 2)]):
        batch = rollout_batch(trainer, rows)
        ids, mask, images = batch["prompt_ids"], batch["prompt_mask"], batch["image_inputs"]
        with torch.no_grad():
            full = model.generate(
                **trainer.family.model_inputs(model.config, ids, mask, images), generation_config=config
            )
            shared = shared_prefix_generate(
                model, model, trainer.family, ids, mask, images, generation_config=config
            )
        assert torch.equal(shared.sequences, full.sequences)
        for a, b in zip(shared.logits, full.logits, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_two_training_steps_match_unshared(family, tiny_model, tmp_path):
    """2 steps (2 micro-batches per generation, reference model, sampling) from one seed: same parameters.

    Plain SGD, so that parameters follow gradients: Adam's first step is sign(g)*lr, which turns rounding noise on
    gradients that are exactly 0 in theory into full-size differences. Both micro-batches of a generation batch feed
    one optimizer step: shared passes keep groups whole in micro-batches where full rows move rows as TRL does, and
    only a split the loss does not depend on makes the two comparable.
    """
    params = {}
    for share in (False, True):
        trainer = make_trainer(
            tiny_model(family),
            tmp_path / str(share),
            share_prompt_prefix=share,
            per_device_train_batch_size=6,
            num_generations=3,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            beta=0.1,
            optim="sgd",
            learning_rate=0.1,
        )
        trainer.train()
        params[share] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    moved = max((params[True][n] - p).abs().max().item() for n, p in params[False].items())
    assert moved <= 1e-5


def test_prompt_tokens_run_once_per_group(tiny_model, tmp_path):
    """Count what reaches the language model and the vision tower: shared = one prompt per group."""
    trainer = make_trainer(tiny_model(DEFAULT_FAMILY), tmp_path)
    batch = rollout_batch(trainer, color_rows(6, text_only_every=3))
    model = trainer.model
    counts = {"tokens": 0, "vision": 0}
    h1 = model.model.language_model.embed_tokens.register_forward_hook(
        lambda m, i, o: counts.__setitem__("tokens", counts["tokens"] + i[0].numel())
    )
    h2 = model.model.visual.register_forward_hook(  # patches through the vision tower
        lambda m, i, o: counts.__setitem__("vision", counts["vision"] + i[0].size(0))
    )
    seen = {}
    for share in (False, True):
        counts.update(tokens=0, vision=0)
        logps_and_grads(trainer, batch, share, micro_batch=2 * G)
        seen[share] = dict(counts)
    h1.remove()
    h2.remove()
    B, L = batch["input_ids"].shape
    P = batch["prompt_ids"].size(1)
    C = L - P
    groups = 6  # 6 prompts x G rows
    assert seen[False]["tokens"] == B * L
    assert seen[True]["tokens"] == groups * (P - 1) + B * (C + 1)
    patches = sum(
        row["pixel_values"].size(0) for row in batch["image_inputs"] if row
    )  # every row's image patches
    assert seen[False]["vision"] == patches
    assert seen[True]["vision"] * G == patches  # each image once per group


def test_find_groups():
    ids = torch.tensor([[1, 2], [1, 2], [1, 3], [1, 3], [1, 3], [1, 2]])
    a, b, c = {}, {}, {}
    groups = find_groups(ids, [a, a, b, b, b, c])
    assert groups.first.tolist() == [0, 2, 5] and groups.index.tolist() == [0, 0, 1, 1, 1, 2]
    assert groups.sizes == [2, 3, 1]
    # same ids but different image objects are different prompts
    assert find_groups(ids[:2], [a, b]).first.tolist() == [0, 1]


def shuffle_case():
    """15 rows: 5 groups of 3, with per-row tensors, the image dicts and a 0-d tensor."""
    mms = [{} for _ in range(5)]
    rows = [g for g in range(5) for _ in range(3)]
    batch = {
        "prompt_ids": torch.tensor([[g, g] for g in rows]),
        "advantages": torch.arange(15, dtype=torch.float),
        "image_inputs": [mms[g] for g in rows],
        "num_items_in_batch": torch.tensor(15),
    }
    return batch, rows, mms


def test_shuffle_batch_keeps_groups_together_when_passes_share():
    batch, rows, mms = shuffle_case()
    torch.manual_seed(0)
    out = shuffle_batch(batch, SHARED)
    after = torch.rand(1)
    order = out["prompt_ids"][:, 0].tolist()
    assert sorted(order) == rows and order != rows
    assert all(len(set(order[i : i + 3])) == 1 for i in range(0, 15, 3))
    advantages = out["advantages"].tolist()  # rows keep their order inside a group
    assert all(advantages[i] < advantages[i + 1] < advantages[i + 2] for i in range(0, 15, 3))
    assert all(mm is mms[g] for mm, g in zip(out["image_inputs"], order, strict=True))
    assert out["num_items_in_batch"].item() == 15
    # groups come in the order TRL's permutation places their first rows; the generator moved as TRL's does
    torch.manual_seed(0)
    permutation = torch.randperm(15).tolist()
    firsts = [r for r in permutation if r % 3 == 0]
    assert order[::3] == [r // 3 for r in firsts] and torch.equal(torch.rand(1), after)


def test_shuffle_batch_moves_rows_as_trl_when_no_pass_shares():
    from trl.trainer.utils import shuffle_sequence_dict

    batch, _, _ = shuffle_case()
    torch.manual_seed(0)
    ours, ours_next = shuffle_batch(batch, FULL_ROWS), torch.rand(1)
    torch.manual_seed(0)
    stock, stock_next = shuffle_sequence_dict(batch), torch.rand(1)
    assert torch.equal(ours["advantages"], stock["advantages"]) and torch.equal(ours_next, stock_next)
    assert all(a is b for a, b in zip(ours["image_inputs"], stock["image_inputs"], strict=True))


@pytest.mark.parametrize(
    "family", [a_family_with(image_rule="grid", besides=[DEFAULT_FAMILY]), a_family_with(image_rule="fixed")]
)
def test_gradient_checkpointing_keeps_the_shared_path_exact(family, tiny_model, tmp_path):
    """Under (non-reentrant) gradient checkpointing the prompt's cache survives the layers' backward replay."""
    trainer = make_trainer(tiny_model(family), tmp_path)
    batch = rollout_batch(trainer, color_rows(6, text_only_every=3))
    full_logps, _, full_grads = logps_and_grads(trainer, batch, share=False)
    trainer.args.gradient_checkpointing = True
    trainer.model.gradient_checkpointing_enable({"use_reentrant": False})
    trainer.model.train()
    counts = {"tokens": 0}
    hook = trainer.model.get_input_embeddings().register_forward_hook(
        lambda m, i, o: counts.__setitem__("tokens", counts["tokens"] + i[0].numel())
    )
    shared_logps, _, shared_grads = logps_and_grads(trainer, batch, share=True)
    hook.remove()
    assert counts["tokens"] < batch["input_ids"].numel()  # the shared path ran, not full rows
    mask = batch["completion_mask"].bool()
    assert torch.allclose(shared_logps[mask], full_logps[mask], atol=1e-5, rtol=0)
    scale = max(g.abs().max().item() for g in full_grads.values())
    assert set(shared_grads) == set(full_grads)
    for name, full in full_grads.items():
        err = (shared_grads[name] - full).abs().max().item()
        assert err <= 1e-5 * full.abs().max().item() + 1e-6 * scale, (name, err)


def test_sharing_pays_on_long_prompts_and_large_groups():
    assert sharing_pays(prompt_len=294, completion_len=32, group_sizes=[8])  # the benchmark's long prompt
    assert not sharing_pays(prompt_len=17, completion_len=64, group_sizes=[4])  # and its short prompt
    assert not sharing_pays(prompt_len=17, completion_len=32, group_sizes=[3])  # saves 22%, but G=3
    # groups of 8 or more share from a 5% saving: (8-1)(17-1) / (8 (17+256)) = 5.1%, not at 1024 tokens (1.3%)
    assert sharing_pays(prompt_len=17, completion_len=256, group_sizes=[8, 8])
    assert not sharing_pays(prompt_len=17, completion_len=1024, group_sizes=[8])
    assert not sharing_pays(prompt_len=17, completion_len=256, group_sizes=[8, 7])  # every group needs 8 rows
    assert not sharing_pays(
        prompt_len=300, completion_len=8, group_sizes=[1, 1]
    )  # groups of one share nothing
    assert not sharing_pays(prompt_len=300, completion_len=8, group_sizes=[])


@pytest.mark.parametrize(("mode", "max_completion_length", "shares"), [
    ("auto", 2, True), ("auto", 64, False), ("true", 64, True), ("false", 2, False), (True, 64, True),
])  # fmt: skip
def test_share_prompt_prefix_auto_decides_per_batch(
    mode, max_completion_length, shares, tiny_model, tmp_path
):
    trainer = make_trainer(
        tiny_model(DEFAULT_FAMILY), tmp_path, share_prompt_prefix=mode, max_completion_length=max_completion_length,
        generation_kwargs={"min_new_tokens": max_completion_length},
    )  # fmt: skip
    batch = trainer._generate_and_score_completions(
        [r for r in color_rows(2) for _ in range(2)]
    )  # prompts of 17 tokens
    plan = batch["sharing"]
    assert plan.generation is plan.scoring is plan.training is shares


def test_share_prompt_prefix_values(tmp_path):
    from vlm_grpo.errors import VLMGRPOError

    assert grpo_args(tmp_path, share_prompt_prefix=False).share_prompt_prefix == "false"
    with pytest.raises(VLMGRPOError, match="share_prompt_prefix must be true, false or auto, got 'maybe'"):
        grpo_args(tmp_path, share_prompt_prefix="maybe")


# generation_kwargs that stock TRL trains with and that keep `generate` from continuing a prompt cache
FULL_ROW_GENERATION = {
    "cache_implementation": ({"cache_implementation": "static"}, "cache_implementation 'static'"),
    "num_beams": ({"num_beams": 2}, "beam_sample decoding"),
    "use_cache": ({"use_cache": False}, "use_cache: false"),
}
# `prefill_chunk_size` also runs full rows (see the next test); stock generation with it trains on transformers 5.23
# but fails inside Qwen2-VL's rotary embedding on 5.17, so it is not trained here.


@pytest.mark.parametrize("case", list(FULL_ROW_GENERATION))
def test_generation_options_that_need_full_rows(case, tiny_model, tmp_path, caplog):
    """Such an option makes generation run full rows (one log line) and trains as with sharing off; passes share."""
    import logging

    kwargs, reason = FULL_ROW_GENERATION[case]
    completions, plans = {}, {}
    for share in (True, False):
        seen = []

        def reward(completions, _seen=seen, **_):
            _seen.extend(c[0]["content"] for c in completions)
            return length_reward(completions)

        with caplog.at_level(logging.INFO, logger="vlm_grpo.trainer.trainer"):
            trainer = VLMGRPOTrainer(
                model=tiny_model(DEFAULT_FAMILY),
                reward_funcs=reward,
                args=grpo_args(
                    tmp_path / str(share), share_prompt_prefix=share, generation_kwargs=kwargs, max_steps=1
                ),
                train_dataset=Dataset.from_list(color_rows(8)),
            )
        trainer.train()
        completions[share] = seen
        plans[share] = trainer._sharing.plan(17, 4, [2, 2], agree=bool, generation=False)
    lines = [r.getMessage() for r in caplog.records if "share_prompt_prefix: full rows" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0].partition("generation: ")[2] and "scoring" not in lines[0]
    assert completions[True] == completions[False] and len(completions[True]) == 4
    assert plans[True].scoring and plans[True].training  # the log-prob passes still share


def test_generation_obstacles_come_from_the_merged_config():
    from transformers import GenerationConfig

    from vlm_grpo.policy.sharing_plan import generation_obstacle

    assert generation_obstacle(GenerationConfig(do_sample=True)) is None
    assert generation_obstacle(GenerationConfig(do_sample=False, max_new_tokens=4)) is None
    assert "beam_search" in generation_obstacle(GenerationConfig(num_beams=2))
    assert "contrastive_search" in generation_obstacle(GenerationConfig(penalty_alpha=0.5, top_k=4))
    assert "assisted_generation" in generation_obstacle(
        GenerationConfig(do_sample=True, prompt_lookup_num_tokens=2)
    )
    assert "num_return_sequences" in generation_obstacle(
        GenerationConfig(do_sample=True, num_return_sequences=2)
    )
    assert "token_healing" in generation_obstacle(GenerationConfig(token_healing=True))
    assert "prefill_chunk_size" in generation_obstacle(GenerationConfig(do_sample=True, prefill_chunk_size=4))


def test_model_generation_config_reaches_the_decision(tiny_model, tmp_path):
    """A `cache_implementation` in the model's own generation_config.json is what `generate` merges in: full rows."""
    import shutil

    from transformers import GenerationConfig

    path = tmp_path / "model"
    shutil.copytree(tiny_model(DEFAULT_FAMILY), path)
    config = GenerationConfig.from_pretrained(path)
    config.cache_implementation = "static"
    config.save_pretrained(path)
    trainer = VLMGRPOTrainer(
        model=str(path), reward_funcs=length_reward, args=grpo_args(tmp_path, share_prompt_prefix=True),
        train_dataset=Dataset.from_list(color_rows(8)),
    )  # fmt: skip
    assert trainer.generation_config.cache_implementation is None  # TRL's own config leaves it unset
    assert "static" in trainer._sharing.fixed["generation"][0]
    trainer.train()


def test_num_return_sequences_is_refused(tmp_path):
    from vlm_grpo.errors import VLMGRPOError

    with pytest.raises(VLMGRPOError, match="set num_generations instead"):
        grpo_args(tmp_path, generation_kwargs={"num_return_sequences": 2})


def test_evaluation_leaves_the_buffered_training_plan(tiny_model, tmp_path, monkeypatch):
    """An evaluation between two micro-batches of one rollout does not change what the second one shares.

    Training groups of 2 share (`auto`); the evaluation's groups of 1 save nothing and run full rows.
    """
    import vlm_grpo.trainer.logps

    calls = []
    original = vlm_grpo.trainer.logps.shared_prefix_logps

    def shared(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(vlm_grpo.trainer.logps, "shared_prefix_logps", shared)
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(
            tmp_path, share_prompt_prefix="auto", steps_per_generation=2, max_completion_length=2,
            eval_strategy="steps", eval_steps=1, num_generations_eval=1, per_device_eval_batch_size=2,
        ),
        train_dataset=Dataset.from_list(color_rows(8)),
        eval_dataset=Dataset.from_list(color_rows(2)),
    )  # fmt: skip
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert len(evals) == 2  # an evaluation ran between the two micro-batches of the one rollout
    assert calls.count(True) == 2  # both training forwards shared each group's prompt
