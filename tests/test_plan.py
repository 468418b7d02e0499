"""`vlm-grpo plan`: every term it computes checked against what can be measured here.

Parameter counts equal the instantiated tiny models' and the published totals of real checkpoints; image tokens
equal what each family's processor expands an image into; the activations measured on the meta device are within
10% of what autograd really saves on the CPU; the command prints a breakdown and a verdict from a recipe alone
and refuses bad input in one line.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch
from PIL import Image

from vlm_grpo.models import get_model_family
from vlm_grpo.planner.architectures import PUBLISHED, load_model_config
from vlm_grpo.planner.measure import _SavedBytes, _unpack, build_on_meta, count_parameters, token_costs
from vlm_grpo.testing import (
    DEFAULT_FAMILY,
    TINY_FAMILIES,
    a_family_with,
    families_with,
    one_family_per_image_rule,
)

PUBLISHED_TOTALS = {  # parameters as the publishers state them (model cards / hub listings)
    "Qwen/Qwen2-VL-2B-Instruct": 2_208_985_600,
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,
    "Qwen/Qwen3-VL-8B-Instruct": 8_767_123_696,
    "google/gemma-3-4b-it": 4_300_079_472,
}
PUBLISHED_ROUNDED = {"OpenGVLab/InternVL3-2B-hf": 2.09e9, "Qwen/Qwen3-VL-30B-A3B-Instruct": 31.1e9}


def meta_model(path_or_id: str):
    config, _, _ = load_model_config(path_or_id)
    family = get_model_family(config)
    return build_on_meta(family, config, torch.float32), family, config


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_published_architectures_have_their_published_sizes(model_id):
    model, family, _ = meta_model(model_id)
    counts = count_parameters(model, family, freeze_vision=False)
    if model_id in PUBLISHED_TOTALS:
        assert counts.total == PUBLISHED_TOTALS[model_id]
    else:
        assert round(counts.total / 1e9, 2 if counts.total < 1e10 else 1) == PUBLISHED_ROUNDED[model_id] / 1e9
    assert counts.trainable == counts.total and not any(p.device.type != "meta" for p in model.parameters())


@pytest.mark.parametrize("family_name", TINY_FAMILIES)
def test_parameter_counts_equal_the_instantiated_model(family_name, tiny_model):
    path = tiny_model(family_name)
    model, family, _ = meta_model(path)
    real = family.load_model(path, dtype=torch.float32)
    counts = count_parameters(model, family, freeze_vision=True)
    assert counts.total == sum(p.numel() for p in real.parameters())
    assert counts.vision == sum(p.numel() for n, p in real.named_parameters() if family.is_vision_module(n))
    assert counts.embeddings == real.get_input_embeddings().weight.numel()
    assert counts.tied == (real.get_output_embeddings().weight is real.get_input_embeddings().weight)
    assert counts.trainable == counts.total - counts.vision


@pytest.mark.parametrize("family_name", one_family_per_image_rule(besides=[DEFAULT_FAMILY]))
def test_lora_trainable_count_equals_peft(family_name, tiny_model):
    from peft import LoraConfig, get_peft_model

    from vlm_grpo.policy.adapters import language_linear_names, resolve_lora_config

    path = tiny_model(family_name)
    model, family, _ = meta_model(path)
    real = family.load_model(path, dtype=torch.float32)
    peft_model = get_peft_model(real, resolve_lora_config(LoraConfig(r=8), real, family))
    counts = count_parameters(
        model, family, False, lora_r=8, lora_targets=language_linear_names(model, family)
    )
    assert (
        counts.lora == counts.trainable == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    )


def test_qlora_quantizes_the_linear_layers_bitsandbytes_converts(tiny_model):
    from vlm_grpo.policy.adapters import qlora_quantization_config

    path = tiny_model(DEFAULT_FAMILY)
    model, family, _ = meta_model(path)
    real = family.load_model(path, quantization_config=qlora_quantization_config(torch.float32))
    quantized = [m for m in real.modules() if type(m).__name__ == "Linear4bit"]
    counts = count_parameters(model, family, False, lora_r=8, lora_targets=[], quantize_4bit=True)
    assert quantized and counts.quantized == sum(m.out_features * m.in_features for m in quantized)


@pytest.mark.parametrize("family_name", TINY_FAMILIES)
@pytest.mark.parametrize("size", [(56, 56), (200, 120), (90, 330)])
def test_image_tokens_equal_the_processors_expansion(family_name, size, tiny_model):
    path = tiny_model(family_name)
    family = get_model_family(path)
    processor = family.load_processor(path)
    config, settings, _ = load_model_config(
        path
    )  # the folder's min/max pixels and tiles, as the plan reads them
    image_settings = {k: v for k, v in settings.items() if not k.startswith("video_")}
    predicted = family.image_tokens(config, *size, **image_settings)
    if predicted is None:  # the family says it cannot tell without its processor
        return
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what color"}]}]
    encoded = family.encode_prompt(processor, prompt, [Image.new("RGB", size)])
    assert encoded.input_ids.count(config.image_token_id) == predicted


@pytest.mark.parametrize("family_name", families_with(core=True))
def test_meta_activations_match_what_autograd_saves_on_cpu(family_name, tiny_model):
    path = tiny_model(family_name)
    model, family, config = meta_model(path)
    predicted = token_costs(model, torch.float32, tokens=64).saved
    real = family.load_model(path, dtype=torch.float32).get_decoder()
    hidden = torch.randn(2, 64, config.get_text_config().hidden_size, requires_grad=True)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[0, :5] = 0  # left padding, as in a GRPO batch
    saved = _SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, _unpack):
        real(inputs_embeds=hidden, attention_mask=mask, use_cache=False)
    assert predicted == pytest.approx(saved.total / 128, rel=0.1)


def plan_command(*args: str) -> subprocess.CompletedProcess:
    """`vlm-grpo plan ARGS` run in this process from the repository's root: its exit status, stdout and stderr."""
    from test_cli import ROOT

    from vlm_grpo.cli.main import main

    out, err, status = io.StringIO(), io.StringIO(), 0
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main(["plan", *args])
    except SystemExit as exit_status:
        status = exit_status.code or 0
    finally:
        os.chdir(cwd)
    return subprocess.CompletedProcess(["vlm-grpo", "plan", *args], status, out.getvalue(), err.getvalue())


def parsed(model: str, **options):
    """`(training_args, model_args)` of a config with `options`, parsed as `vlm-grpo plan` parses a YAML."""
    from vlm_grpo.cli.plan import training_options

    return training_options("train.yaml", {"model_name_or_path": model, **options}, [])


def planned(model: str, gpu_memory: int = 80 * 2**30, plan_options: dict | None = None, **options):
    """`plan_config` of a config with `options`; `plan_options` are `plan_config`'s own (processes, deepspeed...)."""
    from vlm_grpo.planner.report import plan_config

    return plan_config(*parsed(model, **options), gpu_memory, **(plan_options or {}))


def test_plan_prints_the_breakdown_and_a_verdict_for_a_recipe():
    result = plan_command("recipes/qwen2_5_vl_7b_brand_qlora.yaml", "--gpus", "1", "--gpu_memory", "24GiB")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    for line in ("parameters  8.292B", "weights", "optimizer states", "activations", "KV cache", "peak"):
        assert line in out
    assert "verdict     fits in 24 GiB with" in out


def test_the_kv_cache_is_the_static_cache_where_fast_generation_runs(tiny_model):
    """`fast_generation: auto` on CUDA decodes from a static cache of whole 256-token buckets, and the plan's KV cache
    holds that length; on the CPU, with `false` or under ZeRO-3 the trainer keeps the growing cache: prompt + completion.
    """
    path = tiny_model(DEFAULT_FAMILY)

    def kv_cache(device: str = "cuda", deepspeed=None, **options) -> tuple[int, int, str]:
        plan_options = {"device": device} | ({"deepspeed": deepspeed, "processes": 2} if deepspeed else {})
        result = planned(path, plan_options=plan_options, max_completion_length=100, **options)
        (term,) = [t for t in result.plan.generation if t.name == "KV cache"]
        tokens = re.fullmatch(r"\d+ rows x (\d+) tokens( \(static cache\))?", term.note).group(1)
        return term.gpu, int(tokens), term.note

    growing = kv_cache(fast_generation="false")
    static = kv_cache()
    assert static[2].endswith("(static cache)") and not growing[2].endswith("(static cache)")
    assert static[1] == 256 * -(-growing[1] // 256) and static[1] > growing[1]  # the prompt + 100, rounded up
    assert static[0] * growing[1] == growing[0] * static[1]  # bytes in proportion to the tokens
    assert kv_cache("cpu") == growing  # auto: off on the CPU
    assert kv_cache("cpu", fast_generation="true") == static
    assert kv_cache(deepspeed=(3, False, False))[1] == growing[1]  # ZeRO-3: the growing cache


def test_plan_gives_a_smaller_peak_with_zero3_over_more_gpus(tmp_path):
    def peak(*extra: str) -> float:
        result = plan_command("recipes/qwen2_5_vl_3b_rec.yaml", "--gpu_memory", "80GiB", *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith("peak"))
        return float(line.split()[1])

    alone = peak("--gpus", "1")
    sharded = peak("--gpus", "8", "--deepspeed", "local_scripts/zero3.json")
    assert sharded < alone / 2


def test_plan_says_does_not_fit_and_what_would_help():
    result = plan_command(
        "recipes/qwen2_5_vl_7b_geo3k.yaml",
        "--gpus",
        "1",
        "--gpu_memory",
        "24GiB",
        "--gradient_checkpointing",
        "false",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "verdict     does not fit in 24 GiB" in result.stdout
    assert "gradient_checkpointing: true" in result.stdout.split("would lower the peak")[1]


def test_plan_of_a_local_folder_with_a_training_option_override(tiny_model, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(
        f"model_name_or_path: {tiny_model(a_family_with(image_rule='fixed'))}\ndata_config: none.yaml\n",
        encoding="utf-8",
    )
    one = plan_command(str(config), "--per_device_train_batch_size", "8", "--num_generations", "8")
    assert one.returncode == 0, one.stderr[-2000:]
    assert "batch       8 completions per micro-batch, G=8" in one.stdout


@pytest.mark.parametrize(
    "setup, message",
    [
        ("folder", "has no config.json"),
        ("model_type", "is not one transformers knows"),
        ("hub", "pass --model_config"),
        ("gpus", "--gpus and --nodes must be at least 1"),
        ("memory", "give a size such as 24GiB"),
    ],
)
def test_plan_refuses_bad_input_in_one_line(setup, message, tmp_path, capsys):
    """`vlm-grpo plan` (run in this process) exits with status 1 and writes one line naming what is wrong."""
    from vlm_grpo.cli.main import main

    model = tmp_path / "model"
    model.mkdir()
    extra: list[str] = []
    if setup == "model_type":
        (model / "config.json").write_text(json.dumps({"model_type": "not_a_model"}), encoding="utf-8")
    if setup == "hub":
        model = "someone/unknown-model"
    if setup == "gpus":
        extra = ["--gpus", "0"]
    if setup == "memory":
        extra = ["--gpu_memory", "lots"]
    config = tmp_path / "train.yaml"
    config.write_text(f"model_name_or_path: {model}\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_status:
        main(["plan", str(config), *extra])
    assert exit_status.value.code == 1
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], stderr[-2000:]


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_and_optimizer_terms_equal_a_real_adamw_step(lora, tiny_model):
    from peft import LoraConfig, get_peft_model

    from vlm_grpo.planner.memory import Recipe, plan_memory
    from vlm_grpo.policy.adapters import language_linear_names, resolve_lora_config

    path = tiny_model(a_family_with(image_rule="grid", besides=[DEFAULT_FAMILY]))
    model, family, _ = meta_model(path)
    real = family.load_model(path, dtype=torch.float32)
    targets = language_linear_names(model, family) if lora else None
    counts = count_parameters(model, family, True, lora_r=8 if lora else None, lora_targets=targets)
    if lora:
        real = get_peft_model(real, resolve_lora_config(LoraConfig(r=8), real, family))
    else:
        for name, parameter in real.named_parameters():
            parameter.requires_grad_(not family.is_vision_module(name))
    trained = [p for p in real.parameters() if p.requires_grad]
    for p in trained:
        p.grad = torch.ones_like(p)
    optimizer = torch.optim.AdamW(trained)
    optimizer.step()
    plan = plan_memory(
        Recipe(weight_bytes=4, lora_r=8 if lora else None), counts, token_costs(model, torch.float32), 0
    )
    terms = {t.name: t.gpu for t in plan.held + plan.training}
    assert terms["gradients"] == sum(p.grad.numel() * p.grad.element_size() for p in trained)
    states = [s for state in optimizer.state.values() for s in state.values() if s.dim() > 0]
    assert terms["optimizer states"] == sum(s.numel() * s.element_size() for s in states)


@pytest.mark.parametrize("family_name", [*one_family_per_image_rule(), a_family_with(indexable_cache=False)])
def test_kv_cache_per_token_equals_a_real_forward(family_name, tiny_model):
    from vlm_grpo.planner.measure import _cache_bytes

    path = tiny_model(family_name)
    model, family, config = meta_model(path)
    predicted = token_costs(model, torch.float32, tokens=16).cache
    real = family.load_model(path, dtype=torch.float32).get_decoder()
    with torch.no_grad():
        hidden = torch.randn(1, 16, config.get_text_config().hidden_size)
        cache = real(inputs_embeds=hidden, use_cache=True)[1]
    assert predicted == _cache_bytes(cache) // 16


RECIPE_PEAK = re.compile(
    r"^# Planned peak per GPU: ([0-9.]+) GiB, ([0-9]+x[0-9]+) images \(vlm-grpo plan (.*)\)\.$", re.M
)


@pytest.mark.parametrize(
    "recipe", sorted(p.name for p in (Path(__file__).parents[1] / "recipes").glob("*.yaml"))
)
def test_each_recipe_states_the_peak_the_planner_gives(recipe, capsys, monkeypatch):
    from vlm_grpo.cli.plan import main

    root = Path(__file__).parents[1]
    text = (root / "recipes" / recipe).read_text(encoding="utf-8")
    found = RECIPE_PEAK.search(text)
    if found is None:  # only where the planner cannot build the architecture offline, and then it says how
        assert "--model_config path/to/config.json" in text
        return
    monkeypatch.chdir(root)
    main(found.group(3).split())
    out = capsys.readouterr().out
    peak = re.search(r"^  peak\s+([0-9.]+) GiB", out, re.M).group(1)
    assert f"{float(peak):.1f}" == found.group(1)
    assert f" of {found.group(2)}), " in out  # the image size the plan assumed is the one the header states
    gpu = re.search(r"--gpu_memory ([0-9]+)GiB", found.group(3)).group(1)
    assert f"verdict     fits in {gpu} GiB" in out  # every recipe fits the hardware its command states
