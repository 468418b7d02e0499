"""docs/tools.md's examples run as written.

The page marks each Python block it runs with a `<!-- runnable -->` line right above the fence. The test runs those
blocks in order, in one namespace (a later block uses what an earlier one defined, as a reader would), in a folder
that holds the data configs the page reads: `my_data.yaml` and `warm.yaml`, a few rows each, every row an image and a
question. Two substitutions keep the run offline and short (seconds):

- the Hub model the page names (`MODEL`) is replaced, in the blocks' text, by the folder of a tiny tool-calling model
  built with `vlm_grpo.testing` (`a_family_with(tool_calls=True)`);
- `vlm_grpo.VLMGRPOConfig` is wrapped so that the page's own fields run with tiny sizes (`TINY`: 2 steps of 4
  completions of at most 48 tokens, on the CPU, in float32); the page's other fields are kept.

Everything else runs for real: the environment's `reset` on the data's rows, its tool, the warm start, the trainers
and their steps.
"""

from __future__ import annotations

import json
import re
from itertools import groupby
from pathlib import Path

import pytest
import torch
from conftest import square_image
from PIL import Image
from safetensors.torch import load_file
from test_tools import call_text
from transformers import AutoProcessor, GenerationConfig

import vlm_grpo
from vlm_grpo import VLMGRPOConfig
from vlm_grpo.data import load_data_config
from vlm_grpo.demos.multi_turn import supervised_row, tool_conversations
from vlm_grpo.runtime.signal_watch import SignalWatch
from vlm_grpo.testing import a_family_with, build_tiny_model, families_with

PAGE = Path(__file__).resolve().parents[1] / "docs" / "tools.md"
MODEL = "Qwen/Qwen3-VL-2B-Instruct"
"""The model the page's examples name; the test runs them on a tiny model of a tool-calling family instead."""
TINY = dict(
    max_steps=2,
    per_device_train_batch_size=4,
    num_generations=2,
    max_completion_length=48,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    bf16=False,
    disable_tqdm=True,
    seed=0,
)
COLOURS = ("red", "green", "blue", "yellow")


def runnable_blocks(text: str) -> list[str]:
    """The Python blocks the page marks with `<!-- runnable -->` right above the fence, in order."""
    return re.findall(r"^<!-- runnable -->\n```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def write_rows(folder: Path, name: str, n: int) -> None:
    """`{name}.yaml` and its records: each a 64x48 image (a coloured square on the left) and a colour question."""
    (folder / "images").mkdir(exist_ok=True)
    records = []
    for i in range(n):
        colour = COLOURS[i % len(COLOURS)]
        image = Image.new("RGB", (64, 48), (200, 200, 200))
        image.paste(square_image(colour, 32), (4 * i, 8))
        image.save(folder / "images" / f"{name}_{i}.png")
        records.append(
            {"image": f"images/{name}_{i}.png", "problem": "What color is the square ?", "solution": colour}
        )
    (folder / f"{name}.json").write_text(json.dumps(records))
    (folder / f"{name}.yaml").write_text(f"datasets:\n  - json_path: {name}.json\n")


def test_the_page_marks_its_examples_runnable():
    blocks = runnable_blocks(PAGE.read_text())
    assert len(blocks) == 2
    assert "class ZoomImage" in blocks[0] and "environment_factory=ZoomImage" in blocks[0]
    assert "warm_start_with_tools(" in blocks[1] and 'model="runs/zoom-warm"' in blocks[1]
    assert all(f'"{MODEL}"' in block for block in blocks)  # the name the test substitutes


def test_the_tool_example_and_the_warm_start_run_as_written(tmp_path, monkeypatch):
    model_dir = build_tiny_model(a_family_with(tool_calls=True), tmp_path / "tiny")
    data = tmp_path / "work"
    data.mkdir()
    write_rows(data, "my_data", 4)
    write_rows(data, "warm", 4)
    monkeypatch.chdir(data)
    monkeypatch.setattr(vlm_grpo, "VLMGRPOConfig", lambda **fields: VLMGRPOConfig(**{**fields, **TINY}))
    namespace: dict = {"__name__": "tools_md"}
    blocks = runnable_blocks(PAGE.read_text())
    torch.manual_seed(0)

    exec(
        compile(blocks[0].replace(f'"{MODEL}"', repr(model_dir)), "tools.md: the zoom example", "exec"),
        namespace,
    )
    first = namespace["trainer"]
    assert first.state.global_step == 2
    assert any("rewards/answered_right/mean" in entry for entry in first.state.log_history)
    rows = load_data_config("my_data.yaml")
    # the environment the trainer drew for its rows was reset with one of them: its zoom crops that row's image
    environment = first._environment_pool[None][0]
    row_images = [row["images"][0].tobytes() for row in rows]
    assert environment.image.size == (64, 48) and environment.image.tobytes() in row_images
    environment = namespace["ZoomImage"]()
    environment.reset(**rows[1])
    image, text = environment.zoom(4, 8, 36, 40)
    assert image["image"].size == (448, 448) and text == {"type": "text", "text": "region 4,8,36,40"}
    square = image["image"].getpixel((224, 224))
    assert square[0] < 60 and square[1] > 100  # rows[1]'s green square, enlarged

    exec(
        compile(blocks[1].replace(f'"{MODEL}"', repr(model_dir)), "tools.md: the warm start", "exec"),
        namespace,
    )
    warm = data / "runs" / "zoom-warm"
    before, after = load_file(Path(model_dir) / "model.safetensors"), load_file(warm / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the warm start trained
    second = namespace["trainer"]
    assert second is not first and second.state.global_step == 2
    assert Path(second.model.config._name_or_path).resolve() == warm
    # what the warm start trained on: each row's call, the tool's crop of that row's image, then the row's answer
    warm_rows = namespace["rows"]
    conversations = tool_conversations(
        warm_rows, namespace["calls"], list(warm_rows["solution"]), environment_factory=namespace["ZoomImage"]
    )
    for (messages, images), row in zip(conversations, warm_rows, strict=True):
        call = messages[-3]["tool_calls"][0]["function"]
        assert call == {"name": "zoom", "arguments": {"x1": 16, "y1": 12, "x2": 48, "y2": 36}}
        assert messages[-2]["role"] == "tool" and messages[-2]["content"][0] == {"type": "image"}
        assert messages[-1] == {"role": "assistant", "content": row["solution"]}
        expected = row["images"][0].crop((16, 12, 48, 36)).resize((448, 448))
        assert len(images) == 2 and images[1].tobytes() == expected.tobytes()


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub writes them (lower case, punctuation dropped, spaces as
    hyphens)."""
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_no_tool_call_warning_points_to_the_warm_start_section():
    watch = SignalWatch(steps=1, every=10, samples_hint="runs/x/samples/")
    message = watch.observe(1.0, 0.0, True, 1, tool_call_frequency=0.0)
    linked = re.findall(r"docs/tools\.md#([\w-]+)", message)
    assert linked == ["a-model-that-never-calls-a-tool-warm-start"]
    assert linked[0] in anchors(PAGE.read_text())
    monitoring = (PAGE.parent / "monitoring.md").read_text()
    assert f"(tools.md#{linked[0]})" in monitoring


def test_a_warm_start_call_of_no_tool_names_the_row():
    rows = [{"prompt": [{"role": "user", "content": "Hi"}], "images": [], "solution": "red"}] * 2
    calls = [None, {"name": "rotate", "arguments": {"angle": 90}}]
    with pytest.raises(ValueError, match=r"^row 1: no tool 'rotate' among \['look'\]"):
        tool_conversations(rows, calls, ["red", "red"], tools=[look])
    with pytest.raises(ValueError, match="2 rows, 1 calls and 2 answers"):
        tool_conversations(rows, calls[:1], ["red", "red"], tools=[look])
    plain, called = tool_conversations(
        rows, [None, {"name": "look", "arguments": {"region": 3}}], ["red", "blue"], tools=[look]
    )
    assert plain == ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "red"}], [])
    assert called[0][1:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": {"region": 3}}}]},
        {"role": "tool", "name": "look", "content": "quarter 3"},
        {"role": "assistant", "content": "blue"},
    ]  # fmt: skip


@pytest.mark.parametrize("family", families_with(tool_calls=True))
def test_the_warm_start_trains_the_call_and_the_answer_through_their_ends(tiny_model, family):
    """Each turn's labels end with the token that ends it in a rollout (an eos token of the model): Qwen's
    `<|im_end|>` after the call and the answer; Gemma 4's `<|tool_response>` after the call, `<turn|>` after the
    answer. The newline the template writes after a turn is not trained."""
    path = tiny_model(family)
    processor = AutoProcessor.from_pretrained(path)
    eos = GenerationConfig.from_pretrained(path).eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color ?"}]}],
             "images": [square_image("blue")]}]  # fmt: skip
    ((messages, images),) = tool_conversations(
        rows, [{"name": "look", "arguments": {"region": 2}}], ["red"], tools=[look]
    )
    ids, labels = supervised_row(processor, messages, images, [look])
    trained = [(token, label != -100) for token, label in zip(ids, labels, strict=True)]
    spans = [[token for token, _ in run] for kept, run in groupby(trained, key=lambda t: t[1]) if kept]
    assert len(spans) == 2 and all(span[-1] in eos for span in spans)
    lead, call, _ = call_text(processor, "look", {"region": 2})
    decode = processor.tokenizer.decode
    # (Qwen3.5's turns open with the end of its thinking, after the generation prompt's `<think>` and a newline)
    assert decode(spans[0][:-1]).lstrip() == lead + call and decode(spans[1][:-1]).lstrip() == lead + "red"


def look(region: int) -> str:
    """Describe one quarter (a text tool).

    Args:
        region: the quarter.
    """
    return f"quarter {region}"
