"""A new user's first hour with their own data: a tiny model from the command line (one that vLLM's CPU backend
runs too), a warning when nothing can be learned, and errors that name the real key, record and file."""

from __future__ import annotations

import logging
import re

import pytest
from conftest import color_dataset, grpo_args, write_color_data, write_train_yaml
from test_bad_input import error_line
from transformers import AutoConfig

from vlm_grpo import VLMGRPOTrainer, get_model_family
from vlm_grpo.cli.main import main as cli_main
from vlm_grpo.cli.tiny_model import FAMILY_NAMES
from vlm_grpo.rollout.vllm.payload import VLLM_CPU_HEAD_DIMS
from vlm_grpo.runtime.signal_watch import SignalWatch
from vlm_grpo.testing import DEFAULT_FAMILY, TINY_FAMILIES, a_family_with, tiny_family


def test_tiny_model_command_builds_a_trainable_folder(tmp_path, capsys):
    record = tiny_family(a_family_with(image_rule="grid", besides=[DEFAULT_FAMILY]))
    cli_main(["tiny-model", record.name, str(tmp_path / "tiny"), "--words", "Cola", "Pepsi"])
    assert "--model_name_or_path" in capsys.readouterr().out
    family = get_model_family(str(tmp_path / "tiny"))
    tokenizer = family.load_processor(str(tmp_path / "tiny")).tokenizer
    assert (
        family.model_type == record.model_type
        and tokenizer.convert_tokens_to_ids("Pepsi") != tokenizer.unk_token_id
    )


def test_tiny_model_help_lists_the_families(capsys):
    assert FAMILY_NAMES == TINY_FAMILIES  # the command's own list, read before the builders are imported
    with pytest.raises(SystemExit) as exc:
        cli_main(["tiny-model", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(family in out for family in TINY_FAMILIES)


def test_tiny_model_command_builds_a_model_vllm_cpu_runs(tmp_path, capsys):
    """The README's smoke-run model, by default, has an attention head dim that vLLM's CPU backend runs; a smaller
    one gets a note saying that `use_vllm: true` on a CPU will refuse it."""
    cli_main(["tiny-model", "qwen2_5_vl", str(tmp_path / "tiny")])
    assert "note:" not in capsys.readouterr().out
    text = AutoConfig.from_pretrained(tmp_path / "tiny").get_text_config()
    assert text.hidden_size // text.num_attention_heads in VLLM_CPU_HEAD_DIMS
    cli_main(["tiny-model", "qwen2_5_vl", str(tmp_path / "small"), "--hidden_size", "64"])
    assert "note: use_vllm: true on a CPU will refuse it: " in capsys.readouterr().out


def test_train_refuses_a_model_vllm_cpu_cannot_run_before_it_loads(tiny_model, tmp_path, capsys, monkeypatch):
    from vlm_grpo.models import ModelFamily

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before vLLM's head dims were checked")

    monkeypatch.setattr(ModelFamily, "load_model", never)
    model = tiny_model(DEFAULT_FAMILY)  # head dim 16
    config = write_train_yaml(tmp_path, model, write_color_data(tmp_path / "data"), use_vllm=True)
    line = error_line(capsys, "train", str(config))
    assert (
        f"{model}: vLLM's CPU backend cannot run attention head dim 16" in line and "use_vllm: false" in line
    )


def test_tiny_model_refuses_an_unknown_family(tmp_path, capsys):
    line = error_line(capsys, "tiny-model", "qwen9", str(tmp_path / "tiny"))
    assert "unknown family 'qwen9'" in line and DEFAULT_FAMILY in line


def constant_reward(completions, **kwargs) -> list[float]:
    """A reward that ignores the completion: nothing can be learned from it."""
    return [0.0] * len(completions)


def test_no_learning_signal_is_said_once_then_every_n(tiny_model, tmp_path, caplog):
    args = grpo_args(tmp_path, max_steps=7, no_signal_warning_steps=3, no_signal_warning_every=2)
    trainer = VLMGRPOTrainer(
        tiny_model(DEFAULT_FAMILY), constant_reward, args=args, train_dataset=color_dataset(8)
    )
    with caplog.at_level(logging.WARNING, logger="vlm_grpo.trainer.trainer"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "No learning signal" in r.getMessage()]
    assert len(warnings) == 3  # after rollouts 3, 5 and 7
    assert "3 rollouts in a row (up to step 3)" in warnings[0] and "every reward was 0" in warnings[0]
    assert "samples" in warnings[0] and "format" in warnings[0]


def terminal_lines(text: str) -> list[str]:
    """The lines a terminal shows for `text`: a carriage return goes back to the first column of its line."""
    lines = []
    for raw in text.split("\n"):
        screen = ""
        for part in raw.split("\r"):
            screen = part + screen[len(part) :]
        lines.append(screen.rstrip())
    return lines


def on_a_terminal(*args: str, timeout: float = 300) -> tuple[int, str]:
    """Run `vlm-grpo ARGS` with stdout and stderr on a pseudo-terminal 120 columns wide, as in an interactive shell;
    returns the exit status and what the terminal received."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import sys
    import termios
    import time

    from test_cli import ROOT

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vlm_grpo", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    os.close(follower)
    received, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 1.0)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # every writer closed the terminal
                break
            if not chunk:
                break
            received.append(chunk)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(received).decode(errors="replace")


def test_no_signal_warning_stands_on_its_own_line_under_the_progress_bar(tiny_model, tmp_path):
    data = write_color_data(tmp_path / "data")
    config = write_train_yaml(
        tmp_path,
        tiny_model(DEFAULT_FAMILY),
        data,
        rewards=["format"],  # 4 tokens never make <think>...</think><answer>...</answer>: every reward is 0
        no_signal_warning_steps=1,
        no_signal_warning_every=1,
    )
    status, output = on_a_terminal("train", str(config))
    assert status == 0, output[-3000:]
    shown = terminal_lines(output)
    assert any("%|" in line and "2/2" in line for line in shown)  # the progress bar was drawn, to its end
    warnings = [line for line in shown if "No learning signal" in line]
    assert len(warnings) == 2  # after rollouts 1 and 2
    record = re.compile(r"\d{4}-\d\d-\d\d [\d:,]+ WARNING vlm_grpo[\w.]*: No learning signal for")
    for line in warnings:
        assert record.match(line), line  # from the line's start: nothing of the bar before it


def test_signal_watch_resets_when_groups_differ():
    watch = SignalWatch(steps=2, every=10, samples_hint="runs/x/samples/")
    assert watch.observe(1.0, 0.5, False, 1) is None
    assert watch.observe(0.5, 0.5, False, 2) is None  # one group with a spread: the count starts over
    assert watch.observe(1.0, 0.5, False, 3) is None
    message = watch.observe(1.0, 0.5, False, 4)
    assert "2 rollouts in a row" in message and "the same reward (mean 0.5)" in message
    assert SignalWatch(steps=0, every=1, samples_hint="").observe(1.0, 0.0, True, 1) is None  # off


def test_no_signal_warning_says_when_no_completion_called_a_tool():
    """With tools on and not one call in the rollouts without signal, the warning says so and points to the warm
    start of docs/tools.md; one call among them, or tools off, gives the usual causes."""
    never = SignalWatch(steps=2, every=10, samples_hint="runs/x/samples/")
    assert never.observe(1.0, 0.0, True, 1, tool_call_frequency=0.0) is None
    message = never.observe(1.0, 0.0, True, 2, tool_call_frequency=0.0)
    assert "No completion called a tool in these rollouts" in message and "docs/tools.md" in message
    assert "warm" in message and "runs/x/samples/" in message and "format a reward expects" not in message

    once = SignalWatch(steps=2, every=10, samples_hint="runs/x/samples/")
    assert once.observe(1.0, 0.0, True, 1, tool_call_frequency=0.25) is None  # a call, still no signal
    message = once.observe(1.0, 0.0, True, 2, tool_call_frequency=0.0)
    assert "called a tool" not in message and "format a reward expects" in message

    after_signal = SignalWatch(steps=2, every=10, samples_hint="")
    after_signal.observe(1.0, 0.0, True, 1, tool_call_frequency=0.5)
    after_signal.observe(0.5, 0.3, False, 2, tool_call_frequency=0.5)  # a signal: the count starts over
    after_signal.observe(1.0, 0.0, True, 3, tool_call_frequency=0.0)
    assert "No completion called a tool" in after_signal.observe(1.0, 0.0, True, 4, tool_call_frequency=0.0)

    off = SignalWatch(steps=1, every=10, samples_hint="")
    assert "called a tool" not in off.observe(1.0, 0.0, True, 1)  # no tools: the message is unchanged


def test_paged_generation_is_refused_in_its_own_words(tmp_path, recwarn):
    from vlm_grpo.errors import VLMGRPOError

    with pytest.raises(VLMGRPOError, match="^use_transformers_paged "):
        grpo_args(tmp_path, use_transformers_paged=True)
    assert not [w for w in recwarn if "use_transformers_paged" in str(w.message)]


def test_misspelt_reward_gets_a_suggestion_and_the_file(tiny_model, tmp_path, capsys):
    data = write_color_data(tmp_path / "data")
    config = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, rewards=["iuo"])
    line = error_line(capsys, "train", str(config))
    assert str(config) in line and "'iuo' (did you mean 'iou'?)" in line


def test_missing_data_config_names_the_training_yaml(tiny_model, tmp_path, capsys):
    config = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), tmp_path / "nope.yaml")
    line = error_line(capsys, "train", str(config))
    assert f"{config}: data_config" in line and "nope.yaml not found" in line


def test_top_level_prompt_template_error_says_top_level(tmp_path):
    from vlm_grpo.data import DataConfigError, load_data_config

    data = write_color_data(tmp_path / "data")
    data.write_text("prompt_template: '{problem} {nothing}'\n" + data.read_text())
    with pytest.raises(DataConfigError) as error:
        load_data_config(data)
    message = str(error.value)
    assert "the top-level prompt_template" in message and "datasets entry" not in message
    assert "record 1," in message  # the first record, counted from 1


def test_resume_says_which_checkpoint(tiny_model, tmp_path, caplog):
    from vlm_grpo.train import main as train_main

    data = write_color_data(tmp_path / "data")
    config = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), data, save_strategy="steps", save_steps=1)
    train_main([str(config)])
    with caplog.at_level(logging.INFO, logger="vlm_grpo"):
        train_main([str(config), "--max_steps", "3", "--resume_from_checkpoint", "true"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed from")]
    assert lines == [f"resumed from {tmp_path / 'run' / 'checkpoint-2'} at step 2"]


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    """`(run folder, data config)` of a 1-step LoRA training run on the colour data."""
    from vlm_grpo.train import main as train_main

    folder = tmp_path_factory.mktemp("lora")
    data = write_color_data(folder / "data")
    train_main([str(write_train_yaml(folder, tiny_model(DEFAULT_FAMILY), data, use_peft=True, max_steps=1))])
    return folder / "run", data


def test_eval_takes_a_lora_run_folder(lora_run, tmp_path):
    import json

    run, data = lora_run
    assert (run / "adapter_config.json").is_file() and not (run / "config.json").is_file()
    report = tmp_path / "eval.json"
    cli_main(["eval", "--model", str(run), "--data", str(data), "--rewards", "{name: accuracy, default: choice}",
              "format", "--max_new_tokens", "2", "--output", str(report)])  # fmt: skip
    assert set(json.loads(report.read_text())["rewards"]) == {"accuracy", "format"}


def test_eval_checks_every_input_before_the_model_loads(lora_run, tmp_path, capsys, monkeypatch):
    from vlm_grpo.models import ModelFamily

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(ModelFamily, "load_model", never)
    run, data = lora_run
    line = error_line(capsys, "eval", "--model", str(run), "--data", str(tmp_path / "nope.yaml"))
    assert "nope.yaml not found" in line
    line = error_line(capsys, "eval", "--model", str(run), "--data", str(data))  # accuracy, no method
    assert "accu_reward_method" in line and '--rewards "{name: accuracy, default: iou}"' in line
    line = error_line(capsys, "eval", "--model", str(run), "--data", str(data), "--rewards", "iuo")
    assert "did you mean 'iou'" in line


def test_eval_names_the_flags_when_the_base_model_is_gone(lora_run, tmp_path, capsys):
    import json
    import shutil

    run, data = lora_run
    moved = tmp_path / "adapter"
    shutil.copytree(run, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    line = error_line(capsys, "eval", "--model", str(moved), "--data", str(data))
    assert f"--model BASE_MODEL_FOLDER --adapter {moved}" in line


def test_compact_line_reads_the_metrics_of_a_step():
    from vlm_grpo.runtime.console import compact_line

    logs = {"loss": 0.1, "reward": 0.4213, "reward_std": 0.31, "kl": 0.00123, "completions/mean_length": 18.46,
            "step_time": 2.07, "rewards/iou/mean": 0.4}  # fmt: skip
    assert (
        compact_line(logs, 3, 100)
        == "step 3/100 | reward 0.421 ± 0.31 | kl 0.00123 | length 18.5 | 2.1 s/step"
    )
    assert (
        compact_line({"eval_reward": 0.5, "eval_reward_std": 0.1}, 3, 100) == "eval step 3 | reward 0.5 ± 0.1"
    )
    assert compact_line({"train_runtime": 3.0}, 3, 100) is None


def test_compact_line_shows_tool_calls_and_failures():
    from vlm_grpo.runtime.console import compact_line

    logs = {"reward": 0.5, "reward_std": 0.25, "completions/mean_length": 30.0, "step_time": 1.3,
            "tools/call_frequency": 0.75, "tools/failure_frequency": 0.25}  # fmt: skip
    assert (
        compact_line(logs, 4, 10)
        == "step 4/10 | reward 0.5 ± 0.25 | length 30 | tools 0.75 calls/completion, 25% failed | 1.3 s/step"
    )
    evaluation = {"eval_reward": 1.0, "eval_tools/call_frequency": 1.0, "eval_tools/failure_frequency": 0.0}
    assert compact_line(evaluation, 4, 10) == "eval step 4 | reward 1 | tools 1 calls/completion, 0% failed"
    assert "tools" not in compact_line({"reward": 0.5}, 4, 10)  # tools off: no tools field


def test_datasets_bars_are_off_when_the_output_is_piped():
    """Piped (not a terminal), the command line turns the datasets library's progress bars off, as the training bar."""
    import os
    import subprocess
    import sys

    probe = (
        "from vlm_grpo.runtime.notices import quiet_third_party\nquiet_third_party()\n"
        "from datasets.utils import are_progress_bars_disabled\nprint(are_progress_bars_disabled())"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_DISABLE_PROGRESS_BARS"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.stdout.strip() == "True", result.stderr[-2000:]


def test_missing_model_folder_is_named_in_a_second_before_the_data_loads(tmp_path):
    """`model_name_or_path: runs/tiny-nope` with a `runs/` folder here (the README's smoke-run layout), or a path
    starting with `.` on the command line: one line naming the path and the key, exit status 1, within seconds, and
    before the data loads (the data config names an image that is gone, which loading would report instead)."""
    import os
    import subprocess
    import sys
    import time

    data = write_color_data(tmp_path / "data")
    (tmp_path / "data" / "images" / "0.png").unlink()
    (tmp_path / "runs").mkdir()
    write_train_yaml(tmp_path, "runs/tiny-nope", data)
    cases = {
        "train.yaml: model_name_or_path: model folder runs/tiny-nope not found": [],
        "--model_name_or_path: model folder ./nope not found": ["--model_name_or_path", "./nope"],
    }
    for expected, flags in cases.items():
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "vlm_grpo", "train", "train.yaml", *flags],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=300,
        )
        seconds = time.perf_counter() - start
        assert result.returncode == 1 and seconds < 10, (seconds, result.stderr[-3000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"vlm-grpo train: error: {expected}"), lines
        assert "fix the path, or give a hub id as owner/name" in lines[0]


def test_a_model_path_is_a_hub_id_only_as_owner_name(tmp_path, monkeypatch):
    """One rule for `vlm-grpo train` and `vlm-grpo eval`: `owner/name` whose owner is no folder here is a hub id (left
    to `from_pretrained`); any other missing path is reported."""
    from vlm_grpo.cli.evaluate import check_model_path, is_hub_id
    from vlm_grpo.errors import VLMGRPOError

    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen2.5-VL-3B-Instruct") and is_hub_id("runs/tiny-nope")
    for path in ("./runs/x", "/abs/model", "~/models/x", "a/b/c", "nope", "a\\b", "runs/"):
        assert not is_hub_id(path), path
    (tmp_path / "runs").mkdir()
    assert not is_hub_id("runs/tiny-nope")  # `runs` is a folder here: a local path
    check_model_path("Qwen/Qwen2.5-VL-3B-Instruct", "--model")  # left to from_pretrained
    with pytest.raises(VLMGRPOError, match=r"^--model: model folder runs/tiny-nope not found \(relative to"):
        check_model_path("runs/tiny-nope", "--model")
    with pytest.raises(VLMGRPOError, match=r"^t.yaml: model_name_or_path: runs holds no config.json"):
        check_model_path("runs", "t.yaml: model_name_or_path")


def test_train_command_is_quiet_and_ends_with_a_summary(tiny_model, tmp_path):
    from test_cli import vlm_grpo

    data = write_color_data(tmp_path / "data")
    config = write_train_yaml(
        tmp_path,
        tiny_model(DEFAULT_FAMILY),
        data,
        gradient_checkpointing=True,
        save_strategy="steps",
        save_steps=1,
    )
    result = vlm_grpo("train", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [line.split(" | ")[0] for line in lines if line.startswith("step ")] == ["step 1/2", "step 2/2"]
    # piped, not a terminal: no progress bar, whose redraws would land between the step lines of a log
    assert "\r" not in result.stdout + result.stderr and "it/s]" not in result.stderr
    assert (
        "{'loss'" not in result.stdout and "Warning" not in result.stderr and "use_cache" not in result.stderr
    )
    summary = result.stdout[result.stdout.index("vlm-grpo train: done in") :]
    assert f"model saved to {tmp_path / 'run'}" in summary and "latest checkpoint-2" in summary
    assert "reward: final" in summary and "best" in summary


def test_typos_are_refused_before_any_heavy_import(tiny_model, tmp_path):
    """A bad key is refused without importing TRL or torch: the options are read from their source files."""
    import subprocess
    import sys

    config = write_train_yaml(tmp_path, tiny_model(DEFAULT_FAMILY), write_color_data(tmp_path / "data"))
    config.write_text(config.read_text().replace("learning_rate", "learnin_rate"))
    probe = (
        "import sys\nfrom vlm_grpo.train import parse_args\nfrom vlm_grpo.errors import VLMGRPOError\n"
        f"try:\n    parse_args([{str(config)!r}])\nexcept VLMGRPOError as error:\n    print(error)\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "'learnin_rate' (did you mean 'learning_rate'?)" in result.stdout, result.stderr[-2000:]
    assert result.stdout.strip().endswith("[]")
