"""Helpers of `test_distributed.py`: tiny data and configs, launching real multi-process runs, and a probe reward.

`probe_reward` is used by the launched runs as a dotted-path reward (`dist_helpers.probe_reward`, this folder is put
on their `PYTHONPATH`). Every rank calls it on its own slice of the batch, so it is the per-rank evidence the tests
read: each call appends one JSON line to `$VLM_GRPO_PROBE_DIR/rank{RANK}.jsonl` with the step, how many images each
of the rank's rows has, and how the policy and reference models are sharded in that process.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent  # the venv's bin: torchrun, accelerate, python
# DeepSpeed JIT-builds a C++ op for CPU runs; it is cached here, apart from other checkouts and users of the default
# ~/.cache/torch_extensions, whose builds with another venv path would invalidate it (and rebuild it inside a run).
TORCH_EXTENSIONS_DIR = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
    ROOT / ".pytest_cache" / "torch_extensions"
)
RUN_TIMEOUT = 240  # seconds for one launched 2-process run; a hang fails the test instead of blocking CI
COLORS = ("red", "green", "blue", "yellow")
RGB = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


# ------------------------------------------------------------------------------------------------- data/config
def write_data(folder: Path, layout: list[str]) -> Path:
    """A VLM-R1 JSON dataset, one record per entry of `layout`, in that order; returns its YAML.

    Entries: "image" asks for the colour of a square in a 56x56 PNG; "video" for the colour of a square in a video of
    4 frames (a list of 56x56 PNG frame files); "image+video" holds both; "text" records have no image or video.
    """
    from PIL import Image

    def square(name: str, color: str) -> str:
        image = Image.new("RGB", (56, 56), (128, 128, 128))
        image.paste(Image.new("RGB", (28, 28), RGB[color]), (14, 14))
        image.save(folder / "images" / name)
        return name

    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i, kind in enumerate(layout):
        color = COLORS[i % len(COLORS)]
        record: dict[str, Any] = {"solution": color, "options": list(COLORS), "id": i}
        if kind not in ("image", "video", "image+video", "text"):
            raise ValueError(f"layout entries are 'image', 'video', 'image+video' or 'text', got {kind!r}")
        if "image" in kind:
            record["image"] = square(f"{i}.png", color)
        if "video" in kind:
            record["video"] = [square(f"{i}_frame{t}.png", color) for t in range(4)]
        record["problem"] = "Name a color ." if kind == "text" else "What color is the square ?"
        records.append(record)
    (folder / "train.json").write_text(json.dumps(records))
    config = folder / "data.yaml"
    config.write_text("image_root: images/\ndatasets:\n  - json_path: train.json\n")
    return config


def write_config(folder: Path, model: str, data_config: Path, **overrides: Any) -> Path:
    """A training YAML for 2 tiny fp32 CPU steps on 2 processes; `overrides` replace or add fields.

    per_device_train_batch_size 2 x 2 processes = one group of 2 completions per rank and step. The checkpoint at
    step 2 is written (`save_steps: 2`). `shuffle_dataset: false` makes the rank of every row predictable.
    """
    config: dict[str, Any] = {
        "model_name_or_path": model,
        "dtype": "float32",
        "data_config": str(data_config),
        "rewards": ["dist_helpers.probe_reward"],
        "output_dir": str(folder / "run"),
        "max_steps": 2,
        "per_device_train_batch_size": 2,
        "num_generations": 2,
        "max_completion_length": 4,
        "learning_rate": 1e-2,
        "bf16": False,
        "use_cpu": True,
        "gradient_checkpointing": False,
        "save_strategy": "steps",
        "save_steps": 2,
        "report_to": "none",
        "logging_steps": 1,
        "shuffle_dataset": False,
        "disable_tqdm": True,
        "seed": 0,
    }
    config.update(overrides)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ---------------------------------------------------------------------------------------------------- launching
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venv_path(env: dict[str, str]) -> str:
    """`env`'s PATH with the venv's bin first: the launchers, and the `ninja` that builds DeepSpeed's CPU op."""
    return os.pathsep.join((str(BIN), env.get("PATH", "")))


def launch_env(probe_dir: Path, **extra: str) -> dict[str, str]:
    """Environment of a launched run: offline, CPU DeepSpeed, this folder importable, the venv's bin first on PATH."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_DISABLED="true",
        DS_ACCELERATOR="cpu",
        TORCH_EXTENSIONS_DIR=TORCH_EXTENSIONS_DIR,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), str(ROOT), env.get("PYTHONPATH", "")) if p),
        PATH=venv_path(env),
        VLM_GRPO_PROBE_DIR=str(probe_dir),
    )
    env.update(extra)
    return env


class Run:
    """The outcome of one launched command: return code, combined log, and whether it timed out."""

    def __init__(self, cmd: list[str], returncode: int, log: str, timed_out: bool, seconds: float):
        self.cmd, self.returncode, self.log, self.timed_out, self.seconds = (
            cmd,
            returncode,
            log,
            timed_out,
            seconds,
        )

    def tail(self, n: int = 3000) -> str:
        """The command, its outcome, the log's first traceback (usually the cause) and the log's end."""
        noise = ("FutureWarning", "return func(", "warnings.warn(")
        text = "\n".join(line for line in self.log.splitlines() if not any(s in line for s in noise))
        start = text.find("Traceback")
        first = text[start : start + 4000] + "\n[...]\n" if start >= 0 else ""
        head = (
            f"$ {' '.join(self.cmd)}\n[rc={self.returncode} timed_out={self.timed_out} {self.seconds:.0f}s]\n"
        )
        return head + first + text[-n:]


def start(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start `cmd` from the repository root in its own process group, its output (both streams) into `log_path`."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def finish(
    proc: subprocess.Popen, cmd: list[str], log_path: Path, started: float, timeout: int = RUN_TIMEOUT
) -> Run:
    """Wait for `proc` (from `start`); past `timeout` its whole process group is killed and the run marked so."""
    import time

    timed_out = False
    try:
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the workers it started, nothing else
        proc.wait()
    return Run(
        cmd, proc.returncode, log_path.read_text(errors="replace"), timed_out, time.monotonic() - started
    )


def launch(cmd: list[str], env: dict[str, str], log_path: Path, timeout: int = RUN_TIMEOUT) -> Run:
    """Run `cmd` from the repository root in its own process group; past `timeout` the whole group is killed."""
    import time

    started = time.monotonic()
    return finish(start(cmd, env, log_path), cmd, log_path, started, timeout)


def launcher_python() -> str:
    """The interpreter torchrun and accelerate start the workers with (their shebang; it can differ from
    `sys.executable` in spelling when the venv is reached through a symlink)."""
    first = (BIN / "torchrun").read_text().splitlines()[0]
    return first[2:].strip() if first.startswith("#!") else sys.executable


def build_deepspeed_cpu_ops(timeout: int = 900) -> subprocess.CompletedProcess:
    """JIT-build DeepSpeed's CPU shared-memory comm op (`deepspeed_shm_comm`), which every process of a CPU
    DeepSpeed run loads when it initialises deepspeed.comm.

    The first build takes 1.5 to 4 minutes on 2 busy cores; it is cached in `TORCH_EXTENSIONS_DIR` (the
    environment's, else `.pytest_cache/torch_extensions`) and reused while the compiler command is unchanged. The command holds the
    interpreter's site-packages path, so the build runs with the workers' interpreter: built with another
    spelling of the same venv, every run would rebuild it inside its own timeout. It also runs with the workers'
    PATH (`venv_path`): the venv's `ninja` (1.13) and a system one (1.11) hash the build log differently, so a
    build by one is stale to the other and the first run would rebuild it (about 2 minutes of its timeout).
    """
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR,
        "PATH": venv_path(dict(os.environ)),
    }
    return subprocess.run(
        [launcher_python(), "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------------------------------------------- probe
def _find_trainer() -> Any:
    """The `GRPOTrainer` whose step called the reward (found on the call stack), or None."""
    from trl import GRPOTrainer

    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, GRPOTrainer):
            return candidate
        frame = frame.f_back
    return None


def _describe_model(model: Any) -> dict[str, Any] | None:
    """Wrapper class, inner model class, ZeRO stage, and how much of its parameters this process holds."""
    if model is None:
        return None
    inner = getattr(model, "module", model)
    params = list(inner.parameters())
    partitioned = bool(params) and all(hasattr(p, "ds_id") for p in params)
    info: dict[str, Any] = {
        "wrapper": type(model).__name__,
        "class": type(inner).__name__,
        "zero_stage": model.zero_optimization_stage() if hasattr(model, "zero_optimization_stage") else None,
        "zero3_partitioned": partitioned,
        "numel": sum(p.numel() for p in params),
    }
    if partitioned:
        info["full_numel"] = sum(p.ds_numel for p in params)
        info["local_numel"] = sum(p.ds_tensor.numel() for p in params)
    return info


def probe_reward(completions, **kwargs) -> list[float]:
    """A reward that differs between completions of a group (so the policy gets a gradient), and a per-rank probe.

    The reward is the completion's length plus a fraction from its CRC32: two completions of a group get the same
    reward only when their texts are identical.
    """
    texts = [c[0]["content"] if isinstance(c, list) else str(c) for c in completions]
    probe_dir = os.environ.get("VLM_GRPO_PROBE_DIR")
    if probe_dir:
        trainer = _find_trainer()
        state = kwargs.get("trainer_state")
        record = {
            "rank": int(os.environ.get("RANK", "0")),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "global_step": getattr(state, "global_step", None),
            "ids": kwargs.get("id"),
            "num_images": [len(images or []) for images in kwargs.get("images", [None] * len(texts))],
            "num_videos": [len(videos or []) for videos in kwargs.get("videos", [None] * len(texts))],
            "policy": _describe_model(getattr(trainer, "model_wrapped", None)),
            "ref": _describe_model(getattr(trainer, "ref_model", None)),
        }
        with open(Path(probe_dir) / f"rank{record['rank']}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
    return [len(t) + (zlib.crc32(t.encode()) % 1000) / 1000 for t in texts]


def read_probe(probe_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """`{rank: [record per reward call, in order]}` written by `probe_reward`."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(probe_dir.glob("rank*.jsonl")):
        out[int(path.stem[4:])] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


# ---------------------------------------------------------------------------------------------------- checking
def load_state(output_dir: Path) -> dict[str, Any]:
    return json.loads((output_dir / "trainer_state.json").read_text())


def changed_weights(initial_dir: str, trained_dir: Path) -> dict[str, list[str]]:
    """Load both folders with `AutoModelForImageTextToText` and list the parameters that differ.

    Returns `{"language": [...], "vision": [...], "missing": [...]}` (parameter names; `missing` are keys the
    trained folder did not provide, reported by `from_pretrained`).
    """
    import torch
    from transformers import AutoModelForImageTextToText

    initial = AutoModelForImageTextToText.from_pretrained(initial_dir, dtype=torch.float32).state_dict()
    trained, info = AutoModelForImageTextToText.from_pretrained(
        str(trained_dir), dtype=torch.float32, output_loading_info=True
    )
    trained = trained.state_dict()
    out: dict[str, list[str]] = {"language": [], "vision": [], "missing": sorted(info["missing_keys"])}
    for name, value in initial.items():
        if not torch.equal(value, trained[name]):
            out["vision" if ".visual." in f".{name}" else "language"].append(name)
    return out


# ------------------------------------------------------------------------------------------------ fault rewards
# Rewards that inject a fault from inside a real run (single- or multi-process). Each returns `probe_reward`'s values
# (completion length plus a CRC fraction), so that runs with and without the fault train identically up to it.
def _text_reward(completions) -> list[float]:
    texts = [c[0]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [len(t) + (zlib.crc32(t.encode()) % 1000) / 1000 for t in texts]


def gated_reward(completions, trainer_state=None, **kwargs) -> list[float]:
    """Hold the run inside the optimizer step that starts at `$VLM_GRPO_GATE_STEP` until the test opens the gate.

    At that step each rank touches `$VLM_GRPO_GATE_DIR/waiting{RANK}` and waits (60 s at most) for the file
    `$VLM_GRPO_GATE_DIR/go`, which the test writes once it has sent its signal: the signal then lands inside that
    step, whatever the machine's load. Without `VLM_GRPO_GATE_DIR` it is a plain reward.
    """
    gate = os.environ.get("VLM_GRPO_GATE_DIR")
    if gate and trainer_state.global_step == int(os.environ["VLM_GRPO_GATE_STEP"]):
        import time

        Path(gate, f"waiting{os.environ.get('RANK', '0')}").touch()
        deadline = time.monotonic() + 60
        while not Path(gate, "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return _text_reward(completions)


def failing_reward(completions, trainer_state=None, **kwargs) -> list[float]:
    """Raise `RuntimeError` on rank `$VLM_GRPO_FAIL_RANK` only, from the step that starts at `$VLM_GRPO_FAIL_STEP`."""
    rank = os.environ.get("RANK", "0")
    if rank == os.environ.get("VLM_GRPO_FAIL_RANK") and trainer_state.global_step >= int(
        os.environ["VLM_GRPO_FAIL_STEP"]
    ):
        raise RuntimeError(f"reward service unreachable on rank {rank}")
    return _text_reward(completions)


def file_size_limit_reward(completions, trainer_state=None, **kwargs) -> list[float]:
    """From the step that starts at `$VLM_GRPO_FSIZE_STEP`, limit the size of any file this process writes to
    `$VLM_GRPO_FSIZE_BYTES` (`ulimit -f`; Python ignores SIGXFSZ, so a larger write fails with EFBIG)."""
    if trainer_state.global_step >= int(os.environ["VLM_GRPO_FSIZE_STEP"]):
        import resource

        limit = int(os.environ["VLM_GRPO_FSIZE_BYTES"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return _text_reward(completions)


def weight_difference(initial_dir: str | Path, a_dir: Path, b_dir: Path) -> tuple[float, int]:
    """The largest absolute difference between the `model.safetensors` of `a_dir` and `b_dir`, and how many
    tensors of `a_dir` differ from `initial_dir`'s (so that a test can tell that training moved the weights)."""
    from safetensors.torch import load_file

    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    initial = load_file(Path(initial_dir) / "model.safetensors")
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    moved = sum(
        not (k in initial and a[k].shape == initial[k].shape and (a[k] == initial[k]).all()) for k in a
    )
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a), moved


def wait_for(
    condition, what: str, proc: subprocess.Popen, log_path: Path, timeout: float = RUN_TIMEOUT
) -> None:
    """Poll `condition()` until it holds; fail with the log's end if `proc` exits first or `timeout` passes."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise AssertionError(f"never saw {what} (rc={proc.poll()})\n" + log_path.read_text()[-3000:])
        time.sleep(0.02)


def even_ids_agree(completions, id=None, **kwargs) -> list[float]:
    """Dynamic sampling's test reward: every completion of an even-`id` record gets 1.0 (a group with no spread,
    to be dropped), an odd one `probe_reward`'s varying value. With `shuffle_dataset: false` and one group per
    rank, rank 0 first sees even records and rank 1 odd ones."""
    varying = probe_reward(completions, id=id, **kwargs)
    return [1.0 if record_id % 2 == 0 else value for record_id, value in zip(id, varying, strict=True)]


# ------------------------------------------------------------------------------------------------------- tools
_ZOOM_CALLS = {"count": 0}


def zoom(region: int) -> list | str:
    """Show one quarter of the image, enlarged.

    Args:
        region: the quarter, 0 to 3.
    """
    from PIL import Image

    _ZOOM_CALLS["count"] += 1
    if (
        os.environ.get("RANK") == "1" and _ZOOM_CALLS["count"] % 2 == 0
    ):  # every second call on process 1: text
        return f"quarter {region} is red"
    return [
        {"type": "image", "image": Image.new("RGB", (32, 32), (220, 30, 30))},
        {"type": "text", "text": "zoomed"},
    ]


def count(word: str) -> str:
    """Count the letters of a word.

    Args:
        word: the word.
    """
    return str(len(word))


def tool_probe_reward(completions, trainer_state=None, **kwargs) -> list[float]:
    """`probe_reward`'s varying rewards over every turn, and per process and step what each row got back from its
    tools: `{"rows": [[calls, tool images], ...]}` in `tools_rank{RANK}.jsonl` of `VLM_GRPO_PROBE_DIR`."""
    rows = []
    for messages in completions:
        results = [m for m in messages if m["role"] == "tool"]
        images = sum(
            isinstance(p, dict) and p.get("type") == "image" for m in results for p in (m["content"] or [])
        )
        rows.append([len(results), images])
    probe_dir = os.environ.get("VLM_GRPO_PROBE_DIR")
    if probe_dir:
        with open(Path(probe_dir) / f"tools_rank{os.environ.get('RANK', '0')}.jsonl", "a") as f:
            f.write(json.dumps({"step": getattr(trainer_state, "global_step", None), "rows": rows}) + "\n")
    texts = [" ".join(str(m.get("content") or "") for m in messages) for messages in completions]
    return [len(t) + (zlib.crc32(t.encode()) % 1000) / 1000 for t in texts]
