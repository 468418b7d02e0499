"""Preemption: a real signal makes a run finish its step, write a complete checkpoint and exit with status 75;
resuming with `--resume_from_checkpoint true` ends where an uninterrupted run ends (weights within 1e-6).

The reward `dist_helpers.gated_reward` holds each run inside the optimizer step that starts at global step 2 until
the test has sent its signal, so the signal lands inside step 3 whatever the machine's load, and the run must stop
after step 3. One process gets SIGUSR1 (a scheduler's warning signal); the 2-process DDP run is stopped the way a
cluster stops a job: SIGTERM to the launcher (`local_scripts/train_grpo.sh`, i.e. torchrun), which forwards it to
its workers and waits for them (`--shutdown_timeout`) before killing them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_helpers import (
    ROOT,
    finish,
    free_port,
    launch,
    launch_env,
    load_state,
    start,
    wait_for,
    weight_difference,
    write_config,
    write_data,
)

from vlm_grpo.runtime.preemption import EXIT_PREEMPTED, PreemptionCallback
from vlm_grpo.testing import DEFAULT_FAMILY
from vlm_grpo.trainer.checkpoints import is_complete, latest_checkpoint

GATE_STEP = 2  # the signal lands inside the step that starts at global step 2: the run stops after step 3
STOPPED = GATE_STEP + 1
TRAIN = dict(
    rewards=["dist_helpers.gated_reward"], max_steps=5, save_strategy="no", lr_scheduler_type="linear"
)
PREEMPTED_LINE = f"preempted: stopped after step {STOPPED} with a complete checkpoint"


def configs(tmp_path: Path, model: str) -> dict[str, Path]:
    """The same training YAML for an uninterrupted run and for a preempted one, each with its output folder."""
    data = write_data(tmp_path / "data", ["image"] * 8)
    out = {}
    for name in ("straight", "preempted"):
        (tmp_path / name).mkdir()
        out[name] = write_config(tmp_path / name, model, data, **TRAIN)
    return out


def gate_env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    gate = tmp_path / "gate"
    gate.mkdir()
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    env = launch_env(probe, VLM_GRPO_GATE_DIR=str(gate), VLM_GRPO_GATE_STEP=str(GATE_STEP), **extra)
    return env, gate


def check_stopped(run, out: Path, ranks: int) -> None:
    """After the signal: exactly one complete checkpoint, at the step the signal landed in, and no final model."""
    assert not run.timed_out, run.tail()
    assert run.log.count(PREEMPTED_LINE) == ranks, run.tail()
    checkpoint = out / f"checkpoint-{STOPPED}"
    assert is_complete(checkpoint) and latest_checkpoint(out) == str(checkpoint), sorted(os.listdir(out))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [checkpoint.name]
    assert load_state(checkpoint)["global_step"] == STOPPED
    rng_files = ["rng_state.pth"] if ranks == 1 else [f"rng_state_{rank}.pth" for rank in range(ranks)]
    assert all((checkpoint / name).exists() for name in rng_files), sorted(os.listdir(checkpoint))
    assert not (out / "model.safetensors").exists()  # stopped, not finished


def check_resumed(run, model: str, straight: Path, resumed: Path) -> None:
    assert run.returncode == 0 and not run.timed_out, run.tail()
    assert load_state(resumed)["global_step"] == TRAIN["max_steps"]
    difference, moved = weight_difference(model, straight, resumed)
    assert moved > 0, "training did not move the weights"
    assert difference <= 1e-6, f"resumed run differs from the uninterrupted run by {difference:.3g}"


def test_sigusr1_one_process_checkpoints_exits_75_and_resumes_exactly(tiny_model, tmp_path):
    model = tiny_model(DEFAULT_FAMILY)
    yamls = configs(tmp_path, model)
    python = [sys.executable, "-m", "vlm_grpo.train"]
    straight = launch([*python, str(yamls["straight"])], launch_env(tmp_path), tmp_path / "straight.log")
    assert straight.returncode == 0, straight.tail()

    env, gate = gate_env(tmp_path)
    cmd, log = [*python, str(yamls["preempted"])], tmp_path / "preempted.log"
    started = time.monotonic()
    proc = start(cmd, env, log)
    wait_for((gate / "waiting0").exists, "the run reaching step 3", proc, log)
    proc.send_signal(signal.SIGUSR1)
    (gate / "go").touch()
    run = finish(proc, cmd, log, started)
    assert run.returncode == EXIT_PREEMPTED, run.tail()
    check_stopped(run, tmp_path / "preempted" / "run", ranks=1)

    resumed = launch(
        [*cmd, "--resume_from_checkpoint", "true"], launch_env(tmp_path), tmp_path / "resumed.log"
    )
    check_resumed(resumed, model, tmp_path / "straight" / "run", tmp_path / "preempted" / "run")


@pytest.mark.distributed
def test_sigterm_to_torchrun_stops_both_ddp_ranks_after_one_step_and_resumes_exactly(tiny_model, tmp_path):
    """`bash local_scripts/train_grpo.sh` (exec torchrun, 2 processes, DDP); SIGTERM to the launcher's process."""
    model = tiny_model(DEFAULT_FAMILY)
    yamls = configs(tmp_path, model)
    script = ["bash", str(ROOT / "local_scripts" / "train_grpo.sh")]
    launcher = {"NPROC_PER_NODE": "2", "DEEPSPEED": ""}

    def env_of(**extra: str) -> dict[str, str]:
        return {**launch_env(tmp_path), **launcher, "MASTER_PORT": str(free_port()), **extra}

    straight = launch([*script, str(yamls["straight"])], env_of(), tmp_path / "straight.log")
    assert straight.returncode == 0, straight.tail()

    env, gate = gate_env(tmp_path)
    cmd, log = [*script, str(yamls["preempted"])], tmp_path / "preempted.log"
    started = time.monotonic()
    proc = start(cmd, {**env, **env_of()}, log)
    both = lambda: (gate / "waiting0").exists() and (gate / "waiting1").exists()  # noqa: E731
    wait_for(both, "both ranks reaching step 3", proc, log)
    proc.send_signal(signal.SIGTERM)  # the launcher: torchrun, which the script exec'd
    wait_for(lambda: log.read_text().count("closing signal SIGTERM") == 2, "torchrun forwarding", proc, log)
    (gate / "go").touch()
    run = finish(proc, cmd, log, started)
    # The workers exit with 75; torchrun itself reports the signal it got (SignalException) and exits with 1.
    assert run.returncode != 0 and "got signal: 15" in run.log, run.tail()
    assert "Unable to shutdown process" not in run.log, run.tail()  # no worker needed a SIGKILL
    check_stopped(run, tmp_path / "preempted" / "run", ranks=2)

    resumed = launch([*cmd, "--resume_from_checkpoint", "true"], env_of(), tmp_path / "resumed.log")
    check_resumed(resumed, model, tmp_path / "straight" / "run", tmp_path / "preempted" / "run")


# ------------------------------------------------------------------------------------------- nested handlers
def test_nested_handlers_pass_a_signal_in_and_out():
    """A pipeline of runs (the demo: warm start, GRPO) holds one callback around the runs' own: a signal that came
    before a run stops it after its first step, and one that came during a run reaches the pipeline after it."""
    from transformers import TrainerControl, TrainerState

    args = type("Args", (), {"device": torch.device("cpu")})()
    pipeline = PreemptionCallback()
    with pipeline.handle_signals():
        os.kill(os.getpid(), signal.SIGUSR1)  # between two runs: only the pipeline's handler is installed
        run = PreemptionCallback()
        with run.handle_signals():
            control = run.on_step_end(args, TrainerState(global_step=1, max_steps=5), TrainerControl())
        assert run.received == signal.SIGUSR1 and control.should_training_stop and run.stopped_at == 1

    before = signal.getsignal(signal.SIGTERM)
    pipeline = PreemptionCallback()
    with pipeline.handle_signals():
        run = PreemptionCallback()
        with run.handle_signals():
            os.kill(os.getpid(), signal.SIGTERM)  # inside the run: its handler records it
        assert run.received == signal.SIGTERM and pipeline.received == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == pipeline.request
    assert signal.getsignal(signal.SIGTERM) == before


# --------------------------------------------------------------------------------- agreement across processes
def _signal_one_rank(rank: int, port: int, results) -> None:
    """One process of `test_a_signal_on_one_rank_stops_every_rank`: rank 0 alone gets a real SIGUSR1."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    callback = PreemptionCallback()
    args = SimpleNamespace(device=torch.device("cpu"))  # the only field the callback reads
    stops = []
    with callback.handle_signals():
        for step in (1, 2, 3):
            if rank == 0 and step == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
            state = TrainerState(global_step=step, max_steps=10)
            control = callback.on_step_end(args, state, TrainerControl())
            stops.append((step, control.should_save, control.should_training_stop))
            if control.should_training_stop:
                break
    results[rank] = (stops, callback.received, signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)
    torch.distributed.destroy_process_group()


@pytest.mark.distributed
def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step():
    """The handler only sets a flag; the step-end all-reduce makes the rank that got no signal stop too."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.Manager().dict()
    port = free_port()
    procs = [context.Process(target=_signal_one_rank, args=(rank, port, results)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0, f"rank process exited with {proc.exitcode}"
    expected = [(1, False, False), (2, True, True)]
    assert results[0] == (expected, signal.SIGUSR1, True), results[0]
    assert results[1] == (expected, None, True), results[1]
