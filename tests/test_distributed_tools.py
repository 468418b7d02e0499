"""Tools under ZeRO-3 on 2 processes whose tool results differ: real runs with `accelerate launch`.

Under ZeRO-3 every process gathers each module's parameter shards collectively, so every collective of the tool
loop, the vision tower and the log-prob passes must run as many times on every process, whatever each process's
rows hold. One run of 3 steps puts, on each step, other tool results on the two processes (rows are not shuffled:
prompt `i` goes to process `i % 2` at step `i // 2 + 1`):

- step 1: process 0's rows call `zoom`, which returns an image; process 1's rows call no tool;
- step 2: process 0's rows get an image back, process 1's rows call `count`, which returns text;
- step 3: both processes' rows call `zoom`; on process 1 it returns an image to one row and text to the other.

The tiny tool-calling model is random: `generation_kwargs`' `sequence_bias` writes the call, keyed on the prompt's
last word (`zoom`, `count` or `plain`) so that only the rows meant to call do (every entry of the bias starts with the
prompt's tail, so a call token the model happens to sample elsewhere is not completed into a call).

Each run is checked as `tests/test_distributed.py` checks its runs (return code, finite losses, both processes'
rewards at every step, the checkpoint), plus: what each process's rows got back at each step (from the reward's
probe), and the `tools/*` metrics. Stock TRL 1.16 trains the image-versus-text step but not the no-call step (its tool
loop gathers the model for each later turn on the processes that still have rows only); this project's loop runs
every turn on every process.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from dist_helpers import (
    BIN,
    build_deepspeed_cpu_ops,
    count,
    free_port,
    launch,
    launch_env,
    load_state,
    write_config,
    zoom,
)
from PIL import Image
from transformers import AutoConfig

from vlm_grpo.models import get_model_family
from vlm_grpo.testing import a_family_with

pytestmark = pytest.mark.distributed

TOOLS_FAMILY = a_family_with(tool_calls=True)
WORDS = ("zoom", "plain", "zoom", "count", "zoom", "zoom")  # each prompt's last word, in data order
CALLS = {"zoom": ("zoom", {"region": 2}), "count": ("count", {"word": "red"})}


@pytest.fixture(scope="module")
def deepspeed_cpu_ops():
    result = build_deepspeed_cpu_ops()
    assert result.returncode == 0, result.stdout[-3000:]


def write_tool_data(folder: Path) -> Path:
    """One record per entry of `WORDS`, each a 56x56 square asking a question that ends on that word."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i, word in enumerate(WORDS):
        image = Image.new("RGB", (56, 56), (128, 128, 128))
        image.paste(Image.new("RGB", (28, 28), (220, 30, 30)), (14, 14))
        image.save(folder / "images" / f"{i}.png")
        records.append(
            {"image": f"{i}.png", "problem": f"What color is the square ? {word}", "solution": "red", "id": i}
        )
    (folder / "train.json").write_text(json.dumps(records))
    config = folder / "data.yaml"
    config.write_text("image_root: images/\ndatasets:\n  - json_path: train.json\n")
    return config


def call_bias(processor, tools: list, word: str, call: tuple[str, dict]) -> list:
    """`sequence_bias` entries that make a row whose prompt ends on `word` write `call` and end its turn."""
    from test_tools import call_text  # the call as the family's chat template writes it

    tokenizer = processor.tokenizer
    messages = [{"role": "user", "content": [{"type": "text", "text": f"What color is the square ? {word}"}]}]
    prompt = processor.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    tail = tokenizer(prompt, add_special_tokens=False)["input_ids"][
        -6:
    ]  # the word, then the assistant header
    lead, text, end = call_text(processor, *call)
    ids = tokenizer(lead + text, add_special_tokens=False)["input_ids"] + [
        tokenizer.convert_tokens_to_ids(end)
    ]
    return [[tail + ids[: k + 1], 40.0] for k in range(len(ids))]


def tools_run(tmp_path: Path, model: str, **overrides) -> tuple:
    """Launch the 3-step run; returns `(run, output folder, {rank: [probe records]})`."""
    family = get_model_family(model)
    processor = family.load_processor(model)
    placeholders = family.placeholder_token_ids(processor, AutoConfig.from_pretrained(model))
    bias = [
        entry for word, call in CALLS.items() for entry in call_bias(processor, [zoom, count], word, call)
    ]
    data = write_tool_data(tmp_path / "data")
    config = write_config(
        tmp_path, model, data,
        rewards=["dist_helpers.tool_probe_reward"],
        tools=["dist_helpers.zoom", "dist_helpers.count"],
        max_steps=3, save_steps=3, max_completion_length=96, max_tool_calling_iterations=1,
        generation_kwargs={"suppress_tokens": placeholders, "sequence_bias": bias},
        **overrides,
    )  # fmt: skip
    probe = tmp_path / "probe"
    probe.mkdir()
    cmd = [
        str(BIN / "accelerate"), "launch", "--config_file", "local_scripts/accelerate_zero3.yaml",
        "--num_processes", "2", "--main_process_port", str(free_port()), "-m", "vlm_grpo.train", str(config),
    ]  # fmt: skip
    run = launch(cmd, launch_env(probe, PYTHONFAULTHANDLER="1"), tmp_path / "launch.log", timeout=420)
    records = {}
    for path in sorted(probe.glob("tools_rank*.jsonl")):
        records[int(path.stem[len("tools_rank") :])] = [json.loads(x) for x in path.read_text().splitlines()]
    return run, tmp_path / "run", records


@pytest.mark.parametrize("freeze_vision", [False, True], ids=["vision-trained", "vision-frozen"])
@pytest.mark.parametrize("share", ["true", "false"], ids=["shared", "full-rows"])
def test_zero3_ranks_whose_tool_results_differ(tiny_model, tmp_path, deepspeed_cpu_ops, freeze_vision, share):
    """Image beside no call, image beside text, and a different number of rows with tool images: the run trains."""
    model = tiny_model(TOOLS_FAMILY)
    run, out, probe = tools_run(
        tmp_path, model, freeze_vision_modules=freeze_vision, share_prompt_prefix=share
    )
    assert not run.timed_out, "the run hung (killed at the timeout)\n" + run.tail()
    assert "terminate called" not in run.log, run.tail()
    assert run.returncode == 0, run.tail()
    state = load_state(out)
    assert state["global_step"] == 3, run.tail()
    steps = [e for e in state["log_history"] if "loss" in e]
    assert len(steps) == 3 and all(math.isfinite(e["loss"]) for e in steps), steps
    # what each process's rows got back, step by step: (calls, images) per row
    got = {rank: [[tuple(row) for row in r["rows"]] for r in records] for rank, records in probe.items()}
    assert got[0] == [[(1, 1), (1, 1)]] * 3, got
    assert got[1][0] == [(0, 0), (0, 0)] and got[1][1] == [(1, 0), (1, 0)], got
    assert sorted(got[1][2]) == [(1, 0), (1, 1)], got  # one row's zoom returned an image, the other's text
    assert [e["tools/call_frequency"] for e in steps] == [0.5, 1.0, 1.0], steps
    assert os.path.isfile(out / "checkpoint-3" / "model.safetensors")
