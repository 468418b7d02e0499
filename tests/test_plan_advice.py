"""`vlm-grpo plan`'s advice (each change with its planned peak, and whether it fits), the image size it assumes, and
docs/planner.md against the plan."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from PIL import Image
from test_plan import RECIPE_PEAK, planned

from vlm_grpo.models import get_model_family
from vlm_grpo.testing import DEFAULT_FAMILY

ROOT = Path(__file__).parents[1]
MUST_ADVISE = ("LoRA:", "QLoRA:", "optim: adamw_bnb_8bit", "DeepSpeed ZeRO-3 with CPU offload", "GPUs in all")


def test_a_full_fine_tune_that_does_not_fit_is_told_what_makes_it_fit(tiny_model):
    """Each change is planned alone, with its own peak: the same peak as planning the changed config."""
    path = tiny_model(DEFAULT_FAMILY)
    options = dict(  # a batch small enough for the model states to matter, as in a 7B run
        dtype="bfloat16", gradient_accumulation_steps=2, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=2,
    )  # fmt: skip
    offload = planned(path, plan_options=dict(deepspeed=(3, True, True)), **options).plan.peak
    result = planned(path, offload, plan_options=dict(advise=True), **options)
    assert result.plan.peak > offload  # does not fit in a GPU of that size
    advice = {a.change.split(" (")[0]: a.peak for a in result.advice}
    for change in MUST_ADVISE:
        assert any(name.startswith(change) or change in name for name in advice), (change, advice)
    assert advice["LoRA: use_peft: true"] == planned(path, offload, use_peft=True, **options).plan.peak
    assert (
        advice["QLoRA: use_peft: true, load_in_4bit: true"]
        == planned(path, offload, use_peft=True, load_in_4bit=True, **options).plan.peak
    )
    assert (
        advice["optim: adamw_bnb_8bit"] == planned(path, offload, optim="adamw_bnb_8bit", **options).plan.peak
    )
    assert advice["DeepSpeed ZeRO-3 with CPU offload"] == offload
    assert [a.peak for a in result.advice] == sorted(a.peak for a in result.advice)


def test_the_7b_full_fine_tune_on_one_24_gib_gpu_is_told_what_fits(capsys, monkeypatch):
    from vlm_grpo.cli.plan import main

    monkeypatch.chdir(ROOT)
    main(["recipes/qwen2_5_vl_7b_geo3k.yaml", "--gpus", "1", "--gpu_memory", "24GiB"])
    out = capsys.readouterr().out
    assert "verdict     does not fit in 24 GiB" in out
    advice = out.split("would lower the peak")[1].splitlines()[1:]
    for change in MUST_ADVISE:
        line = next(line for line in advice if change in line)
        assert re.search(r" [0-9.]+ GiB  (fits|does not fit)$", line), line
    assert any(line.endswith("  fits") for line in advice)


@pytest.mark.parametrize("max_pixels", [None, 112 * 112])
def test_the_image_size_follows_max_pixels(max_pixels, tiny_model):
    path = tiny_model(DEFAULT_FAMILY)
    options = {"max_pixels": max_pixels} if max_pixels else {}
    result = planned(path, **options)
    side = math.isqrt(max_pixels) if max_pixels else 448
    assert result.image_size == (side, side)
    family = get_model_family(path)
    processor = family.load_processor(path, max_pixels=max_pixels)
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what color"}]}]
    encoded = family.encode_prompt(processor, prompt, [Image.new("RGB", (side, side))])
    assert encoded.input_ids.count(processor.image_token_id) == result.image_tokens


def test_docs_name_every_term_and_state_each_recipes_peak(tiny_model):
    """docs/planner.md: its terms table names every line the plan prints, its recipes table the headers' peaks."""
    docs = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    table = docs.split("## How each term is counted")[1].split("\n### ")[0]
    documented = {name for row in re.findall(r"^\| ([^|]+) \|", table, re.M) for name in row.split(", ")}
    path = tiny_model(DEFAULT_FAMILY)
    zero = [(1, False, False), (2, True, False), (3, False, False), (3, True, True)]
    plans = [
        planned(path, beta=0.04, optim="adamw_torch", gradient_checkpointing=True),
        planned(path, use_peft=True, gradient_checkpointing=False, use_vllm=True, vllm_mode="colocate"),
        planned(path, use_vllm=True, vllm_mode="server"),
        *(planned(path, beta=0.04, gradient_accumulation_steps=2, plan_options=dict(processes=8, deepspeed=z))
          for z in zero),
    ]  # fmt: skip
    names = {t.name for result in plans for t in result.plan.terms()}
    assert not names - documented, f"docs/planner.md's terms table does not name {sorted(names - documented)}"
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        found = RECIPE_PEAK.search(recipe.read_text(encoding="utf-8"))
        if found:
            row = next(line for line in docs.splitlines() if line.startswith(f"| `recipes/{recipe.name}`"))
            assert f"| {found.group(1)} GiB" in row, row
