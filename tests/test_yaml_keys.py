"""A training YAML or command line that names no option is refused first, with the closest valid name."""

from __future__ import annotations

import os

import pytest
import yaml

from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.train import parse_args

BASE = {
    "model_name_or_path": "some/model",
    "data_config": "data.yaml",
    "output_dir": "out",
    "per_device_train_batch_size": 4,
    "num_generations": 2,
    "bf16": False,
    "use_cpu": True,
    "report_to": "none",
}


def write(tmp_path, **changes):
    config = {**BASE, **changes}
    config = {k: v for k, v in config.items() if v is not None}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_valid_yaml_parses_and_env_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv("VLM_GRPO_TEST_VAR", "0")  # restored after the test
    script_args, training_args, model_args = parse_args([write(tmp_path, env={"VLM_GRPO_TEST_VAR": "1"})])
    assert training_args.num_generations == 2 and model_args.model_name_or_path == "some/model"
    assert os.environ["VLM_GRPO_TEST_VAR"] == "1"


def test_misspelt_key_is_reported_before_trl_batch_size_check(tmp_path):
    # per_device_train_batch_size 3 is not divisible by TRL's default num_generations (8): TRL would say so first
    path = write(tmp_path, num_generations=None, num_generation=4, per_device_train_batch_size=3)
    with pytest.raises(
        VLMGRPOError, match=r"unknown key 'num_generation' \(did you mean 'num_generations'\?\)"
    ):
        parse_args([path])


def test_every_unknown_key_is_named(tmp_path):
    with pytest.raises(VLMGRPOError) as exc:
        parse_args([write(tmp_path, learning_rat=1e-5, zzz_qqq=1)])
    message = str(exc.value)
    assert "train.yaml" in message and "'learning_rat' (did you mean 'learning_rate'?)" in message
    assert "'zzz_qqq'" in message and "'zzz_qqq' (did you mean" not in message


def test_reward_entry_key_is_reported_before_trl_checks(tmp_path):
    path = write(tmp_path, rewards=[{"name": "iou", "wieght": 2}], per_device_train_batch_size=3)
    with pytest.raises(VLMGRPOError, match=r"reward 'iou': unknown key 'wieght' \(did you mean 'weight'\?\)"):
        parse_args([path])


def test_misspelt_flag_names_the_closest_option(tmp_path):
    with pytest.raises(
        VLMGRPOError, match=r"unknown option --learning_rat \(did you mean '--learning_rate'\?\)"
    ):
        parse_args([write(tmp_path), "--learning_rat", "1e-4"])
    with pytest.raises(VLMGRPOError, match="unknown option --num_generation "):  # no prefix matching
        parse_args([write(tmp_path), "--num_generation=4"])
    assert parse_args([write(tmp_path), "--learning-rate", "1e-4"])[1].learning_rate == 1e-4


def test_yaml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model_name_or_path: x\n  data_config: [\n")
    with pytest.raises(VLMGRPOError, match=r"broken\.yaml: not valid YAML .*line 2"):
        parse_args([str(path)])
    path.write_text("- a list\n")
    with pytest.raises(VLMGRPOError, match=r"broken\.yaml: expected a mapping"):
        parse_args([str(path)])
    with pytest.raises(VLMGRPOError, match="training config .*missing.yaml not found"):
        parse_args([str(tmp_path / "missing.yaml")])


def test_trl_validation_errors_become_user_errors_naming_the_config(tmp_path):
    with pytest.raises(VLMGRPOError, match="divisible by num_generations"):
        parse_args([write(tmp_path, per_device_train_batch_size=3)])
