"""The command line end to end: `vlm-grpo train` for 2 steps, `vlm-grpo eval` on the result, and the demo; every
command's `--help` and input errors answered before torch, transformers, TRL or datasets is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import write_color_data
from transformers.utils import is_torch_bf16_gpu_available

from vlm_grpo.cli.demo import run_demo
from vlm_grpo.cli.main import main as cli_main
from vlm_grpo.testing import DEFAULT_FAMILY

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
        "model_name_or_path": tiny_model(DEFAULT_FAMILY),
        "dtype": "float32",
        "data_config": str(data),
        "rewards": [{"name": "choice_accuracy", "weight": 1.0}, {"name": "format", "weight": 0.5}],
        "output_dir": str(out),
        "max_steps": 5,  # overridden on the command line below
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 4,
        "learning_rate": 1e-3,
        "gradient_checkpointing": False,  # no bf16 nor use_cpu: a CPU machine turns bf16 off by itself
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    result = vlm_grpo("train", str(tmp_path / "train.yaml"), "--max_steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kernels-community" not in result.stderr
    if not is_torch_bf16_gpu_available():
        assert result.stderr.count("bf16 is off") == 1
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


def test_unknown_command_exits_1():
    result = vlm_grpo("trian")
    assert result.returncode == 1 and "unknown command 'trian'" in result.stderr
    assert "usage: vlm-grpo COMMAND" in result.stderr


@pytest.mark.parametrize("argv", [[], ["train"]], ids=["vlm-grpo", "vlm-grpo train"])
def test_no_arguments_prints_the_usage_and_exits_1(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "usage: vlm-grpo" in err and "bf16" not in err
    if argv:
        assert "usage: vlm-grpo train CONFIG.yaml" in err


@pytest.mark.parametrize("command", ["plot", "samples", "export"])
def test_usage_errors_exit_1_in_every_command(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main([command, "--no_such_flag"])
    assert exc.value.code == 1 and f"vlm-grpo {command}: error:" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--help", "--help-all"])
def test_train_help_shows_config_and_our_options_first(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["train", flag])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: vlm-grpo train CONFIG.yaml")
    ours = [
        "--model_name_or_path",
        "--data_config",
        "--rewards",
        "--freeze_vision_modules",
        "--log_samples_steps",
    ]
    positions = [out.index(flag + " ") for flag in ours]
    assert positions == sorted(positions) and positions[-1] < out.index("--output_dir ")
    assert out.index("--log_samples_steps ") < out.index("--num_generations ")


def test_options_read_from_the_source_equal_the_parser():
    """`train --help` and the key and flag checks read the options from the source files (`option_help`): the same
    names, flags, help, own options and (where the source gives a literal) defaults as the real parser."""
    from vlm_grpo.cli.option_help import read_options
    from vlm_grpo.cli.options import build_parser, parser_options

    read, live = read_options(), parser_options(build_parser())
    assert read is not None
    assert {k: read[k] for k in ("names", "flags", "help", "own")} == {
        k: live[k] for k in ("names", "flags", "help", "own")
    }
    assert read["defaults"] == {name: live["defaults"][name] for name in read["defaults"]}
    assert len(read["defaults"]) > 0.9 * len(read["names"])


HEAVY = ("torch", "transformers", "trl", "datasets", "peft", "accelerate", "matplotlib")
CHEAP_PATHS = {
    "train --help": ["train", "--help"],
    "train --help-all": ["train", "--help-all"],
    "train: missing config": ["train", "nope.yaml"],
    "train: unknown key": ["train", "{bad_yaml}"],
    "train: missing data config": ["train", "{no_data_yaml}"],
    "train: missing model folder": ["train", "{no_data_yaml}", "--model_name_or_path", "./nope"],
    "eval --help": ["eval", "--help"],
    "eval: missing data": ["eval", "--model", "runs/nope", "--data", "nope.yaml"],
    "eval: missing model": ["eval", "--model", "nope", "--data", "{no_data_yaml}"],
    "demo --help": ["demo", "--help"],
    "demo: unknown task": ["demo", "--task", "nope"],
    "plot --help": ["plot", "--help"],
    "plot: missing run": ["plot", "nope"],
    "samples --help": ["samples", "--help"],
    "samples: missing run": ["samples", "nope"],
    "export --help": ["export", "--help"],
    "export: missing adapter": ["export", "--model", "m", "--adapter", "nope", "--out", "o"],
    "plan --help": ["plan", "--help"],
    "plan: missing config": ["plan", "nope.yaml"],
    "plan: unknown key": ["plan", "{bad_yaml}"],
    "tiny-model --help": ["tiny-model", "--help"],
    "tiny-model: unknown family": ["tiny-model", "qwen9", "out"],
    "tiny-model: bad hidden size": ["tiny-model", "qwen2_vl", "out", "--hidden_size", "30"],
}
"""Each command's `--help` and one input error (two for train, eval and plan): what must come back in a second."""


@pytest.mark.parametrize("args", CHEAP_PATHS.values(), ids=CHEAP_PATHS.keys())
def test_help_and_input_errors_import_nothing_heavy(args, tmp_path):
    """Run in a fresh interpreter (and a fresh cache folder), the command answers without importing any of `HEAVY`:
    `--help` exits 0, an input error exits 1 with its one line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: runs/tiny\ndata_config: data.yaml\nlearnin_rate: 0.1\n")
    no_data = tmp_path / "no_data.yaml"
    no_data.write_text(f"model_name_or_path: runs/tiny\ndata_config: {tmp_path / 'none.yaml'}\n")
    argv = [a.format(bad_yaml=bad, no_data_yaml=no_data) for a in args]
    probe = (
        "import sys\nfrom vlm_grpo.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as exit:\n"
        "    code = exit.code\n"
        f"print('exit', code, 'heavy', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", probe, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    help_ = "--help" in args or "--help-all" in args
    assert result.stderr.strip().endswith(f"exit {0 if help_ else 1} heavy []"), result.stderr[-3000:]
    if not help_:
        assert f"vlm-grpo {args[0]}: error: " in result.stderr and "Traceback" not in result.stderr


def test_import_prints_no_kernels_notice():
    result = subprocess.run(
        [sys.executable, "-c", "import vlm_grpo.train"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0 and "kernels" not in result.stderr, result.stderr[-2000:]


def test_demo_smoke_run(tmp_path):
    result = run_demo(str(tmp_path), max_steps=2)
    for name in ("eval_before.json", "eval_after.json"):
        report = json.loads((tmp_path / name).read_text())
        assert set(report) == {"accuracy", "n", "rewards"} and report["n"] == 64
    assert result["after"]["accuracy"] == json.loads((tmp_path / "eval_after.json").read_text())["accuracy"]
    assert (tmp_path / "model" / "model.safetensors").exists()
    again = run_demo(str(tmp_path / "again"), max_steps=2)  # the same seed: the same scores, the same weights
    for stage in ("before", "after"):
        assert again[stage]["accuracy"] == result[stage]["accuracy"]
        assert again[stage]["rewards"] == result[stage]["rewards"]
    from safetensors.torch import load_file

    a, b = (
        load_file(str(folder / "model" / "model.safetensors")) for folder in (tmp_path, tmp_path / "again")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
