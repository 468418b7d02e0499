"""The command line end to end: `vlm-grpo train` for 2 steps, `vlm-grpo eval` on the result, and the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import write_color_data

from vlm_grpo.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]


def vlm_grpo(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vlm_grpo", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_train_then_eval_round_trip(tiny_model, tmp_path):
    data = write_color_data(tmp_path / "data")
    out = tmp_path / "run"
    config = {
        "model_name_or_path": tiny_model("qwen2_vl"),
        "dtype": "float32",
        "data_config": str(data),
        "rewards": [{"name": "choice_accuracy", "weight": 1.0}, {"name": "format", "weight": 0.5}],
        "output_dir": str(out),
        "max_steps": 5,  # overridden on the command line below
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 4,
        "learning_rate": 1e-3,
        "bf16": False,
        "use_cpu": True,
        "gradient_checkpointing": False,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    result = vlm_grpo("train", str(tmp_path / "train.yaml"), "--max_steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2  # the command-line flag won over the YAML
    assert any("rewards/choice_accuracy/mean" in entry for entry in state["log_history"])
    assert (out / "model.safetensors").exists() and (out / "processor_config.json").exists()

    report_path = tmp_path / "eval.json"
    result = vlm_grpo(
        "eval",
        "--model",
        str(out),
        "--data",
        str(data),
        "--output",
        str(report_path),
        "--rewards",
        "choice_accuracy",
        "format",
        "--max_new_tokens",
        "3",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert set(report) == {"accuracy", "n", "rewards"} and report["n"] == 8
    assert set(report["rewards"]) == {"choice_accuracy", "format"}
    assert 0.0 <= report["accuracy"] <= 1.0 and report["accuracy"] == report["rewards"]["choice_accuracy"]
    assert "accuracy:" in result.stdout


def test_unknown_command_exits_nonzero():
    result = vlm_grpo("trian")
    assert result.returncode == 2 and "unknown command 'trian'" in result.stderr


def test_demo_smoke_run(tmp_path):
    result = run_demo(str(tmp_path), max_steps=2)
    for name in ("eval_before.json", "eval_after.json"):
        report = json.loads((tmp_path / name).read_text())
        assert set(report) == {"accuracy", "n", "rewards"} and report["n"] == 64
    assert result["after"]["accuracy"] == json.loads((tmp_path / "eval_after.json").read_text())["accuracy"]
    assert (tmp_path / "model" / "model.safetensors").exists()
