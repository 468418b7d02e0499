"""`vlm-grpo plot`, `samples` and `export`: curves of a real run, the HTML sample view, LoRA merging."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import color_dataset, color_rows, grpo_args, length_reward, square_image
from PIL import Image
from trl.data_utils import prepare_multimodal_messages

from vlm_grpo import VLMGRPOTrainer, get_model_family
from vlm_grpo.cli.export import export_merged
from vlm_grpo.cli.main import main as cli_main
from vlm_grpo.cli.plot import find_trainer_state, load_log_history, plot_run, plot_title
from vlm_grpo.cli.samples import read_samples, render_html
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.runtime.sample_log import samples_path, write_samples
from vlm_grpo.testing import DEFAULT_FAMILY

# ------------------------------------------------------------------------------------------------------ plot


def test_plot_run_of_a_real_training_run(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, beta=0.1),
        train_dataset=color_dataset(8),
    )
    trainer.train()
    trainer.save_state()
    _, entries = load_log_history(tmp_path)
    assert [e["step"] for e in entries] == [1, 2]
    assert all("rewards/length_reward/mean" in e and "kl" in e for e in entries)

    output = plot_run(tmp_path)
    assert output == tmp_path / "training_curves.png"
    with Image.open(output) as image:
        assert image.format == "PNG"
        assert image.width >= 800 and image.height >= 500


def test_plot_draws_the_held_out_curves_of_a_run_that_evaluated(tiny_model, tmp_path):
    from vlm_grpo.cli.plot import curve_panels

    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4),
        train_dataset=color_dataset(8),
        eval_dataset=color_dataset(2),
    )
    trainer.train()
    trainer.save_state()
    evaluated = [e for e in trainer.state.log_history if "eval_reward" in e]
    assert [e["step"] for e in evaluated] == [1, 2]

    _, entries = load_log_history(tmp_path)
    (reward, title, _, _), *_ = curve_panels(entries)
    assert title == "reward (length_reward)"
    assert reward == {
        "length_reward": "rewards/length_reward/mean",
        "length_reward (held-out)": "eval_rewards/length_reward/mean",
    }
    from vlm_grpo.cli.plot import curves_figure

    figure = curves_figure(entries, "run")
    lines = {line.get_label(): line for ax in figure.axes for line in ax.get_lines()}
    held_out = lines["length_reward (held-out)"]
    assert list(held_out.get_xdata()) == [1.0, 2.0]
    assert list(held_out.get_ydata()) == [e["eval_rewards/length_reward/mean"] for e in evaluated]
    assert list(lines["length_reward"].get_xdata()) == [1.0, 2.0]  # the training curve is still there
    assert plot_run(tmp_path).is_file()


def _write_state(folder, global_step: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    history = [
        {"step": s, "reward": float(s), "rewards/accuracy/mean": 0.5} for s in range(1, global_step + 1)
    ]
    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": global_step, "log_history": history})
    )


def test_newest_checkpoint_state_wins_and_custom_output(tmp_path):
    _write_state(tmp_path / "checkpoint-2", 2)
    _write_state(tmp_path / "checkpoint-10", 10)
    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    _write_state(tmp_path, 10)
    assert find_trainer_state(tmp_path) == tmp_path / "trainer_state.json"
    output = plot_run(tmp_path, tmp_path / "plots" / "curves.png")  # no kl, no entropy: notes, not errors
    assert output.is_file()


def test_plot_errors_name_the_path(tmp_path, capsys):
    with pytest.raises(VLMGRPOError, match=str(tmp_path)):
        plot_run(tmp_path)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 0, "log_history": []}))
    with pytest.raises(VLMGRPOError, match="no training log entries"):
        plot_run(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plot", str(tmp_path / "missing")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "missing") in err and len(err.strip().splitlines()) == 1


def test_plot_title_names_the_run_not_its_path(tmp_path):
    _write_state(tmp_path / "my_run" / "checkpoint-3", 3)
    state = find_trainer_state(tmp_path / "my_run")
    run = f"{tmp_path.name}/my_run"  # the run, by its folder and the one above (demos save to .../model)
    assert plot_title(tmp_path / "my_run", state) == f"{run} (checkpoint-3)"
    relative = tmp_path / "my_run" / "." / "checkpoint-3" / ".."  # a relative-looking spelling of the folder
    assert plot_title(relative, state) == f"{run} (checkpoint-3)"
    assert str(tmp_path.parent) not in plot_title(tmp_path / "my_run", state)
    _write_state(tmp_path / "my_run", 4)
    assert plot_title(tmp_path / "my_run", find_trainer_state(tmp_path / "my_run")) == run


# --------------------------------------------------------------------------------------------------- samples


def _record(step: int, images: list[str]) -> dict:
    return {
        "step": step,
        "prompt": "What <b>color</b> is the square ?",
        "images": images,
        "solution": "red & green",
        "completions": [f"step{step} answer <i>one</i>", f"step{step} answer two"],
        "rewards": {"accuracy": [1.0, None], "format": [0.5, float("nan")]},
        "advantages": [0.7071, -0.7071],
    }


def test_write_read_and_render_samples(tmp_path):
    image_path = tmp_path / "red.png"
    square_image("red", size=600).save(image_path)
    missing = str(tmp_path / "gone.png")
    write_samples(samples_path(tmp_path, 10), [_record(10, [str(image_path), missing])])
    write_samples(samples_path(tmp_path, 2), [_record(2, []), _record(2, [""])])
    assert samples_path(tmp_path, 2).name == "step_000002.jsonl"

    records = read_samples(tmp_path)
    assert [r["step"] for r in records] == [2, 2, 10]
    assert records[0]["rewards"]["format"] == [0.5, None]  # NaN is written as null

    page = render_html(tmp_path).read_text()
    assert (tmp_path / "samples.html").is_file()
    assert "What &lt;b&gt;color&lt;/b&gt; is the square ?" in page
    assert "<b>color</b>" not in page
    assert "red &amp; green" in page
    assert page.count("data:image/png;base64,") == 1
    assert "missing: gone.png" in page and str(tmp_path) not in page  # file names only, no machine paths
    assert "embedded image" in page
    for step in (2, 10):
        assert f"step{step} answer &lt;i&gt;one&lt;/i&gt;" in page and f"step{step} answer two" in page
    assert page.index("<h2>step 10</h2>") < page.index("<h2>step 2</h2>")  # newest first
    assert "0.7071" in page and "-0.7071" in page
    head = page[: page.index("<body>")]
    title = f"Samples of {tmp_path.parent.name}/{tmp_path.name}"  # the run, never a machine path
    assert f"<title>{title}</title>" in head and str(tmp_path.parent.parent) not in head


def test_inline_images_have_a_readable_size(tmp_path):
    import base64
    import io
    import re

    image_path = tmp_path / "wide.png"
    Image.new("RGB", (1000, 400), (10, 20, 30)).save(image_path)
    write_samples(samples_path(tmp_path, 1), [_record(1, [str(image_path)])])
    page = render_html(tmp_path, tmp_path / "out" / "view.html").read_text()
    data = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page).group(1)
    with Image.open(io.BytesIO(base64.b64decode(data))) as image:
        assert image.size == (384, 154)  # large images shrink to a 384-pixel long side ...
    Image.new("RGB", (56, 56), (10, 20, 30)).save(image_path)
    page = render_html(tmp_path, tmp_path / "out" / "small.html").read_text()
    data = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page).group(1)
    with Image.open(io.BytesIO(base64.b64decode(data))) as image:
        assert image.size == (384, 384)  # ... and small ones grow to it, pixel by pixel


def test_sample_files_are_numbered_like_the_console_and_the_curves(tiny_model, tmp_path):
    trainer = VLMGRPOTrainer(
        model=tiny_model(DEFAULT_FAMILY),
        reward_funcs=length_reward,
        args=grpo_args(tmp_path, max_steps=4, log_samples_steps=2),
        train_dataset=color_dataset(8),
    )
    trainer.train()
    logged = [e["step"] for e in trainer.state.log_history if "loss" in e]
    assert logged == [1, 2, 3, 4]
    files = sorted(p.name for p in (tmp_path / "samples").iterdir())
    assert files == ["step_000001.jsonl", "step_000002.jsonl", "step_000004.jsonl"]  # step 1, then every 2
    assert sorted({r["step"] for r in read_samples(tmp_path)}) == [1, 2, 4]


def test_samples_page_lists_the_newest_step_first(tmp_path):
    from vlm_grpo.cli.samples import main as samples_main

    for step in (1, 2, 3):
        write_samples(samples_path(tmp_path, step), [_record(step, [])])

    def order(page: str) -> list[int]:
        return sorted((1, 2, 3), key=lambda step: page.index(f"<h2>step {step}</h2>"))

    assert order(render_html(tmp_path).read_text()) == [3, 2, 1]
    assert order(render_html(tmp_path, oldest_first=True).read_text()) == [1, 2, 3]
    assert "<h2>step 1</h2>" not in render_html(tmp_path, last=2).read_text()  # the last steps, newest first
    samples_main([str(tmp_path), "--oldest_first", "--last", "2"])
    page = (tmp_path / "samples.html").read_text()
    assert "<h2>step 1</h2>" not in page and page.index("<h2>step 2</h2>") < page.index("<h2>step 3</h2>")


def test_malformed_sample_line_names_file_and_line(tmp_path):
    path = samples_path(tmp_path, 3)
    write_samples(path, [_record(3, [])])
    with path.open("a") as f:
        f.write("{not json\n")
    with pytest.raises(VLMGRPOError, match=r"step_000003\.jsonl, line 2, column 2: not valid JSON"):
        read_samples(tmp_path)
    path.write_text('["a list"]\n')
    with pytest.raises(VLMGRPOError, match="line 1: not a sample record"):
        render_html(tmp_path)
    path.unlink()
    with pytest.raises(VLMGRPOError, match="no samples in"):
        render_html(tmp_path)


# ---------------------------------------------------------------------------------------------------- export


def _logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def test_export_merges_lora_exactly(tiny_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    base_path = tiny_model(DEFAULT_FAMILY)
    module = get_model_family(base_path)
    processor = module.load_processor(base_path)
    row = color_rows(1)[0]
    messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
    encoded = module.encode_prompt(processor, messages, row["images"])
    ids = torch.tensor([encoded.input_ids])

    model = module.load_model(base_path, **module.model_init_kwargs(dtype="float32")).eval()
    inputs = module.model_inputs(model.config, ids, torch.ones_like(ids), [encoded.image_inputs])
    base_logits = _logits(model, inputs)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_logits = _logits(peft_model, inputs)
    assert not torch.allclose(peft_logits, base_logits, atol=1e-3)
    peft_model.save_pretrained(tmp_path / "adapter")

    out = export_merged(base_path, tmp_path / "adapter", tmp_path / "merged")
    merged = AutoModelForImageTextToText.from_pretrained(out).eval()
    assert AutoProcessor.from_pretrained(out) is not None
    assert not any("lora_" in key for key in merged.state_dict())
    merged_logits = _logits(merged, inputs)
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-5, rtol=0)
    assert not torch.allclose(merged_logits, base_logits, atol=1e-3)

    with pytest.raises(ValueError, match="not empty; .* --overwrite"):
        export_merged(base_path, tmp_path / "adapter", out)
    assert export_merged(base_path, tmp_path / "adapter", out, overwrite=True) == out


def test_export_refuses_a_missing_adapter(tiny_model, tmp_path, capsys):
    base_path = tiny_model(DEFAULT_FAMILY)
    capsys.readouterr()  # drop the output of building the tiny model
    args = ["--model", base_path, "--adapter", str(tmp_path / "nope"), "--out", str(tmp_path / "merged")]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["export", *args])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert "adapter folder" in err and str(tmp_path / "nope") in err and len(err.splitlines()) == 1
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="adapter_config.json"):
        export_merged(base_path, tmp_path / "empty", tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_panels_merge_and_accuracy_rewards_feed_the_accuracy_panel():
    from vlm_grpo.cli.plot import curve_panels

    one = [{"step": 1, "reward": 0.5, "rewards/iou/mean": 0.5, "completions/mean_length": 9.0}]
    titles = [title for _, title, _, _ in curve_panels(one)]
    assert titles == [
        "reward (accuracy: iou)",
        "completion length (tokens)",
        "KL to the reference",
        "entropy",
    ]
    two = [{"step": 1, "reward": 0.6, "rewards/geo3k/mean": 0.5, "rewards/format/mean": 1.0}]
    panels = {title: series for series, title, _, _ in curve_panels(two)}
    assert panels["accuracy"] == {"geo3k": "rewards/geo3k/mean"}
    assert set(panels["reward per function"]) == {"geo3k", "format"}


def test_near_constant_series_are_drawn_flat():
    from vlm_grpo.cli.plot import y_limits

    low, high = y_limits(0.5001, 0.5003)  # rounding noise around 0.5
    assert high - low >= 0.05 * 0.5 and low < 0.5001 and high > 0.5003
    low, high = y_limits(0.1, 0.9)  # a real change keeps its own scale, with a margin
    assert low < 0.1 and high > 0.9 and high - low < 1.0
    low, high = y_limits(1e-4, 5e-4)  # so does a small one (a KL)
    assert low < 1e-4 and high > 5e-4 and high - low < 1e-3
    assert y_limits(0.0, 0.0) == (-0.55, 0.55)


def test_grounding_samples_draw_the_solution_and_each_predicted_box(tmp_path):
    import base64
    import io
    import re

    from vlm_grpo.cli.samples import BOX_COLORS, SOLUTION_COLOR

    image_path = tmp_path / "rec.png"
    Image.new("RGB", (56, 56), (255, 255, 255)).save(image_path)
    record = {
        "step": 1, "prompt": "Where is the square?", "images": [str(image_path)], "solution": [4, 4, 28, 28],
        "completions": ["<answer>[30, 30, 50, 50]</answer>", "no box", "[8, 8, 20, 40]"],
        "rewards": {"iou": [0.0, 0.0, 0.3]}, "advantages": [0.0, -1.0, 1.0],
    }  # fmt: skip
    write_samples(samples_path(tmp_path, 1), [record])
    page = render_html(tmp_path).read_text()
    data = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page).group(1)
    with Image.open(io.BytesIO(base64.b64decode(data))) as image:
        scale = image.width / 56  # every pixel of the 56-pixel image is shown as a block
        assert (
            image.getpixel((int(16 * scale), int(4 * scale) + 1)) == SOLUTION_COLOR
        )  # top edge of the solution
        assert image.getpixel((int(40 * scale), int(30 * scale) + 1)) == BOX_COLORS[0]  # completion 0's box
        assert image.getpixel((int(8 * scale) + 1, int(30 * scale))) == BOX_COLORS[2]  # completion 2's box
        assert image.getpixel((int(45 * scale), int(10 * scale))) == (
            255,
            255,
            255,
        )  # nothing drawn elsewhere
    assert page.count('class="swatch"') == 3  # the solution and the two completions that wrote a box


def test_samples_page_of_the_last_steps_only(tmp_path):
    for step in (1, 2, 3):
        write_samples(samples_path(tmp_path, step), [_record(step, [])])
    page = render_html(tmp_path, tmp_path / "last.html", last=2).read_text()
    assert "step1 answer" not in page and "step2 answer" in page and "step3 answer" in page


def test_samples_page_keeps_a_bounded_number_of_groups_and_small_images(tmp_path):
    import base64
    import io
    import re

    import numpy as np

    from vlm_grpo.cli.samples import IMAGE_BYTES, MAX_GROUPS
    from vlm_grpo.cli.samples import main as samples_main

    noise = np.random.default_rng(0).integers(100, 151, (112, 112, 3)).astype(np.uint8)
    Image.fromarray(noise).save(tmp_path / "noise.png")
    many = [_record(1, [str(tmp_path / "noise.png")]) for _ in range(MAX_GROUPS + 4)]
    for i, record in enumerate(many):
        record["completions"] = [f"group {i} answer", "other"]
    write_samples(samples_path(tmp_path, 1), many)
    write_samples(samples_path(tmp_path, 2), [_record(2, []) for _ in range(3)])

    page = render_html(tmp_path).read_text()
    assert page.count('class="group"') == MAX_GROUPS + 3
    assert f"group {MAX_GROUPS - 1} answer" in page and f"group {MAX_GROUPS} answer" not in page
    assert page.count(f"{MAX_GROUPS} of {MAX_GROUPS + 4} prompt groups of this step shown") == 1
    assert page.count("prompt groups of this step shown") == 1  # step 2 shows all of its 3
    uris = re.findall(r"data:image/(png|jpeg);base64,([A-Za-z0-9+/=]+)", page)
    assert len(uris) == MAX_GROUPS
    for _, data in uris:  # a noisy image: re-encoded well under its lossless size, still 384 pixels a side
        assert len(base64.b64decode(data)) <= 2 * IMAGE_BYTES
        with Image.open(io.BytesIO(base64.b64decode(data))) as image:
            assert image.size == (384, 384)

    assert render_html(tmp_path, max_groups=None).read_text().count('class="group"') == MAX_GROUPS + 7
    samples_main([str(tmp_path), "--output", str(tmp_path / "all.html"), "--max_groups", "0"])
    assert "shown" not in (tmp_path / "all.html").read_text()
    samples_main([str(tmp_path), "--output", str(tmp_path / "two.html"), "--max_groups", "2", "--last", "1"])
    two = (tmp_path / "two.html").read_text()
    assert two.count('class="group"') == 2 and "2 of 3 prompt groups of this step shown" in two


def test_plot_draws_the_tool_calls_of_a_run_with_tools():
    """A run with tools logs `tools/*`: a panel shows the calls per completion and the failures per call."""
    from vlm_grpo.cli.plot import curve_panels

    entries = [
        {"step": s, "reward": 0.1 * s, "tools/call_frequency": 0.5 + 0.1 * s, "tools/failure_frequency": 0.0}
        for s in (1, 2)
    ]
    panels = {title: series for series, title, _, _ in curve_panels(entries)}
    assert panels["tool calls"] == {
        "calls per completion": "tools/call_frequency",
        "failures per call": "tools/failure_frequency",
    }
    assert "tool calls" not in {title for _, title, _, _ in curve_panels([{"step": 1, "reward": 0.1}])}


def test_samples_page_shows_a_strip_of_each_videos_frames(tmp_path):
    """A group whose prompt holds videos: a file and a list of frame files each show frames spread over them (the
    first and the last included, as PyAV decodes them), a missing one a note; the records the trainer writes carry
    the videos as the dataset stores them."""
    from test_video import clip, decode_all, write_frames, write_video

    from vlm_grpo.data.video_frames import preview_frames
    from vlm_grpo.runtime.monitoring import sample_records

    file = write_video(tmp_path / "moves.mp4", clip("right", n=12))
    frames, _ = decode_all(file)
    shown = preview_frames(str(file))
    assert len(shown) == 4 and all(
        np.array_equal(s, frames[i]) for s, i in zip(shown, (0, 4, 7, 11), strict=True)
    )
    listed = write_frames(tmp_path / "frames", clip("up", n=5))
    assert [f.shape for f in preview_frames([str(tmp_path / name) for name in listed])] == [(56, 56, 3)] * 4

    videos = [str(file), {"path": None, "frames": listed}, str(tmp_path / "gone.mp4")]
    example = {"prompt": [{"role": "user", "content": "Where does it move?"}], "images": [], "videos": videos}
    records = sample_records(3, [example] * 2, ["left", "right"], {"accuracy": [0.0, 1.0]}, [-0.7, 0.7], 2)
    assert records[0]["videos"][1] == {"path": None, "frames": listed}
    write_samples(samples_path(tmp_path, 3), records)
    page = render_html(tmp_path).read_text()
    strips = page.split('<div class="video"')[1:]
    assert len(strips) == 2 and all(strip.split("</div>")[0].count("<img") == 4 for strip in strips)
    assert "video: moves.mp4" in page and "video: 000.png" in page and "missing: gone.mp4" in page
    assert str(tmp_path) not in page  # file names only, no machine paths
