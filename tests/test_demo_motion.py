"""The motion demo: its clips move as their answers say, are written as real video files that the data config reads
back, and the demo runs end to end (held-out evaluation of videos, GRPO on them, the same run from the same seed)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vlm_grpo.cli.samples import render_html
from vlm_grpo.data import load_data_config
from vlm_grpo.demos import motion
from vlm_grpo.rewards import build_rewards


def _centre(frame: np.ndarray) -> np.ndarray:
    """`[x, y]`: the centre of the frame's light pixels (the shape)."""
    ys, xs = np.nonzero(frame.mean(axis=-1) > 120)
    return np.array([xs.mean(), ys.mean()])


@pytest.mark.parametrize("motion_name", motion.OPTIONS)
def test_each_clip_moves_as_its_answer_says(motion_name):
    rng = random.Random(3)
    for _ in range(5):
        frames = motion.draw_clip(motion_name, rng)  # [T, H, W, 3]
        assert frames.shape == (motion.FRAMES, motion.SIZE, motion.SIZE, 3) and frames.dtype == np.uint8
        shift = _centre(frames[-1]) - _centre(frames[0])
        if motion_name == "rotating":
            assert np.abs(shift).max() < 2  # turns in place
            assert not np.array_equal(frames[0], frames[1])
        else:
            expected = np.array(motion.MOVES[motion_name]) * motion.STEP * (motion.FRAMES - 1)
            assert np.abs(shift - expected).max() < 1.5, (motion_name, shift)


def test_clips_are_video_files_the_data_config_reads(tmp_path):
    paths = motion.write_task(tmp_path, n_train=10, n_eval=5, seed=0)
    rows = load_data_config(paths["train"], seed=0)
    assert len(rows) == 10 and sorted({r["solution"] for r in rows}) == sorted(motion.OPTIONS)
    for row in rows:
        assert row["images"] == [] and len(row["videos"]) == 1
        path = Path(row["videos"][0]["path"])
        assert path.is_absolute() and path.parent == tmp_path / "videos" and path.suffix == ".mp4"
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "mpeg4" and float(stream.average_rate) == motion.FPS
            decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(decoded) == motion.FRAMES and decoded[0].shape == (motion.SIZE, motion.SIZE, 3)
    eval_files = {r["videos"][0]["path"] for r in load_data_config(paths["eval"], seed=0)}
    assert len(eval_files) == 5 and not eval_files & {r["videos"][0]["path"] for r in rows}
    accuracy = build_rewards(["accuracy"])[0][0]
    records = json.loads((tmp_path / "train.json").read_text())
    solutions = [r["solution"] for r in records]
    columns = {k: [r[k] for r in records] for k in ("options", "accu_reward_method")}
    assert accuracy(completions=solutions, solution=solutions, **columns) == [1.0] * 10
    wrong = ["left" if s != "left" else "up" for s in solutions]
    assert accuracy(completions=wrong, solution=solutions, **columns) == [0.0] * 10


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_motion_demo_trains_on_video_files_end_to_end(tmp_path):
    small = dict(
        max_steps=2,
        data_sizes={"n_train": 10, "n_eval": 5},
        per_device_train_batch_size=16,
        logging_steps=1,
        log_samples_steps=1,
    )  # fmt: skip  (2 clips x 8 completions a step)
    out = tmp_path / "run"
    result = motion.run_motion(str(out), **small)
    for stage in ("before", "after"):
        report = json.loads((out / f"eval_{stage}.json").read_text())
        assert report["n"] == 5 and report["accuracy"] == result[stage]["accuracy"]
    assert not (out / "eval_warm.json").exists() and "warm" not in result
    init, trained = _weights(out / "model-init"), _weights(out / "model")
    changed = {k for k in init if not torch.equal(init[k], trained[k])}
    # saved in the published checkpoints' layout (`visual.*`, `model.layers.*`) or transformers' own
    assert any(k.startswith(("visual.", "model.visual.")) for k in changed)  # the vision tower learns motion
    assert any(k.startswith(("model.layers.", "model.language_model.")) for k in changed)
    records = [
        json.loads(line)
        for line in (out / "model" / "samples" / "step_000001.jsonl").read_text().splitlines()
    ]
    assert records and all(r["solution"] in motion.OPTIONS and len(r["completions"]) == 8 for r in records)
    # each group keeps its clip, which the samples page draws as a strip of frames
    assert all(len(r["videos"]) == 1 and r["videos"][0]["path"].endswith(".mp4") for r in records)
    logged = sum(len(f.read_text().splitlines()) for f in (out / "model" / "samples").glob("step_*.jsonl"))
    page = render_html(out / "model").read_text()
    assert page.count('<div class="video"') == logged and "missing:" not in page
    again = tmp_path / "again"
    motion.run_motion(str(again), **small)
    assert json.loads((again / "eval_after.json").read_text())["accuracy"] == result["after"]["accuracy"]
    repeat = _weights(again / "model")
    assert all(torch.equal(trained[k], repeat[k]) for k in trained)
