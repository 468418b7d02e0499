"""Multi-turn rollouts with tools: TRL's `tools`, `environment_factory` and `rollout_func` on a vision-language model.

The tiny model of a family whose published chat template renders tool calls (its builder carries that template) is
random: `generation_kwargs`' `sequence_bias` (a transformers sampling option, the same in both trainers) makes it
write a tool call now and then, so that some rows call a tool, some do not, and some call one again after the
result. The tools are real functions; one returns an image, which joins the row's images.
"""

from __future__ import annotations

import itertools
import math
import os
import re

import pytest
import torch
from conftest import color_rows, square_image
from datasets import Dataset
from transformers import AutoModelForImageTextToText
from trl import GRPOConfig, GRPOTrainer

from vlm_grpo import VLMGRPOConfig, VLMGRPOTrainer, get_model_family
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.policy.image_rows import pixel_key, prompt_images
from vlm_grpo.policy.shared_prefix import find_groups
from vlm_grpo.policy.sharing_plan import FULL_ROWS, SharingPolicy
from vlm_grpo.rollout.tool_suffix import ToolSuffix
from vlm_grpo.testing import a_family_with, families_with, tiny_family
from vlm_grpo.trl_options import TOOL_TEMPLATE_MESSAGE

TOOLS_FAMILY = a_family_with(tool_calls=True)
COMMON = dict(
    max_steps=2,
    per_device_train_batch_size=4,
    num_generations=2,
    max_completion_length=96,
    max_tool_calling_iterations=2,
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


def zoom(region: int) -> list:
    """Show one quarter of the image, enlarged.

    Args:
        region: the quarter, 0 to 3.
    """
    colour = ("red", "green", "blue", "yellow")[int(region) % 4]
    return [
        {"type": "image", "image": square_image(colour, 32)},
        {"type": "text", "text": f"quarter {region}"},
    ]


def count(word: str) -> str:
    """Count the letters of a word.

    Args:
        word: the word.
    """
    return str(len(word))


def turns_reward(completions, **kwargs) -> list[float]:
    """Rewards that vary within a group: the characters the model wrote, over every turn."""
    return [
        float(sum(len(m.get("content") or "") for m in c if m["role"] == "assistant")) for c in completions
    ]


def call_text(processor, name: str, arguments: dict) -> tuple[str, str, str]:
    """`(lead, call, end)`: what the model writes to call `name(**arguments)`, as the family's chat template renders
    that assistant turn. `call` is what the call adds to a turn without one (Qwen3-VL: JSON in `<tool_call>` tags;
    Qwen3.5: the same tags around XML; Gemma 4: `<|tool_call>call:NAME{...}<tool_call|>`); `lead` is what comes before
    it in every turn (Qwen3.5: the end of its thinking, after which a call parses; empty for the others); `end` is the
    token that ends the turn after a call (`<|im_end|>`; Gemma 4's `<|tool_response>`, where its result follows)."""
    tokenizer = processor.tokenizer
    prompt = [{"role": "user", "content": "Hi"}]
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    head = processor.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    plain_turn, call_turn = (
        processor.apply_chat_template(
            [*prompt, {"role": "assistant", "content": "", **extra}], tokenize=False
        )
        for extra in ({}, {"tool_calls": [call]})
    )

    def last_token(text: str) -> str:
        return tokenizer.convert_ids_to_tokens(
            tokenizer(text.rstrip(), add_special_tokens=False)["input_ids"][-1]
        )

    plain_end, end = last_token(plain_turn), last_token(call_turn)
    shared = len(os.path.commonprefix([plain_turn[: plain_turn.rindex(plain_end)], call_turn]))
    return call_turn[len(head) : shared].lstrip(), call_turn[shared : call_turn.rindex(end)].strip(), end


def calls_bias(processor, call: tuple[str, dict], start: float | None = None) -> list:
    """`sequence_bias` that starts the call `(name, arguments)` with a moderate bias (`start`) and, once started,
    completes it and ends the turn. Where the template's turns open with a lead (Qwen3.5's end of thinking), the lead
    is started alike, and the call is a second choice after it, so that some rows answer without calling. `start`
    defaults to 4.0 with a lead and 2.5 without (the call is then a choice at every token)."""
    tokenizer = processor.tokenizer
    lead, text, end = call_text(processor, *call)
    lead_ids = tokenizer(lead, add_special_tokens=False)["input_ids"] if lead else []
    start = (4.0 if lead_ids else 2.5) if start is None else start
    ids = [
        *lead_ids,
        *tokenizer(text, add_special_tokens=False)["input_ids"],
        tokenizer.convert_tokens_to_ids(end),
    ]
    bias = [40.0] * len(ids)
    bias[0] = start
    if (
        lead_ids
    ):  # one choice per lead instead of one at every token: a larger bias, so that about half the rows call
        bias[len(lead_ids)] = start + 3.0
    return [[ids[: i + 1], b] for i, b in enumerate(bias)]


def family_model(tiny_model, family: str) -> tuple:
    """`(path, processor, placeholders)` of `family`'s tiny model."""
    path = tiny_model(family)
    model_family = get_model_family(path)
    processor = model_family.load_processor(path)
    config = AutoModelForImageTextToText.from_pretrained(path).config
    return path, processor, model_family.placeholder_token_ids(processor, config)


@pytest.fixture(scope="module")
def tools_model(tiny_model):
    """`(path, processor, placeholders)` of a tool-calling family's tiny model."""
    return family_model(tiny_model, TOOLS_FAMILY)


def train(trainer_cls, config_cls, tools_model, tmp_path, tools, call, environment_factory=None, **options):
    """Train 2 steps with `tools` (or `environment_factory`), `call` elicited; returns the trainer and its step logs.
    `options` are config fields."""
    path, processor, placeholders = tools_model
    bias = calls_bias(processor, call)
    args = config_cls(
        output_dir=str(tmp_path / trainer_cls.__name__),
        **{
            **COMMON,
            "generation_kwargs": {"suppress_tokens": placeholders, "sequence_bias": bias},
            **options,
        },
    )
    torch.manual_seed(0)
    trainer = trainer_cls(
        model=path, reward_funcs=turns_reward, args=args, train_dataset=Dataset.from_list(color_rows(8)),
        processing_class=processor, tools=tools, environment_factory=environment_factory,
    )  # fmt: skip
    trainer.train()
    return trainer, [e for e in trainer.state.log_history if "loss" in e]


def plain(completions) -> list:
    """The logged completions with each tool image replaced by its size (images compare by identity otherwise)."""

    def part(p):
        return {**p, "image": p["image"].size} if p.get("type") == "image" else p

    return [
        [
            {**m, "content": [part(p) for p in m["content"]]} if isinstance(m["content"], list) else m
            for m in c
        ]
        for c in completions
    ]


CALLS = {  # tools, and the call the model is led to write: (name, arguments)
    "image_result": ([zoom], ("zoom", {"region": 2})),
    "text_result": ([zoom, count], ("count", {"word": "red"})),
    "unknown_tool": ([count], ("rotate", {"angle": 90})),
}
# Room for the error result after Qwen3.5's longer calls (XML, after its thinking); the other cases keep COMMON's
# budget, in which some rows answer without calling.
BUDGETS = {"unknown_tool": {"max_completion_length": 128}}


def budget(case: str, family: str) -> dict:
    """The case's completion budget, plus the tokens of the tool's image where every image costs a fixed number
    whatever its size (Gemma 4's 64 soft tokens, where a Qwen family spends 4 on the tool's 32x32 image)."""
    length = BUDGETS.get(case, COMMON)["max_completion_length"]
    return {"max_completion_length": length + (tiny_family(family).fixed_image_tokens or 0)}


def zoom_rollout_trainer(tools_model, tmp_path, reward=turns_reward, **options) -> VLMGRPOTrainer:
    """Our trainer with the zoom tool (its calls elicited), in training mode, ready for one rollout."""
    path, processor, placeholders = tools_model
    tools, call = CALLS["image_result"]
    args = VLMGRPOConfig(
        output_dir=str(tmp_path), **{**COMMON, "max_steps": 1, **options},
        generation_kwargs={  # most rows call, as the tests of one rollout need
            "suppress_tokens": placeholders, "sequence_bias": calls_bias(processor, call, start=4.0)
        },
    )  # fmt: skip
    trainer = VLMGRPOTrainer(
        path, reward, args=args, train_dataset=Dataset.from_list(color_rows(8)), tools=tools
    )
    trainer.model.train()
    return trainer


def two_groups() -> list[dict]:
    """A generation batch of two prompts (red, green), two rows each."""
    return [r for r in color_rows(2) for _ in range(2)]


@pytest.mark.parametrize("family", families_with(tool_calls=True))
@pytest.mark.parametrize("case", list(CALLS))
def test_tool_rollouts_match_trl(case, family, tiny_model, tmp_path):
    """Stock TRL's tool loop and ours, from one seed, on every family whose published template calls tools: the same
    completions (every turn, tool call and tool result), the same metrics (`tools/*` and lengths of the model's
    tokens only), the same weights after two steps. Where stock TRL fails after a tool's image, ours trains."""
    tools, call = CALLS[case]
    tools_model = family_model(tiny_model, family)
    if case == "image_result" and not tiny_family(family).stock_tool_images:
        # stock TRL fails in the turn after the tool's image (see `TinyFamily.stock_tool_images`); ours trains
        with pytest.raises(ValueError, match="model_kwargs` are not used by the model"):
            train(GRPOTrainer, GRPOConfig, tools_model, tmp_path, tools, call, **budget(case, family))
        ours, our_logs = train(
            VLMGRPOTrainer, VLMGRPOConfig, tools_model, tmp_path, tools, call, **budget(case, family)
        )
        completions = plain(ours._logs["completion"])
        results = [m for c in completions for m in c if m["role"] == "tool"]
        assert results and all(
            p["image"] == (32, 32) for m in results for p in m["content"] if p["type"] == "image"
        )
        assert any(m["role"] == "assistant" and m.get("content") for c in completions for m in c[2:])
        assert all(math.isfinite(e["loss"]) and e["grad_norm"] > 0 for e in our_logs), our_logs
        return
    stock, stock_logs = train(
        GRPOTrainer, GRPOConfig, tools_model, tmp_path, tools, call, **budget(case, family)
    )
    ours, our_logs = train(
        VLMGRPOTrainer, VLMGRPOConfig, tools_model, tmp_path, tools, call, **budget(case, family)
    )
    completions = plain(ours._logs["completion"])
    assert completions == plain(stock._logs["completion"])
    calls = [m for c in completions for m in c if m.get("tool_calls")]
    results = [m for c in completions for m in c if m["role"] == "tool"]
    assert calls and results and our_logs[0]["tools/call_frequency"] > 0
    if case == "unknown_tool":  # reported to the model as TRL reports it, and counted
        assert our_logs[0]["tools/failure_frequency"] == 1.0 and "not found" in str(results[0]["content"])
    else:  # some rows call a tool, some answer at once
        assert any(not any(m["role"] == "tool" for m in c) for c in completions)
    for stock_entry, our_entry in zip(stock_logs, our_logs, strict=True):
        shared = [k for k in stock_entry if k in our_entry and "time" not in k]
        assert {"loss", "grad_norm", "tools/call_frequency", "completions/mean_length"} <= set(shared)
        for key in shared:
            assert math.isclose(our_entry[key], stock_entry[key], rel_tol=1e-4, abs_tol=1e-5), key
    stock_params = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        torch.testing.assert_close(param, stock_params[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_template_without_tool_calls_is_refused_in_one_line(tiny_model, tmp_path):
    """A family whose template renders no tool calls: stock TRL refuses it; so do we, in one line that says which
    templates can."""
    path = tiny_model(a_family_with(tool_calls=False))
    args = dict(output_dir=str(tmp_path), max_steps=1, use_cpu=True, bf16=False, report_to="none")
    data = Dataset.from_list(color_rows(4))
    with pytest.raises(ValueError, match="does not support tool calling"):
        GRPOTrainer(
            model=path, reward_funcs=turns_reward, args=GRPOConfig(**args), train_dataset=data, tools=[count]
        )
    with pytest.raises(VLMGRPOError) as error:
        VLMGRPOTrainer(path, turns_reward, args=VLMGRPOConfig(**args), train_dataset=data, tools=[count])
    assert str(error.value) == TOOL_TEMPLATE_MESSAGE and "\n" not in TOOL_TEMPLATE_MESSAGE


def assert_logps_of_plain_rows(trainer, batch: dict, rows) -> None:
    """The trainer's log-probs of a rollout (its sharing plan's passes) equal, on each of `rows`, a plain forward of
    the model on that whole row with its image inputs."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        logps = trainer._policy_logps(
            trainer.model, ids, mask, width, 4, batch["image_inputs"], batch["sharing"]
        )  # [B, C]
        for i in rows:
            inputs = trainer.family.model_inputs(
                model.config, ids[i : i + 1], mask[i : i + 1], [batch["image_inputs"][i]]
            )
            logits = model(**inputs).logits[0, -width - 1 : -1]
            plain_logps = torch.log_softmax(logits.float(), -1).gather(
                -1, batch["completion_ids"][i, :, None]
            )[:, 0]
            keep = batch["completion_mask"][i].bool()
            torch.testing.assert_close(logps[i][keep], plain_logps[keep], atol=1e-5, rtol=0)


def test_tool_results_are_masked_and_their_images_reach_the_forward(tools_model, tmp_path):
    """A rollout whose tool returned an image: tool-result tokens are 0 in `tool_mask` (the loss leaves them out),
    the row's image inputs hold the prompt's image and then the tool's, and the trainer's log-probs of every row
    equal a plain forward of the model on the whole row with those images, also when each group's prompt runs once
    (the tool's images then go with the completions' forward)."""
    processor = tools_model[1]
    trainer = zoom_rollout_trainer(tools_model, tmp_path, share_prompt_prefix="true")
    batch = trainer._generate_and_score_completions(two_groups())
    image_token = trainer.family.image_token_id(processor)
    with_tool = [i for i, m in enumerate(batch["tool_mask"]) if (m == 0).any()]
    assert with_tool, "no row called the tool"
    for i in with_tool:
        completion = batch["completion_ids"][i]
        masked = batch["tool_mask"][i] == 0
        assert (
            completion[masked] == image_token
        ).any()  # the tool's image placeholders are tool-result tokens
        assert not (
            completion[~masked & batch["completion_mask"][i].bool()] == image_token
        ).any()  # not sampled
        assert batch["image_inputs"][i]["image_grid_thw"].size(0) == 2  # the prompt's image, then the tool's
    assert (
        batch["sharing"].scoring and batch["sharing"].training
    )  # the prompt once per group, tool images or not
    groups = find_groups(batch["prompt_ids"], batch["image_inputs"])
    assert groups.sizes == [2, 2]  # a row with a tool image stays in its group
    assert_logps_of_plain_rows(trainer, batch, range(batch["prompt_ids"].size(0)))


def test_a_rows_tool_images_are_encoded_once_per_batch(tools_model, tmp_path, monkeypatch):
    """The turn after the tool and the log-prob passes read one encoding of a row's tool images, and rows whose tools
    returned the same pixels (the same quarter) share it: the processor runs once per distinct quarter (before: twice
    per row), and the log-probs stay those of a plain forward of each whole row."""
    trainer = zoom_rollout_trainer(tools_model, tmp_path, share_prompt_prefix="true")
    encoded = []
    encode_images = trainer.family.encode_images
    monkeypatch.setattr(
        trainer.family,
        "encode_images",
        lambda processor, images: encoded.append(encode_images(processor, images)) or encoded[-1],
    )
    batch = trainer._generate_and_score_completions(
        [r for r in color_rows(2) for _ in range(4)]  # two prompts, four rows each
    )
    with_tool = [i for i, m in enumerate(batch["tool_mask"]) if (m == 0).any()]
    texts = trainer.processing_class.batch_decode(batch["completion_ids"][with_tool])
    quarters = [re.search(r"quarter (\d)", text).group(1) for text in texts]  # the tool result's text
    assert len(set(quarters)) < len(quarters), "no two rows zoomed on the same quarter"
    assert len(encoded) == len(set(quarters))
    tool_inputs = [batch["image_inputs"][i].tools for i in with_tool]
    for a, b in itertools.combinations(range(len(with_tool)), 2):
        assert (tool_inputs[a] is tool_inputs[b]) == (quarters[a] == quarters[b])
    assert_logps_of_plain_rows(trainer, batch, with_tool)


def test_images_of_equal_pixels_share_a_key():
    """`pixel_key`: equal pixels give equal keys, whatever the object; a changed pixel, size, mode or palette does
    not."""
    image = square_image("red", 32)
    assert pixel_key(image) == pixel_key(square_image("red", 32)) == pixel_key(image.copy())
    changed = image.copy()
    changed.putpixel((0, 0), (0, 0, 0))
    assert pixel_key(changed) != pixel_key(image)
    assert pixel_key(square_image("red", 36)) != pixel_key(image)
    assert pixel_key(image.convert("RGBA")) != pixel_key(image)
    indexed = image.convert("P")
    other_palette = indexed.copy()
    other_palette.putpalette([255 - v for v in indexed.getpalette()])
    assert other_palette.tobytes() == indexed.tobytes() and pixel_key(other_palette) != pixel_key(indexed)
    assert pixel_key("not an image") != pixel_key("not an image".upper())


def test_the_tool_suffix_is_rendered_once_per_image_size(tools_model):
    """`ToolSuffix` gives the ids TRL's rendering gives, and renders tool messages that differ only in their images'
    pixels once: a new size, text or tool name renders again."""
    _, processor, _ = tools_model
    suffix = ToolSuffix(processor, None, {})

    def result(colour: str, size: int = 32, text: str = "quarter 1") -> list[dict]:
        content = [{"type": "image", "image": square_image(colour, size)}, {"type": "text", "text": text}]
        return [{"role": "tool", "name": "zoom", "content": content}]

    def rendered(messages: list[dict]) -> list[int]:  # a fresh rendering, as TRL's
        return ToolSuffix(processor, None, {})(messages)

    red = suffix(result("red"))
    assert red == rendered(result("red")) and suffix.renderings == 1
    assert suffix(result("green")) == red and suffix.renderings == 1
    larger = suffix(result("red", 48))
    assert larger == rendered(result("red", 48)) != red and suffix.renderings == 2
    assert suffix(result("red", text="quarter 2")) == rendered(result("red", text="quarter 2"))
    assert suffix.renderings == 3
    text_only = [{"role": "tool", "name": "count", "content": "5"}]
    assert suffix(text_only) == rendered(text_only) and suffix.renderings == 4


def test_tool_images_reach_the_forward_where_image_tokens_attend_each_other(tiny_model, tmp_path):
    """A family whose image tokens attend to each other (Gemma 4), its tool returning images: the rows run whole
    (see `SharingPolicy`), and the trainer's log-probs of every row equal a plain forward of the whole row with the
    prompt's image and the tool's, whose tokens are tool-result tokens."""
    tools_model = family_model(tiny_model, a_family_with(tool_calls=True, bidirectional_images=True))
    trainer = zoom_rollout_trainer(tools_model, tmp_path, max_completion_length=160)
    batch = trainer._generate_and_score_completions(two_groups())
    image_token = trainer.family.image_token_id(tools_model[1])
    with_tool = [i for i, m in enumerate(batch["tool_mask"]) if (m == 0).any()]
    assert with_tool, "no row called the tool"
    for i in with_tool:
        masked = batch["tool_mask"][i] == 0
        assert (batch["completion_ids"][i][masked] == image_token).any()
    assert not batch["sharing"].scoring and not batch["sharing"].training
    assert_logps_of_plain_rows(trainer, batch, with_tool)


def test_sharing_with_tool_images_trains_as_full_rows(tools_model, tmp_path):
    """The training step's loss and gradients with each group's prompt run once equal those of full rows, on a
    rollout whose tools returned images."""
    trainer = zoom_rollout_trainer(tools_model, tmp_path, share_prompt_prefix="true")
    batch = trainer._generate_and_score_completions(two_groups())
    assert (batch["tool_mask"] == 0).any() and batch["sharing"].training
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before a step
    results = []
    for plan in (batch["sharing"], FULL_ROWS):
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, {**batch, "sharing": plan})
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (shared_loss, shared_grads), (full_loss, full_grads) = results
    torch.testing.assert_close(shared_loss, full_loss, atol=1e-6, rtol=1e-5)
    assert shared_grads.keys() == full_grads.keys() and any(map(trainer.family.is_vision_module, full_grads))
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_images_in_completions_need_full_rows_only_where_image_tokens_attend_each_other(bidirectional):
    """A batch whose tools returned images shares each group's prompt in its log-prob passes and later turns, unless
    the family's language model attends bidirectionally among an image's tokens: its completions' forward over the
    prompt's cache would see them causally."""
    policy = SharingPolicy(
        "true", "any", indexable_cache=True, generation_config=None, bidirectional_images=bidirectional
    )
    plan = policy.plan(
        prompt_len=8,
        completion_len=8,
        group_sizes=[2, 2],
        agree=bool,
        generation=False,
        completion_images=True,
    )
    assert plan.scoring is plan.training is (not bidirectional)
    if bidirectional:
        assert plan.reasons["training"] == ("tool results hold images, attended bidirectionally",)
    unaffected = policy.plan(prompt_len=8, completion_len=8, group_sizes=[2, 2], agree=bool, generation=False)
    assert unaffected.scoring and unaffected.training
    # the turns after a tool result continue the prompt's prefill where the first turn did, causal families only
    assert policy.shares_later_turns(True) is (not bidirectional)
    assert not policy.shares_later_turns(False)


def test_the_next_turns_prefill_each_groups_prompt_once(tools_model, tmp_path):
    """With a shared prefix, the turns after a tool result continue each group's prompt from one prefill of it (its
    image through the vision tower once per group, not once per row), and sample exactly the tokens that full rows
    sample from the same seed: every turn, tool call and tool image alike."""
    rollouts = {}
    for mode in ("true", "false"):
        trainer = zoom_rollout_trainer(tools_model, tmp_path / mode, share_prompt_prefix=mode)
        model = trainer.accelerator.unwrap_model(trainer.model)
        tower = min(
            ((n, m) for n, m in model.named_modules() if n and trainer.family.is_vision_module(n)),
            key=lambda item: len(item[0]),
        )[1]
        patches = []
        tower.register_forward_pre_hook(
            lambda module, args, kwargs, seen=patches: seen.append(args[0].size(0)), with_kwargs=True
        )
        torch.manual_seed(1)
        batch = trainer._generate_and_score_completions(two_groups())
        rollouts[mode] = (trainer, batch, plain(trainer._logs["completion"]), sum(patches))
    (
        (shared_trainer, shared, shared_completions, shared_patches),
        (_, full, full_completions, full_patches),
    ) = rollouts.values()
    assert shared["sharing"].generation and not full["sharing"].generation
    assert shared_completions == full_completions
    for key in ("completion_ids", "completion_mask", "tool_mask"):
        assert torch.equal(shared[key], full[key]), key
    # the prompt image's patches: once per group in every turn, against once per row
    prompt_patches = prompt_images(shared["image_inputs"][0])[shared_trainer.family.image_input_keys[0]].size(
        0
    )
    turns = [
        sum(m["role"] == "assistant" for m in c) for c in shared_completions
    ]  # rows of groups (0, 1), (2, 3)
    later = [
        [r for r in range(4) if turns[r] > k] for k in range(1, max(turns))
    ]  # rows sampled in each later turn
    repeated = sum(
        len(rows) - len({r // 2 for r in rows}) for rows in later
    )  # rows that reuse their group's prefill
    assert repeated > 0, turns
    assert full_patches - shared_patches == (2 + repeated) * prompt_patches


class Canvas:
    """An environment: `reset` tells the row's colour, `look` is its tool, `get_reward` counts the looks."""

    def reset(self, solution: str | None = None, **kwargs) -> str:
        self.solution, self.looks = solution, 0
        return f" The square is {solution} ."

    def look(self, region: int) -> str:
        """Look at one quarter of the image.

        Args:
            region: the quarter, 0 to 3.
        """
        self.looks += 1
        return f"quarter {region} is {self.solution}"

    def get_reward(self) -> float:
        return float(self.looks)


LOOK = ("look", {"region": 1})


def test_environments_match_trl(tools_model, tmp_path):
    """`environment_factory`: each row's environment is reset with the row (its observation joins the prompt), its
    methods are the row's tools, and its `get_reward` is a reward: the same rollouts, rewards and weights as TRL."""
    stock, stock_logs = train(
        GRPOTrainer, GRPOConfig, tools_model, tmp_path, None, LOOK, environment_factory=Canvas
    )
    ours, our_logs = train(
        VLMGRPOTrainer, VLMGRPOConfig, tools_model, tmp_path, None, LOOK, environment_factory=Canvas
    )
    assert plain(ours._logs["completion"]) == plain(stock._logs["completion"])
    assert all("The square is" in str(p) for p in ours._logs["prompt"])
    # a look whose result was rolled back (too long for the completion) still counted: TRL runs the tool first
    looks = [sum(m["role"] == "tool" for m in c) for c in ours._logs["completion"]]
    rewards = list(ours._logs["rewards"]["Canvas"])
    assert rewards == list(stock._logs["rewards"]["Canvas"]) and any(looks)
    assert all(r >= n for r, n in zip(rewards, looks, strict=True))
    for stock_entry, our_entry in zip(stock_logs, our_logs, strict=True):
        for key in ("loss", "grad_norm", "rewards/Canvas/mean", "tools/call_frequency"):
            assert math.isclose(our_entry[key], stock_entry[key], rel_tol=1e-4, abs_tol=1e-5), key
    stock_params = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        torch.testing.assert_close(param, stock_params[name], rtol=1e-4, atol=1e-5, msg=name)


def scripted_rollout(prompts, trainer):
    """A `rollout_func`: the trainer's prompt encoding, one scripted answer per row, its last token masked out, and a
    field for the rewards."""
    processor = trainer.processing_class
    prompt_ids = [
        processor.apply_chat_template(p, add_generation_prompt=True, tokenize=True)[0] for p in prompts
    ]
    answer = processor.tokenizer(" red", add_special_tokens=False)["input_ids"] + [trainer.eos_token_ids[0]]
    completions = [answer[: 1 + i % 2] + answer[-1:] for i in range(len(prompts))]
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completions,
        "logprobs": [[0.0] * len(c) for c in completions],
        "env_mask": [[1] * (len(c) - 1) + [0] for c in completions],
        "origin": [f"script {i}" for i in range(len(prompts))],
    }


def test_rollout_func_fields_reach_the_rewards(tools_model, tmp_path):
    """`rollout_func`: its completions are trained on, `env_mask` masks tokens out of the loss, and its other fields
    reach the rewards as columns."""
    path, processor, _ = tools_model
    seen = []

    def origin_reward(completions, origin, **kwargs):
        seen.extend(origin)
        return [float(len(c[0]["content"])) for c in completions]

    args = VLMGRPOConfig(output_dir=str(tmp_path), **{**COMMON, "max_steps": 1, "learning_rate": 1e-2})
    trainer = VLMGRPOTrainer(
        path,
        origin_reward,
        args=args,
        train_dataset=Dataset.from_list(color_rows(8)),
        rollout_func=scripted_rollout,
    )
    trainer.model.train()
    batch = trainer._generate_and_score_completions(two_groups())
    assert seen == [f"script {i}" for i in range(4)]
    lengths = batch["completion_mask"].sum(1).tolist()
    assert lengths == [2, 3, 2, 3] and batch["tool_mask"][0, :2].tolist() == [1, 0]
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["loss"])


def test_rollout_func_must_encode_images_as_the_trainer_does(tools_model, tmp_path):
    """A prompt with an image whose ids do not expand it (the tokenizer's template alone) cannot get image inputs
    that fit: one line saying how to render it."""
    path, processor, _ = tools_model

    def unexpanded(prompts, trainer):
        output = scripted_rollout(prompts, trainer)
        output["prompt_ids"] = [ids[:-3] for ids in output["prompt_ids"]]
        return output

    args = VLMGRPOConfig(output_dir=str(tmp_path), **{**COMMON, "max_steps": 1})
    trainer = VLMGRPOTrainer(
        path, turns_reward, args=args, train_dataset=Dataset.from_list(color_rows(8)), rollout_func=unexpanded
    )
    trainer.model.train()
    with pytest.raises(VLMGRPOError, match="row 0's prompt_ids .* are not the trainer's encoding") as error:
        trainer._generate_and_score_completions(two_groups())
    assert "\n" not in str(error.value) and "apply_chat_template" in str(error.value)


def test_dynamic_sampling_and_the_samples_log_with_tools(tools_model, tmp_path):
    """Dynamic sampling keeps whole multi-turn rows (their tool masks and tool images with them), `tools/*` describe
    the rows trained on, and the samples log shows each turn: the call, the tool's result, the answer."""
    flat_for_red = lambda completions, solution, **kwargs: [  # noqa: E731
        1.0 if s == "red" else turns_reward([c])[0] for c, s in zip(completions, solution, strict=True)
    ]
    trainer = zoom_rollout_trainer(
        tools_model, tmp_path, reward=flat_for_red, dynamic_sampling=True, log_samples_steps=1
    )
    batch = trainer._generate_and_score_completions(two_groups())  # red (flat), green
    assert batch["tool_mask"].shape == batch["completion_ids"].shape
    # `tools/*` describe the rows trained on (the completions table holds them), not every round's rows
    trained = list(trainer._logs["completion"])
    calls = sum(sum(m["role"] == "tool" for m in c) for c in trained) / len(trained)
    # one value, the batch's
    assert trainer._metrics["train"]["tools/call_frequency"] == [pytest.approx(calls)]
    tool_rows = (batch["tool_mask"] == 0).any(1)
    for i, row in enumerate(batch["image_inputs"]):  # a row with a tool result holds the tool's image too
        assert (row["image_grid_thw"].size(0) == 2) == bool(tool_rows[i])
    trainer.train()
    from vlm_grpo.cli.samples import read_samples

    texts = [t for r in read_samples(tmp_path) for t in r["completions"]]
    assert any("zoom(" in t and "[zoom -> [image] quarter 2]" in t for t in texts), texts


def test_a_checkpoint_holds_the_multi_turn_rollout(tools_model, tmp_path):
    """The buffered micro-batches of a tool rollout (tool masks, rows with their own image inputs) come back from a
    checkpoint as they were, rows of a group still sharing one image dict."""
    from vlm_grpo.trainer.rollout_buffer import load_rollout, save_rollout

    trainer = zoom_rollout_trainer(tools_model, tmp_path)
    batch = trainer._generate_and_score_completions(two_groups())
    plan = batch.pop("sharing")
    buffered = [{**batch, "sharing": plan}]
    save_rollout(tmp_path, 0, 1, buffered)
    step, loaded = load_rollout(tmp_path, 0, torch.device("cpu"))
    assert step == 1 and loaded[0]["sharing"] == plan
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[0][key], value), key
    rows, back = batch["image_inputs"], loaded[0]["image_inputs"]
    assert any(r["image_grid_thw"].size(0) == 2 for r in rows)
    for i, (a, b) in enumerate(zip(rows, back, strict=True)):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        if i and rows[i] is rows[i - 1]:
            assert back[i] is back[i - 1]
        if i and prompt_images(rows[i]) is prompt_images(rows[i - 1]):  # one group, tool images or not
            assert prompt_images(back[i]) is prompt_images(back[i - 1])
    assert any(prompt_images(r) is not r for r in back)  # rows with tool images keep their parts


def test_a_tool_result_past_the_completion_budget_is_rolled_back_with_one_log_line(
    tools_model, tmp_path, caplog
):
    """A tool image that would push the row past max_completion_length is dropped and the row ends on its call, as
    TRL does; the trainer says so in one line."""
    trainer = zoom_rollout_trainer(tools_model, tmp_path, max_completion_length=40)
    with caplog.at_level("INFO", logger="vlm_grpo.rollout.rollout"):
        batch = trainer._generate_and_score_completions(two_groups())
    completions = list(trainer._logs["completion"])
    called = [c for c in completions if c[-1].get("tool_calls")]
    assert called and not any(m["role"] == "tool" for c in completions for m in c)  # every result rolled back
    assert (batch["tool_mask"] == 1).all()  # no tool-result token was kept
    lines = [r.getMessage() for r in caplog.records if "without its result" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and lines[0].startswith(f"{len(called)} of 4 completions")


def test_a_truncated_row_with_a_tool_image_is_masked_out_of_the_loss_and_trains(tools_model, tmp_path):
    """`mask_truncated_completions` with a tool's image in a truncated row (full rows, so the training forward computes
    M-RoPE positions from the attention mask): the row keeps its completion attended, so the image's tokens keep
    their positions, and is masked out of the loss through its `tool_mask`; training runs (TRL fails on such a row)."""
    trainer = zoom_rollout_trainer(
        tools_model, tmp_path, max_completion_length=70, mask_truncated_completions=True,
        share_prompt_prefix="false", beta=0.04,
    )  # fmt: skip
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions(two_groups())
    completions = list(trainer._logs["completion"])
    with_images = [any(m["role"] == "tool" for m in c) for c in completions]
    lengths = (batch["completion_ids"] != trainer.processing_class.tokenizer.pad_token_id).sum(1)  # [B]
    for row, has_image in enumerate(with_images):
        if has_image:  # truncated at 70 tokens: attended, out of the loss
            assert batch["completion_mask"][row].sum() == lengths[row] and batch["tool_mask"][row].sum() == 0
    assert any(with_images)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(math.isfinite(x) for x in losses)
