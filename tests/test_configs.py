"""Every shipped YAML and JSON config loads and validates: recipes, data configs, DeepSpeed and accelerate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import vlm_grpo.config
from vlm_grpo.config import VLMGRPOConfig
from vlm_grpo.data import load_data_config
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import SUPPORTED_MODEL_TYPES
from vlm_grpo.rewards import build_rewards
from vlm_grpo.testing import FAMILIES
from vlm_grpo.train import parse_args

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
DATA_CONFIGS = sorted((ROOT / "data_config").glob("*.yaml"))


def test_recipes_and_data_configs_are_shipped():
    assert len(RECIPES) >= 5 and len(DATA_CONFIGS) >= 4


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_parses_and_its_parts_resolve(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes name data configs relative to the repository root
    script_args, training_args, model_args = parse_args([str(recipe), "--use_cpu", "true"])
    funcs, weights = build_rewards(script_args.rewards)
    assert funcs and len(weights) == len(funcs)
    dataset = load_data_config(script_args.data_config, seed=training_args.seed)
    assert len(dataset) > 0 and "prompt" in dataset.column_names and "solution" in dataset.column_names
    assert model_args.model_name_or_path
    assert training_args.per_device_train_batch_size % training_args.num_generations == 0
    if model_args.load_in_4bit:
        assert model_args.use_peft


def test_recipes_cover_the_promised_tasks():
    names = {p.stem for p in RECIPES}
    assert {
        "qwen2_5_vl_3b_rec",
        "qwen2_5_vl_7b_geo3k",
        "qwen2_5_vl_7b_brand_qlora",
        "internvl3_2b_brand_qlora",
        "gemma3_4b_lora",
        "qwen3_vl_30b_a3b_zero3",
        "qwen3_5_4b_lora",
    } <= names


@pytest.mark.parametrize("data_config", DATA_CONFIGS, ids=lambda p: p.name)
def test_data_config_loads_its_example_data(data_config):
    dataset = load_data_config(data_config)
    row = dataset[0]
    user = [m for m in row["prompt"] if m["role"] == "user"][0]
    images = [part for part in user["content"] if part["type"] == "image"]
    assert len(images) == len(row["images"]) and all(img.mode == "RGB" for img in row["images"])


@pytest.mark.parametrize("name", ["zero2.json", "zero3.json", "zero3_offload.json"])
def test_deepspeed_configs(name):
    config = json.loads((ROOT / "local_scripts" / name).read_text())
    stage = int(name[4])
    assert config["zero_optimization"]["stage"] == stage
    if stage == 3:
        assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


@pytest.mark.parametrize("name", ["accelerate_zero2.yaml", "accelerate_zero3.yaml", "accelerate_ddp.yaml"])
def test_accelerate_configs(name):
    config = yaml.safe_load((ROOT / "local_scripts" / name).read_text())
    assert config["distributed_type"] in ("DEEPSPEED", "MULTI_GPU")
    if config["distributed_type"] == "DEEPSPEED":
        assert (ROOT / config["deepspeed_config"]["deepspeed_config_file"]).exists()


def test_recipe_model_families_are_supported():
    families = {name: f.model_type for f in FAMILIES.values() for name in f.checkpoints}
    for recipe in RECIPES:
        model = yaml.safe_load(recipe.read_text())["model_name_or_path"]
        assert any(key in model and families[key] in SUPPORTED_MODEL_TYPES for key in families), model


def test_unknown_yaml_key_is_an_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: x\ndata_config: d.yaml\nlearning_rat: 1.0e-5\n")
    with pytest.raises(ValueError, match="learning_rat"):
        parse_args([str(bad), "--use_cpu", "true"])


@pytest.fixture
def no_bf16_accelerator(monkeypatch):
    """A machine without bf16 support, whatever this one has (the probe transformers uses says no)."""
    monkeypatch.setattr(vlm_grpo.config, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(vlm_grpo.config, "is_torch_xla_available", lambda: False)


def test_bf16_left_unset_turns_off_with_one_log_line(no_bf16_accelerator, caplog):
    with caplog.at_level("INFO", logger="vlm_grpo.config"):
        config = VLMGRPOConfig(output_dir="out", report_to="none")
    assert config.bf16 is False and config.fp16 is False
    lines = [r.getMessage() for r in caplog.records if r.name == "vlm_grpo.config"]
    assert len(lines) == 1 and "bf16 is off" in lines[0]


def test_yaml_without_bf16_parses_on_a_machine_without_bf16(no_bf16_accelerator, tmp_path):
    (tmp_path / "train.yaml").write_text("model_name_or_path: m\ndata_config: d.yaml\noutput_dir: out\n")
    assert parse_args([str(tmp_path / "train.yaml")])[1].bf16 is False


@pytest.mark.parametrize("where", ["yaml", "flag"])
def test_explicit_bf16_without_support_is_an_error_naming_the_flag(no_bf16_accelerator, tmp_path, where):
    text = "model_name_or_path: m\ndata_config: d.yaml\noutput_dir: out\n"
    (tmp_path / "train.yaml").write_text(text + ("bf16: true\n" if where == "yaml" else ""))
    argv = [str(tmp_path / "train.yaml")] + (["--bf16", "true"] if where == "flag" else [])
    with pytest.raises(VLMGRPOError, match=r"bf16: true, .*no accelerator with bf16 support.*use_cpu: true"):
        parse_args(argv)


def test_bf16_on_cpu_with_use_cpu_and_explicit_false_are_kept(no_bf16_accelerator):
    assert VLMGRPOConfig(output_dir="out", use_cpu=True, report_to="none").bf16 is True  # TRL's default
    assert VLMGRPOConfig(output_dir="out", bf16=False, report_to="none").bf16 is False
