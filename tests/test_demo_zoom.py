"""The zoom demo: its scenes hide the patterns from the shown image and show them through the tool, its reward reads
the tool call, its warm start trains exactly the assistant turns, and the demo runs end to end with tool calls and
tool images in GRPO's completions; the command line takes `environment_factory` and `tools` by dotted path."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image, ImageChops

from vlm_grpo.cli.demo import main as demo_main
from vlm_grpo.data import load_data_config
from vlm_grpo.demos import zoom
from vlm_grpo.demos.multi_turn import parse_call, supervised_row, tool_conversations
from vlm_grpo.demos.zoom_scene import (
    PATTERNS,
    QUARTER,
    SCENE,
    SHOWN,
    ZoomScene,
    draw_scene,
    shown,
    write_data,
    zoomed_right,
)
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.train import ScriptArguments, build_trainer, import_callable

SMALL = {"n_train": 16, "n_warm": 12, "n_eval": 8}


def _scene(patterns, seed=0):
    return draw_scene(list(patterns), random.Random(seed))


def test_the_shown_image_is_the_same_for_every_pattern_and_the_zoom_tells_them_apart(tmp_path):
    orders = [
        ["rows", "columns", "checks", "rows"],
        ["checks", "rows", "columns", "columns"],
        ["columns"] * 4,
    ]
    scenes = [_scene(order) for order in orders]  # the same backgrounds and places, other patterns
    views = [shown(s) for s in scenes]
    assert views[0].size == (SHOWN, SHOWN) and scenes[0].size == (SCENE, SCENE)
    for view in views[1:]:
        assert ImageChops.difference(views[0], view).getbbox() is None  # identical, pixel for pixel
    for scene in scenes[1:]:
        assert ImageChops.difference(scenes[0], scene).getbbox() is not None
    path = tmp_path / "scene.png"
    scenes[0].save(path)
    environment = ZoomScene()
    assert environment.reset(scene=str(path), solution="rows") is None
    crops = [environment.zoom(region)[0]["image"] for region in (1, 2, 3, 4)]
    assert all(c.size == (QUARTER, QUARTER) for c in crops)
    assert len({c.tobytes() for c in crops[:3]}) == 3  # three different patterns, at full resolution
    with pytest.raises(ValueError, match="region must be 1, 2, 3 or 4"):
        environment.zoom(5)


def test_zoomed_right_reads_the_first_call_of_each_completion():
    def called(region, name="zoom"):
        return [
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {"region": region}}}]},
            {"role": "tool", "name": name, "content": [{"type": "image"}]},
            {"role": "assistant", "content": "rows"},
        ]  # fmt: skip

    completions = [
        called(3),
        called(2),
        called(3, name="crop"),
        [{"role": "assistant", "content": "rows"}],
        [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "zoom", "arguments": 3}}]}],
        [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "zoom", "arguments": '{"region": 3}'}}]}],
    ]  # fmt: skip
    assert zoomed_right(completions, region=[3] * 6) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_parse_call_finds_the_json_between_the_tags():
    assert parse_call('<tool_call>\n{"name": "zoom", "arguments": {"region": 2}}\n</tool_call>') == {
        "name": "zoom",
        "arguments": {"region": 2},
    }
    assert parse_call("rows") is None
    assert parse_call('<tool_call>\n{"name": "zoom", "arguments": 2}\n</tool_call>') is None
    assert parse_call("<tool_call>\n{not json}\n</tool_call>") is None


def test_each_warm_start_prompt_is_answered_once_with_every_pattern(tmp_path):
    data = write_data(tmp_path / "data", **SMALL)
    rows = load_data_config(data["warm"], seed=0)
    answers: dict[tuple[str, str], list[str]] = {}
    for row, answer in zip(rows, data["warm_answers"], strict=True):
        answers.setdefault((row["scene"], row["problem"]), []).append(answer)
    assert len(PATTERNS) == 3 and len(answers) == SMALL["n_warm"] // 3  # three records per scene and question
    assert all(sorted(given) == sorted(PATTERNS) for given in answers.values())  # no answer tied to an image
    assert set(rows["region"]) == {1, 2, 3, 4}  # every quarter is asked about
    train = load_data_config(data["train"], seed=0)
    assert len(set(train["scene"])) == SMALL["n_train"]  # GRPO's records each have their own scene
    # each pattern is the answer equally often: an answer that ignores the image scores a third
    for split in ("train", "eval"):
        counts = Counter(load_data_config(data[split], seed=0)["solution"])
        assert set(counts) == set(PATTERNS) and max(counts.values()) - min(counts.values()) <= 1


def test_warm_start_rows_train_the_assistant_turns_only(tmp_path):
    from transformers import AutoProcessor

    data = write_data(tmp_path / "data", **SMALL)
    model_dir = zoom.demo_model(tmp_path / "model", seed=0)
    processor = AutoProcessor.from_pretrained(model_dir)
    rows = load_data_config(data["warm"], seed=0)
    answers = ["checks"] * len(rows)
    (messages, images), *_ = tool_conversations(
        rows, zoom.warm_calls(rows), answers, environment_factory=ZoomScene
    )
    assert len(images) == 2 and images[1].size == (QUARTER, QUARTER)
    assert images[1].tobytes() == _row_quarter(rows[0]).tobytes()  # the tool ran on the row's own scene
    ids, labels = supervised_row(processor, messages, images, [ZoomScene().zoom])
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    text = processor.tokenizer.decode(trained)
    region = rows[0]["region"]
    assert text == (
        f'<tool_call>\n{{"name": "zoom", "arguments": {{"region": {region}}}}}\n</tool_call><|im_end|>checks<|im_end|>'
    )
    assert processor.image_token_id not in trained  # the tool's image is read, not trained
    without = tool_conversations(rows, zoom.warm_calls(rows, tool=False), ["rows"] * len(rows))[0]
    ids, labels = supervised_row(processor, *without, [])
    assert processor.tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != -100]) == (
        "rows<|im_end|>"
    )


def _row_quarter(row):
    """The quarter of the row's full-resolution scene that its question asks about."""
    x, y = (row["region"] - 1) % 2 * QUARTER, (row["region"] - 1) // 2 * QUARTER
    with Image.open(row["scene"]) as scene:
        return scene.convert("RGB").crop((x, y, x + QUARTER, y + QUARTER))


def test_the_verdict_says_which_run_the_documented_figure_is_for():
    default = zoom.verdict(0.5, seed=0, tool=True)
    assert default == (
        f"documented for seed 0: {zoom.DOCUMENTED[0]:.3f} held out after {zoom.MAX_STEPS} steps (the default run); "
        "target >= 0.8: missed"
    )
    assert zoom.verdict(0.9, seed=0, tool=True).endswith("target >= 0.8: met")
    short = zoom.verdict(0.5, seed=1, tool=True, max_steps=2)
    assert "missed" not in short
    assert short == (
        f"documented for seed 1: {zoom.DOCUMENTED[1]:.3f} held out after {zoom.MAX_STEPS} steps (the default run); "
        f"this run trained 2 steps; target >= 0.8: not reached in 2 steps (the target is for the default run's "
        f"{zoom.MAX_STEPS})"
    )
    assert zoom.verdict(0.9, seed=1, tool=True, max_steps=2).endswith("target >= 0.8: met")
    assert zoom.verdict(0.5, seed=0, tool=True, max_steps=zoom.MAX_STEPS + 10).endswith(
        "target >= 0.8: missed"
    )
    assert "documented" not in zoom.verdict(0.5, seed=len(zoom.DOCUMENTED), tool=True, max_steps=2)
    assert "chance is 0.333" in zoom.verdict(0.25, seed=0, tool=False, max_steps=2)


def test_zoom_demo_runs_with_tool_calls_and_tool_images(tmp_path):
    small = dict(
        max_steps=2, logging_steps=1, log_samples_steps=1, per_device_train_batch_size=16, warm_epochs=32,
        # the demo's own warm-start records (drawn after its 512 GRPO records): they teach the call every time
        data_sizes={**SMALL, "n_train": 512, "n_warm": 96},
    )  # fmt: skip
    result = zoom.run_zoom(str(tmp_path / "run"), **small)
    for stage in ("start", "warm", "after"):
        report = json.loads((tmp_path / "run" / f"eval_{stage}.json").read_text())
        assert report["n"] == SMALL["n_eval"] and report["accuracy"] == result[stage]["accuracy"]
    assert result["start"]["call_rate"] == 0.0  # a random model writes no call
    warm = result[
        "warm"
    ]  # the warm start taught the call; the evaluation ran it and answered after its image
    assert warm["call_rate"] == 1.0 and warm["zoomed_right"] == 1.0
    assert all(
        a["answer"] in PATTERNS
        for a in json.loads((tmp_path / "run" / "eval_warm.json").read_text())["answers"]
    )
    records = [
        json.loads(line)
        for line in (tmp_path / "run" / "model" / "samples" / "step_000001.jsonl").read_text().splitlines()
    ]
    completions = [c for r in records for c in r["completions"]]
    assert any("zoom(" in c and "[zoom -> [image]]" in c for c in completions)
    assert all(len(r["rewards"]["zoomed_right"]) == len(r["completions"]) for r in records)
    # the tools' images are saved beside the log, one per `[image]` mark, and shown inline on the samples page
    for record in records:
        assert [len(p) for p in record["tool_images"]] == [c.count("[image]") for c in record["completions"]]
        for path in (p for paths in record["tool_images"] for p in paths):
            with Image.open(tmp_path / "run" / "model" / path) as image:
                assert image.size == (QUARTER, QUARTER)
    page = Path(result["samples"]).read_text()
    shown_calls = re.findall(r"<pre>[^<]*zoom\(\{[^<]*<img src=\"data:image/png;base64,", page)
    assert shown_calls and "[image]" not in page
    assert result["verdict"] == zoom.verdict(result["after"]["accuracy"], 0, True, max_steps=2)
    assert "this run trained 2 steps" in result["verdict"] and "missed" not in result["verdict"]
    log = json.loads((tmp_path / "run" / "model" / "trainer_state.json").read_text())["log_history"]
    assert any(entry.get("tools/call_frequency", 0) > 0 for entry in log)


def test_the_tool_flag_is_the_zoom_demos_only(capsys):
    with pytest.raises(SystemExit):
        demo_main(["--task", "colour", "--no-tool"])
    assert "--tool/--no-tool is an option of --task zoom" in capsys.readouterr().err


def test_tools_and_environments_are_named_by_dotted_path(tmp_path):
    data = write_data(tmp_path / "data", **SMALL)
    model_dir = zoom.demo_model(tmp_path / "model", seed=0)
    assert import_callable(
        "vlm_grpo.demos.zoom_scene.ZoomScene", "environment_factory", "package.module.Class"
    )
    with pytest.raises(
        VLMGRPOError, match=r"^Tool 'vlm_grpo.demos.zoom_scene.nothing': module .* has no attribute"
    ):
        import_callable("vlm_grpo.demos.zoom_scene.nothing", "Tool", "package.module.function")
    with pytest.raises(VLMGRPOError, match="is a tuple, not a callable: point it to package.module.function"):
        import_callable("vlm_grpo.demos.zoom_scene.QUARTERS", "Tool", "package.module.function")
    from vlm_grpo.config import VLMGRPOConfig, VLMModelConfig

    args = VLMGRPOConfig(
        output_dir=str(tmp_path / "out"), max_completion_length=8, report_to="none", use_cpu=True
    )
    script = ScriptArguments(
        data_config=str(data["train"]),
        rewards=["accuracy"],
        environment_factory="vlm_grpo.demos.zoom_scene.ZoomScene",
    )
    trainer = build_trainer(script, args, VLMModelConfig(model_name_or_path=model_dir, dtype="float32"))
    assert trainer.environment_factories == {None: ZoomScene}
    script = ScriptArguments(
        data_config=str(data["train"]), rewards=["accuracy"], tools=["test_demo_zoom.look"]
    )
    trainer = build_trainer(script, args, VLMModelConfig(model_name_or_path=model_dir, dtype="float32"))
    assert trainer.tools == [look]


def look(region: int) -> str:
    """Describe one quarter (a text tool, named by dotted path in the test above).

    Args:
        region: the quarter.
    """
    return f"quarter {region}"
