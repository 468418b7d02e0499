"""Scale-out on CPU: real 2-process runs with torchrun, accelerate and `local_scripts/train_grpo.sh`.

Every test launches `python -m vlm_grpo.train` on 2 processes (gloo; DeepSpeed with `DS_ACCELERATOR=cpu`) for 2
steps of the tiny Qwen2-VL, under a timeout, so a hang fails the test instead of blocking CI. No mocks: the only
test-side code inside the runs is the dotted-path reward `dist_helpers.probe_reward`, which writes per-rank
evidence (see `tests/dist_helpers.py`).

Each run is checked for: return code 0 (torchrun/accelerate exit non-zero when any worker fails, aborts at exit
included: `vlm_grpo.runtime.shutdown` ends every rank without the interpreter's finalization, where gloo's threads abort); a finite loss
at both steps of `trainer_state.json`; language-model weights that moved; both ranks' reward calls at both steps
and both ranks' files in the step-2 checkpoint; a `checkpoint-2/model.safetensors` that
`AutoModelForImageTextToText.from_pretrained` loads with no missing key (under ZeRO-3: the 16-bit gather on save,
checked against the fp32 weights consolidated from the ZeRO shards).

`test_zero3_text_only_rank_and_image_rank` puts only text prompts on rank 0 and only image prompts on rank 1, with the
vision tower trained and frozen (then its features are computed once per generation batch and reused): a rank that
skipped the vision tower's ZeRO-3 parameter all-gathers the other runs would fail it (collective mismatch, or a hang
killed at the timeout).

Run them alone with `pytest -m distributed tests/test_distributed.py`; `-m "not distributed"` skips them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from dist_helpers import (
    BIN,
    ROOT,
    build_deepspeed_cpu_ops,
    changed_weights,
    free_port,
    launch,
    launch_env,
    load_state,
    read_probe,
    write_config,
    write_data,
)

from vlm_grpo.testing import DEFAULT_FAMILY
from vlm_grpo.testing.judge_server import judge_server, length_score

pytestmark = pytest.mark.distributed

ZERO2 = "local_scripts/zero2.json"
ZERO3 = "local_scripts/zero3.json"
IMAGES = ["image"] * 8


@pytest.fixture(scope="session")
def deepspeed_cpu_ops():
    """DeepSpeed's CPU shared-memory comm op, JIT-built once before the DeepSpeed runs (see `build_deepspeed_cpu_ops`)."""
    result = build_deepspeed_cpu_ops()
    assert result.returncode == 0, result.stdout[-3000:]


def torchrun_cmd(config: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "vlm_grpo.train",
        str(config),
        *extra,
    ]


def accelerate_cmd(config: Path, accelerate_config: str = "local_scripts/accelerate_zero3.yaml") -> list[str]:
    # The YAML's num_processes (8, for a GPU node) is overridden here. `--cpu` must NOT be passed: it sets
    # ACCELERATE_USE_CPU, under which accelerate turns DeepSpeed off; `use_cpu: true` in the training YAML is enough.
    return [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        accelerate_config,
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        "-m",
        "vlm_grpo.train",
        str(config),
    ]


def train(tmp_path: Path, model: str, make_cmd, layout=IMAGES, env_extra=None, **overrides):
    """Write data + config into `tmp_path`, launch `make_cmd(config)`, return (run, output_dir, probe)."""
    data = write_data(tmp_path / "data", layout)
    config = write_config(tmp_path, model, data, **overrides)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    run = launch(make_cmd(config), launch_env(probe_dir, **(env_extra or {})), tmp_path / "launch.log")
    return run, tmp_path / "run", read_probe(probe_dir)


def check_run(run, out: Path, probe: dict, model: str, zero_stage: int | None) -> dict:
    """The checks every run must pass; returns the trainer state."""
    assert not run.timed_out, "the run hung (killed at the timeout)\n" + run.tail()
    # A process that aborts at exit (a C++ thread torn down unjoined) fails the run after its work is done.
    assert "terminate called" not in run.log, run.tail()
    assert run.returncode == 0, run.tail()

    # Finite loss at both steps.
    state = load_state(out)
    assert state["global_step"] == 2, run.tail()
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), state["log_history"]
    # The probe reward separates the completions of a group, so the policy gets a gradient.
    assert any(entry.get("reward_std", 0) > 0 for entry in state["log_history"]), state["log_history"]

    # Both ranks took part in both steps: each computed rewards on its own slice at steps 0 and 1.
    assert sorted(probe) == [0, 1], f"per-rank probe files: {sorted(probe)}\n" + run.tail()
    for rank, records in probe.items():
        assert [r["global_step"] for r in records] == [0, 1], (rank, records)
        assert all(r["world_size"] == 2 and r["rank"] == rank for r in records), records
        wrapper = records[0]["policy"]["wrapper"]
        assert wrapper == ("DeepSpeedEngine" if zero_stage else "DistributedDataParallel"), records[0]
        if zero_stage:
            assert records[0]["policy"]["zero_stage"] == zero_stage, records[0]
            assert records[0]["policy"]["zero3_partitioned"] == (zero_stage == 3), records[0]

    # Both ranks reached the checkpoint at step 2 (each writes its own files there).
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "model.safetensors").exists(), sorted(p.name for p in out.iterdir())
    for rank in (0, 1):
        assert (checkpoint / f"rng_state_{rank}.pth").exists(), sorted(p.name for p in checkpoint.iterdir())
        if zero_stage:
            shard = checkpoint / "global_step2" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
            assert shard.exists(), sorted(p.name for p in (checkpoint / "global_step2").iterdir())

    # The final model and the checkpoint load, completely, and the language model was trained.
    for folder in (out, checkpoint):
        changed = changed_weights(model, folder)
        assert not changed["missing"], (
            f"{folder}: keys missing from the saved model: {changed['missing'][:5]}"
        )
        assert changed["language"], f"{folder}: no language-model weight changed after 2 steps"
    if zero_stage == 3:
        check_zero3_gather(checkpoint)
    return state


def check_zero3_gather(checkpoint: Path) -> None:
    """`model.safetensors` (16-bit gather on save) holds the same weights as the ZeRO-3 shards' fp32 masters."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForImageTextToText

    masters = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    saved = AutoModelForImageTextToText.from_pretrained(str(checkpoint), dtype=torch.float32).state_dict()
    assert set(masters) <= set(saved), sorted(set(masters) - set(saved))[:5]
    different = [k for k, v in masters.items() if not torch.allclose(v.float(), saved[k], atol=1e-6)]
    assert not different, f"gathered weights differ from the ZeRO-3 shards: {different[:5]}"


# ------------------------------------------------------------------------------------------------------ 1. torchrun
@pytest.mark.parametrize(
    ("name", "extra", "zero_stage"),
    [("zero3", ("--deepspeed", ZERO3), 3), ("zero2", ("--deepspeed", ZERO2), 2), ("ddp", (), None)],
)
def test_torchrun(tiny_model, tmp_path, deepspeed_cpu_ops, name, extra, zero_stage):
    """`torchrun --nproc_per_node 2 -m vlm_grpo.train CONFIG.yaml [--deepspeed local_scripts/zeroN.json]`.

    zero3: `from_pretrained` runs under `deepspeed.zero.Init`, whose DeepSpeed config must see both processes
    (with `use_cpu` the process group is made by accelerate, not DeepSpeed; see `vlm_grpo.train.init_deepspeed_comm`).
    """
    model = tiny_model(DEFAULT_FAMILY)
    run, out, probe = train(tmp_path, model, lambda config: torchrun_cmd(config, *extra))
    check_run(run, out, probe, model, zero_stage)


# -------------------------------------------------------------------------------------------- 2. accelerate launch
def test_accelerate_launch_zero3(tiny_model, tmp_path, deepspeed_cpu_ops):
    """`accelerate launch --config_file local_scripts/accelerate_zero3.yaml --num_processes 2 -m vlm_grpo.train`."""
    model = tiny_model(DEFAULT_FAMILY)
    run, out, probe = train(tmp_path, model, accelerate_cmd)
    check_run(run, out, probe, model, zero_stage=3)


# ------------------------------------------------------------------------------ 3. reference model under ZeRO-3
def test_zero3_reference_model_is_the_vlm_sharded_like_the_policy(tiny_model, tmp_path, deepspeed_cpu_ops):
    """beta > 0 under ZeRO-3: the reference model is loaded with the VLM class and partitioned like the policy,
    and the KL against it is logged and positive once the policy has moved (step 2)."""
    model = tiny_model(DEFAULT_FAMILY)
    run, out, probe = train(tmp_path, model, accelerate_cmd, beta=0.1)
    state = check_run(run, out, probe, model, zero_stage=3)

    kls = [entry["kl"] for entry in state["log_history"] if "kl" in entry]
    assert len(kls) == 2 and all(math.isfinite(k) for k in kls), state["log_history"]
    assert kls[1] > 0, f"KL at step 2 should be > 0 after one update: {kls}"

    # Inside each process (read by the probe reward from the running trainer): the reference model is a
    # DeepSpeed engine at stage 3 around the same VLM class as the policy, and each rank holds only its shard.
    for rank, records in probe.items():
        policy, ref = records[0]["policy"], records[0]["ref"]
        assert ref is not None, f"rank {rank}: no reference model with beta=0.1"
        assert ref["class"] == policy["class"] == "Qwen2VLForConditionalGeneration", (policy, ref)
        assert ref["wrapper"] == "DeepSpeedEngine" and ref["zero_stage"] == 3, ref
        assert ref["zero3_partitioned"] and policy["zero3_partitioned"], (policy, ref)
        assert ref["full_numel"] == policy["full_numel"], (policy, ref)
        assert ref["local_numel"] < ref["full_numel"] * 0.75, (
            f"rank {rank}: reference model not sharded: {ref}"
        )


# ---------------------------------------------------------------------------------------- 4. train_grpo.sh, 1 node
@pytest.mark.parametrize(
    ("name", "extra", "zero_stage"), [("ddp", (), None), ("zero3", ("--deepspeed", ZERO3), 3)]
)
def test_train_grpo_sh_single_node(tiny_model, tmp_path, deepspeed_cpu_ops, name, extra, zero_stage):
    """`NPROC_PER_NODE=2 DEEPSPEED= bash local_scripts/train_grpo.sh CONFIG.yaml --field value [--deepspeed ...]`:
    plain DDP, and ZeRO-3 asked for by a flag that the script forwards."""
    model = tiny_model(DEFAULT_FAMILY)
    port = str(free_port())
    env = {"NPROC_PER_NODE": "2", "MASTER_PORT": port, "DEEPSPEED": ""}
    script = str(ROOT / "local_scripts" / "train_grpo.sh")
    run, out, probe = train(
        tmp_path,
        model,
        lambda config: ["bash", script, str(config), "--seed", "1", *extra],
        env_extra=env,
    )
    check_run(run, out, probe, model, zero_stage=zero_stage)
    import torch

    # The flag after the config reached the trainer through the script.
    assert torch.load(out / "training_args.bin", weights_only=False).seed == 1


# ------------------------------------------------------------- 5. ZeRO-3: a text-only rank beside an image rank
@pytest.mark.parametrize("freeze_vision", [False, True], ids=["vision-trained", "vision-frozen"])
def test_zero3_text_only_rank_and_image_rank(tiny_model, tmp_path, deepspeed_cpu_ops, freeze_vision):
    """Under ZeRO-3 every rank must run the same parameter all-gathers. Rows alternate text, image (not shuffled),
    so with one prompt per rank and step, rank 0 holds only text prompts and rank 1 only image prompts at both
    steps; the vision tower runs on rank 1 only. The run must still complete and pass the usual checks.

    Trained vision: the text-only rank runs the vision tower on a dummy image row in each log-prob pass (see
    `vlm_grpo.policy.vision_dummy`). Frozen vision: image features are computed once per generation batch, with the whole
    model gathered on every rank. Without either, the first training forward desyncs: rank 1 all-gathers a vision
    parameter while rank 0 all-gathers a language-model one (gloo aborts with "Received data size doesn't match
    expected size"; with TORCH_DISTRIBUTED_DEBUG=DETAIL: "Detected mismatch between collectives"), or a hang is
    killed at RUN_TIMEOUT.
    """
    model = tiny_model(DEFAULT_FAMILY)
    run, out, probe = train(
        tmp_path,
        model,
        accelerate_cmd,
        layout=["text", "image", "text", "image"],
        env_extra={"PYTHONFAULTHANDLER": "1"},  # a rank aborted by gloo prints its Python stack
        freeze_vision_modules=freeze_vision,
    )
    # The layout the test is about: each rank wrote its rows' image counts from inside the run (step 0 at least,
    # which is after generation), rank 0 only text rows, rank 1 only image rows.
    images = {rank: sorted({n for r in records for n in r["num_images"]}) for rank, records in probe.items()}
    assert images == {0: [0], 1: [1]}, f"images per row on each rank: {images}\n" + run.tail()
    check_run(run, out, probe, model, zero_stage=3)


# ------------------------------------------------------------- 6. ZeRO-3: ranks whose prompts hold different media
@pytest.mark.parametrize(
    "layout, freeze_vision, media",
    [
        (["text", "video"], False, {0: ([0], [0]), 1: ([0], [1])}),
        (["image", "image+video"], False, {0: ([1], [0]), 1: ([1], [1])}),
        (["image", "image+video"], True, {0: ([1], [0]), 1: ([1], [1])}),
    ],
    ids=["text-rank-video-rank", "image-rank-image-and-video-rank", "image-rank-image-and-video-rank-frozen"],
)
def test_zero3_ranks_with_different_media(
    tiny_model, tmp_path, deepspeed_cpu_ops, layout, freeze_vision, media
):
    """Under ZeRO-3 every rank must run the vision tower as many times per forward. A prompt's images and its videos
    are two vision-tower calls (the model's `get_image_features` and `get_video_features`), so a rank holding a
    video beside a rank holding only text, or a rank holding images and a video beside a rank holding only images,
    desyncs the gathers unless each log-prob forward runs the same kinds of media on every rank (a dummy row of
    the kinds a rank lacks; see `vlm_grpo.policy.vision_dummy`). Frozen vision computes every feature once per generation
    batch with the whole model gathered. Rows alternate as `layout` says, so rank 0 holds only the first kind.
    """
    model = tiny_model(DEFAULT_FAMILY)
    run, out, probe = train(
        tmp_path,
        model,
        accelerate_cmd,
        layout=layout * 2,
        env_extra={"PYTHONFAULTHANDLER": "1"},
        freeze_vision_modules=freeze_vision,
    )
    held = {
        rank: tuple(sorted({n for r in records for n in r[key]}) for key in ("num_images", "num_videos"))
        for rank, records in probe.items()
    }
    assert held == media, f"(images, videos) per row on each rank: {held}\n" + run.tail()
    check_run(run, out, probe, model, zero_stage=3)


# ------------------------------------------------------------------------------------ 5. a model as the judge
def test_zero3_judge_scores_each_ranks_rows(tiny_model, tmp_path, deepspeed_cpu_ops):
    """A `judge` reward (an OpenAI-compatible endpoint, here the stand-in judge in this process) under ZeRO-3 on 2
    processes whose rows differ (text-only on rank 0, images on rank 1): each rank sends its own rows, the run trains,
    and the sample log holds every rank's rows with the judge's reward and reply next to each completion."""
    model = tiny_model(DEFAULT_FAMILY)
    judge = {"name": "judge", "url": None, "model": "judge", "template": "{completion}"}
    with judge_server() as server:
        judge["url"] = server.url
        run, out, probe = train(
            tmp_path, model, accelerate_cmd, layout=["text", "image"] * 4, log_samples_steps=1,
            rewards=["dist_helpers.probe_reward", judge],
        )  # fmt: skip
        asked = len(server.requests)
    check_run(run, out, probe, model, zero_stage=3)
    for step in (1, 2):
        groups = [
            json.loads(line) for line in (out / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        assert len(groups) == 2  # one group per rank
        completions = [c for group in groups for c in group["completions"]]
        rewards, replies = (
            [r for g in groups for r in g[key][name]]
            for key, name in (("rewards", "judge"), ("logged", "judge_reply"))
        )
        assert rewards == pytest.approx(
            [int(length_score(c)) / 10 for c in completions]
        )  # float32 in the log
        assert replies == [length_score(c) for c in completions]
    assert 0 < asked <= 8  # 2 steps x 2 ranks x 2 completions, identical ones asked once
