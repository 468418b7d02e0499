"""Exact resume: a run killed with SIGKILL and resumed ends where an uninterrupted run ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import write_color_data, write_train_yaml
from safetensors.torch import load_file

from vlm_grpo.demos import motion
from vlm_grpo.testing import DEFAULT_FAMILY
from vlm_grpo.trainer.checkpoints import is_complete, latest_checkpoint, mark_complete, resolve_resume

ROOT = Path(__file__).resolve().parents[1]

# A reward whose value depends on the sampled text (so updates depend on the RNG and the data order), and that
# slows the run down after step 2, so that the kill lands mid-training.
SLOW_REWARD = """
import time

def slow_length(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 2:
        time.sleep(0.4)
    return [float(len(c[0]["content"])) for c in completions]
"""


def launch(config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(config.parent), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vlm_grpo.train", str(config), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_killed_and_resumed_run_matches_uninterrupted_run(tiny_model, tmp_path):
    (tmp_path / "slow_reward.py").write_text(textwrap.dedent(SLOW_REWARD))
    data = write_color_data(tmp_path / "data", n=16)
    common = dict(
        rewards=["slow_reward.slow_length"],
        max_steps=5,
        save_strategy="steps",
        save_steps=2,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        seed=7,
    )
    model = tiny_model(DEFAULT_FAMILY)

    straight = write_train_yaml(tmp_path, model, data, output_dir=str(tmp_path / "straight"), **common)
    straight = straight.rename(tmp_path / "straight.yaml")
    assert launch(straight).wait(timeout=300) == 0

    config = write_train_yaml(tmp_path, model, data, output_dir=str(tmp_path / "killed"), **common)
    process = launch(config)
    checkpoint = tmp_path / "killed" / "checkpoint-2"
    deadline = time.monotonic() + 300
    while not is_complete(checkpoint):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "model.safetensors").exists()  # it really died mid-training

    # A checkpoint killed while saving (no completion marker) must never be taken as the latest.
    partial = tmp_path / "killed" / "checkpoint-4"
    partial.mkdir(exist_ok=True)
    shutil.copy(checkpoint / "model.safetensors", partial / "model.safetensors")
    assert latest_checkpoint(tmp_path / "killed") == str(checkpoint)

    resumed = launch(config, "--resume_from_checkpoint", "true")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()[-3000:]
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "model.safetensors")
    initial = load_file(Path(model) / "model.safetensors")
    assert a.keys() == b.keys()
    assert any(not torch.equal(a[k], initial[k]) for k in a)  # training moved the weights
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-6, rtol=0)


def test_resume_setting_resolution(tmp_path):
    assert resolve_resume(None, tmp_path) is None and resolve_resume("false", tmp_path) is None
    assert resolve_resume("true", tmp_path) is None  # nothing to resume from: start fresh
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    mark_complete(tmp_path / "checkpoint-2")
    assert resolve_resume(True, tmp_path) == str(tmp_path / "checkpoint-2")
    with pytest.raises(ValueError, match="checkpoint-4.*incomplete.*checkpoint-2"):
        resolve_resume(str(tmp_path / "checkpoint-4"), tmp_path)
    with pytest.raises(ValueError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "checkpoint-9"), tmp_path)


@pytest.mark.parametrize(
    ("dynamic_sampling", "videos"),
    [(False, False), (True, False), (True, True)],
    ids=["plain", "dynamic_sampling", "videos_dynamic_sampling"],
)
def test_resume_inside_a_generation_batch_is_exact(
    dynamic_sampling, videos, tiny_model, tmp_path, monkeypatch
):
    """steps_per_generation 2 with one micro-batch a step: the step-1 checkpoint falls inside a generation batch. It
    holds the buffered rollout, and a run resumed from it ends with the uninterrupted run's weights (TRL samples the
    batch again there, and ends elsewhere). With video records (MPEG-4 files), the buffered rollout holds video rows."""
    from vlm_grpo.train import main as train_main
    from vlm_grpo.trainer.rollout_buffer import buffer_file

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "length_reward.py").write_text(
        "def length(completions, solution, **kwargs):\n"
        "    return [1.0 if s == 'red' else float(len(c[0]['content'])) for c, s in zip(completions, solution)]\n"
    )
    if videos:
        data = motion.write_task(tmp_path / "data", n_train=8, n_eval=0)["train"]
    else:
        data = write_color_data(tmp_path / "data", n=8)
    options = dict(
        rewards=["length_reward.length"], max_steps=4, steps_per_generation=2, save_strategy="steps", save_steps=1,
        seed=5, learning_rate=1e-2, dynamic_sampling=dynamic_sampling,
    )  # fmt: skip
    model = tiny_model(DEFAULT_FAMILY)
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    train_main(
        [str(write_train_yaml(tmp_path / "a", model, data, output_dir=str(tmp_path / "a"), **options))]
    )
    checkpoint = tmp_path / "a" / "checkpoint-1"
    assert buffer_file(checkpoint, 0).is_file()  # inside a generation batch: the rollout is saved
    assert not buffer_file(tmp_path / "a" / "checkpoint-2", 0).exists()  # at its end: nothing to resume
    shutil.copytree(checkpoint, tmp_path / "b" / "checkpoint-1")
    config = write_train_yaml(tmp_path / "b", model, data, output_dir=str(tmp_path / "b"), **options)
    train_main([str(config), "--resume_from_checkpoint", str(tmp_path / "b" / "checkpoint-1")])
    a = load_file(tmp_path / "a" / "model.safetensors")
    b = load_file(tmp_path / "b" / "model.safetensors")
    initial = load_file(Path(model) / "model.safetensors")
    assert any(not torch.equal(a[k], initial[k]) for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.distributed
def test_zero3_two_processes_resume_matches_uninterrupted_run(tiny_model, tmp_path):
    """torchrun, 2 processes, ZeRO-3 (CPU): a run resumed from the step-2 checkpoint of an uninterrupted 4-step run
    (its engine shards, optimizer, scheduler, RNG and data position) ends with the uninterrupted run's weights.

    Both runs reduce gradients in the same order on the same 2 processes, so they agree to the last bit (measured
    difference 0.0); the test allows 1e-6. Exact resume under 2-process DDP, after a real preemption, is tested in
    `test_preemption.py`.
    """
    from dist_helpers import (
        BIN,
        build_deepspeed_cpu_ops,
        free_port,
        launch,
        launch_env,
        load_state,
        weight_difference,
        write_config,
        write_data,
    )

    built = build_deepspeed_cpu_ops()
    assert built.returncode == 0, built.stdout[-3000:]
    model = tiny_model(DEFAULT_FAMILY)
    data = write_data(tmp_path / "data", ["image"] * 8)

    def torchrun(name: str, *extra: str):
        (tmp_path / name).mkdir(exist_ok=True)
        config = write_config(tmp_path / name, model, data, max_steps=4, lr_scheduler_type="linear")
        cmd = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
        cmd += ["-m", "vlm_grpo.train", str(config), "--deepspeed", "local_scripts/zero3.json", *extra]
        run = launch(cmd, launch_env(tmp_path), tmp_path / f"{name}.log")
        assert run.returncode == 0 and not run.timed_out, run.tail()
        return tmp_path / name / "run"

    straight = torchrun("straight")
    assert is_complete(straight / "checkpoint-2")
    resumed_dir = tmp_path / "resumed" / "run"
    shutil.copytree(straight / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = torchrun("resumed", "--resume_from_checkpoint", "true")
    assert load_state(resumed)["global_step"] == 4
    assert load_state(resumed / "checkpoint-4")["log_history"][0]["step"] == 1  # history carried over
    difference, moved = weight_difference(model, straight, resumed)
    assert moved > 0, "training did not move the weights"
    assert difference <= 1e-6, f"ZeRO-3 resumed run differs from the uninterrupted run by {difference:.3g}"
