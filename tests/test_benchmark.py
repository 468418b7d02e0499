"""The benchmark scripts run end to end on tiny models: both trainers, in turn, each in its own process; a given model
folder, or an architecture's config with random weights; and the CUDA rows of `plan_vs_measured.py` as far as a CPU
goes (their predictions)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vlm_grpo.planner.architectures import PUBLISHED

pytestmark = pytest.mark.once  # the benchmark scripts' smoke runs: `make test` runs them, the floor does not
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BENCH = BENCHMARKS / "bench_grpo.py"
PLAN_VS_MEASURED = BENCHMARKS / "plan_vs_measured.py"
QWEN2_5_VL_3B = "Qwen/Qwen2.5-VL-3B-Instruct"


def run(script: Path, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def trainer_rows(out: str) -> dict[str, list[str]]:
    """The table rows of `bench_grpo.py`'s output, by trainer: the columns after the name."""
    return {m[1]: m[2].split() for m in re.finditer(r"^(stock|ours_full|ours) +(.*)$", out, re.M)}


def tiny_published_config(folder: Path) -> Path:
    """Qwen2.5-VL-3B's published config with tiny dimensions (64 wide, 2 layers, vocabulary 1024) in `folder`, with
    its processor's image-size settings capped at 56x56 pixels; no tokenizer, no weights."""
    fields = copy.deepcopy(PUBLISHED[QWEN2_5_VL_3B])
    fields.pop("processor")
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}  # head_dim 16
    fields["text_config"].update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=1024, rope_parameters=rope)  # fmt: skip
    fields["vision_config"].update(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                   fullatt_block_indexes=[1])  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    (folder / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 784, "max_pixels": 3136}))
    return folder


def test_benchmark_smoke_alternates_processes_and_prints_ratios():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--steps", "2", "--warmup", "0", "--shape", "short", "--device", "cpu"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "each trainer in its own process" in out
    # strictly alternating, as read from the steps' start times
    assert "step order: stock ours stock ours\n" in out
    assert "WARNING: " not in out  # every completion has the forced length (DeepSpeed logs "[WARNING]")
    rows = trainer_rows(out)
    for name in ("stock", "ours"):
        median, generate, tokens, peak = (float(rows[name][k]) for k in (0, 3, 4, 6))
        assert median > 0 and peak > 0
        assert 0 < generate < median  # the timed `generate` is part of the step
        assert tokens == 4 * (20 + 64)  # G=4 samples of a 20-token prompt and 64 completion tokens
        # 4 samples x 16 patch rows (one 56x56 image), in generation and in the training pass
        assert rows[name][-1] == "128"
    ratio = float(re.search(r"^ratio short_prompt: ([0-9.]+)$", out, re.M)[1])
    assert abs(ratio - float(rows["ours"][0]) / float(rows["stock"][0])) < 0.01


def test_benchmark_video_shape_compares_full_rows_with_sharing():
    """The video shape has no stock TRL row (TRL's GRPO reads no video): ours with full rows is its baseline, ours
    sharing each group's prompt beside it; both encode the same 8-frame video, 8 x 448 x 448 / 14^2 / 2 = 4096 ViT
    patches per step, and the ratio is ours over ours with full rows."""
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--steps", "1", "--warmup", "0", "--shape", "video", "--device", "cpu"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "step order: ours_full ours\n" in out and "one 8-frame 448x448 video" in out
    rows = trainer_rows(out)
    assert set(rows) == {"ours_full", "ours"}
    assert rows["ours_full"][4] == rows["ours"][4] and rows["ours"][-1] == rows["ours_full"][-1] == "4096"
    ratio = float(re.search(r"^ratio recipe_video: ([0-9.]+)$", out, re.M)[1])
    assert abs(ratio - float(rows["ours"][0]) / float(rows["ours_full"][0])) < 0.01


def test_benchmark_trains_a_given_model_folder(tiny_model):
    folder = tiny_model("qwen2_5_vl")
    proc = run(
        BENCH, "--model", folder, "--steps", "2", "--warmup", "0", "--shape", "short", "--device", "cpu"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"model: {folder};" in out
    assert f"model {folder}, 0.2M params, vocab 338, weights from the folder" in out
    assert "step order: stock ours stock ours\n" in out
    assert "WARNING: " not in out
    rows = trainer_rows(out)
    for name in ("stock", "ours"):
        median, generate, tokens, peak, prompt = (float(rows[name][k]) for k in (0, 3, 4, 6, 7))
        assert median > 0 and peak > 0 and 0 < generate < median
        # Qwen2.5-VL's default system turn (11 tokens) before the 20 tokens of the built model's prompt
        assert prompt == 31 and tokens == 4 * (31 + 64)
        assert rows[name][8:11] == ["64", "/", "64.0"]
        assert rows[name][-1] == "128"  # the hook found this family's vision tower
    ratio = float(re.search(r"^ratio short_prompt: ([0-9.]+)$", out, re.M)[1])
    assert abs(ratio - float(rows["ours"][0]) / float(rows["stock"][0])) < 0.01


def test_benchmark_builds_random_weights_from_a_published_config_for_the_recipe_shape(tmp_path):
    config = tiny_published_config(tmp_path / "config")
    proc = run(BENCH, "--model", config, "--random_weights", "--shape", "recipe", "--image_side", "56", "--steps",
               "1", "--warmup", "0", "--device", "cpu")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    header = "== recipe: G=8, 128 completion tokens, 1 x 56x56 image, LoRA on the language model, gradient "
    header += (
        f"checkpointing, beta 0.04, fp32, model {config / 'config.json'}, 0.2M params, vocab 1024, random "
    )
    assert header + "weights, a stand-in tokenizer and processor" in out
    assert "WARNING: " not in out  # all 8 completions 128 tokens long in both trainers
    rows = trainer_rows(out)
    for name in ("stock", "ours"):
        median, generate, tokens, peak, prompt = (float(rows[name][k]) for k in (0, 3, 4, 6, 7))
        assert median > 0 and peak > 0 and 0 < generate < median
        # 4 image tokens and 52 of text: at 896x896, 1024 + 52 = 1,076 as with the published tokenizer
        assert prompt == 56 and tokens == 8 * (56 + 128)
        assert rows[name][8:13] == ["128", "/", "128.0", "/", "128"]
    # 16 patch rows per image: stock encodes it for 8 rows in generation, the reference and the policy pass;
    # ours once per step (vision frozen under LoRA)
    assert rows["stock"][-1] == str(3 * 8 * 16) and rows["ours"][-1] == "16"
    ratio = float(re.search(r"^ratio recipe: ([0-9.]+)$", out, re.M)[1])
    assert abs(ratio - float(rows["ours"][0]) / float(rows["stock"][0])) < 0.01


def test_published_architecture_gets_a_stand_in_tokenizer_sized_to_its_config(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_grpo
    from PIL import Image
    from transformers import AutoConfig, GenerationConfig

    from vlm_grpo.errors import VLMGRPOError
    from vlm_grpo.models import get_model_family

    folder, desc = bench_grpo.prepare_model(QWEN2_5_VL_3B, True, tmp_path)
    assert desc.startswith(
        f"{QWEN2_5_VL_3B} (published config.json), 3.75B params, vocab 151936, random weights"
    )
    assert not list(Path(folder).glob("*.safetensors"))  # each trainer builds the weights itself
    config = AutoConfig.from_pretrained(folder)
    assert (config.text_config.hidden_size, config.text_config.num_hidden_layers) == (2048, 36)
    family = get_model_family(config)
    processor = family.load_processor(folder)
    tokenizer = processor.tokenizer
    assert len(tokenizer) == config.text_config.vocab_size == 151936
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert tokenizer.eos_token_id in GenerationConfig.from_pretrained(folder).eos_token_id
    size = processor.image_processor.size  # the published min_pixels and max_pixels
    assert (size["shortest_edge"], size["longest_edge"]) == (3136, 12845056)
    prompt = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": bench_grpo.LONG_QUESTION}]}
    ]
    encoded = family.encode_prompt(processor, prompt, [Image.new("RGB", (896, 896))])
    assert (len(encoded.input_ids), encoded.input_ids.count(config.image_token_id)) == (1076, 1024)
    targets = bench_grpo.language_lora(folder).target_modules
    assert len(targets) == 36 * 7 and not any("visual" in t for t in targets)
    with pytest.raises(ValueError, match="no such folder"):
        bench_grpo.prepare_model(QWEN2_5_VL_3B, False, tmp_path)
    with pytest.raises(ValueError, match="holds no weights"):
        bench_grpo.prepare_model(folder, False, tmp_path)
    with pytest.raises(VLMGRPOError, match="no published config known"):
        bench_grpo.prepare_model("someone/unknown-model", True, tmp_path)


def test_random_weights_keep_a_folders_tokenizer_and_are_the_same_in_every_process(
    tiny_model, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_grpo
    from transformers import AutoModelForImageTextToText

    folder = tiny_model("qwen2_5_vl")  # config, tokenizer and processor, as a published checkpoint's files
    used, desc = bench_grpo.prepare_model(folder, True, tmp_path)
    assert used == folder and desc.endswith("random weights, the folder's tokenizer and processor")
    assert not list(tmp_path.iterdir())  # no stand-in made
    first, second = (bench_grpo.random_model(folder, torch.bfloat16, "cpu", seed=3) for _ in range(2))
    saved = AutoModelForImageTextToText.from_pretrained(folder)
    assert first.name_or_path == folder and first.config._attn_implementation == "sdpa"
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert a.dtype == torch.bfloat16 or not a.is_floating_point(), name
        assert torch.equal(a, b), name  # both trainers' processes hold the same weights
    assert not torch.equal(first.lm_head.weight.float(), saved.lm_head.weight)  # not the folder's


def test_plan_vs_measured_cuda_rows_are_planned_at_their_real_size_on_the_cpu():
    proc = run(PLAN_VS_MEASURED, "--device", "cuda", "--plan_only")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("Qwen2.5-VL-")]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("Qwen2.5-VL-3B-Instruct", "3.75B", "no"),
        ("Qwen2.5-VL-3B-Instruct", "3.75B", "yes"),
        ("Qwen2.5-VL-7B-Instruct", "8.29B", "yes"),
    ]
    held, adds, peak = ({r[0] + r[2]: float(r[k]) for r in rows} for k in (8, 10, 12))
    # the rows measured on a GPU: full fine-tuning at 448x448 (256 + 52 tokens), LoRA at 896x896 (1024 + 52)
    assert [r[3:8] for r in rows] == [
        ["0.0", "off", "8", "128", "308"],
        ["0.04", "on", "8", "128", "1076"],
        ["0.04", "on", "8", "256", "1076"],
    ]
    for r in rows:
        assert r[9] == r[11] == r[13] == r[14] == r[15] == r[16] == r[17] == "-"  # nothing measured
        key = r[0] + r[2]
        assert abs(held[key] + adds[key] - peak[key]) <= 1  # printed in whole MiB
        assert 0 < adds[key] < held[key]
    weights_3b = 3.75e9 * 2 / 2**20  # bf16
    assert weights_3b < held["Qwen2.5-VL-3B-Instructyes"] < 1.1 * weights_3b  # weights, LoRA and its states
    assert held["Qwen2.5-VL-3B-Instructno"] > 2 * held["Qwen2.5-VL-3B-Instructyes"]  # + AdamW states
    assert held["Qwen2.5-VL-7B-Instructyes"] > 2 * held["Qwen2.5-VL-3B-Instructyes"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_plan_vs_measured_cuda_measurement_needs_cuda():
    proc = run(PLAN_VS_MEASURED, "--device", "cuda", "--only", "1", timeout=120)
    assert proc.returncode == 2
    assert "--device cuda but CUDA is not available" in proc.stderr


@pytest.mark.gpu
def test_benchmarks_measure_a_tiny_published_config_on_cuda(tmp_path):
    config = tiny_published_config(tmp_path / "config")
    proc = run(BENCH, "--device", "cuda", "--bf16", "--model", config, "--random_weights", "--shape", "recipe",
               "--steps", "1", "--warmup", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING: " not in proc.stdout
    rows = trainer_rows(proc.stdout)
    for name in ("stock", "ours"):
        assert float(rows[name][0]) > 0 and float(rows[name][6]) > 0
    assert re.search(r"^ratio recipe: [0-9.]+$", proc.stdout, re.M)
    proc = run(PLAN_VS_MEASURED, "--device", "cuda", "--model", config, "--only", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING: " not in proc.stdout
    (row,) = [line.split() for line in proc.stdout.splitlines() if line.startswith("config ")]
    held, peak, reserved = float(row[9]), float(row[13]), float(row[15])  # whole MiB: a tiny model holds ~0
    assert 0 <= held <= peak <= reserved and reserved > 0
    assert float(row[16]) > 0 and float(row[17]) > 0  # the ratios


@pytest.mark.vllm
def test_bench_async_times_both_runs_on_one_server():
    """`bench_async.py --smoke`: a `trl vllm-serve` on one core, a synchronous and an asynchronous run on the other,
    their median steps and the ratio printed; the asynchronous run sampled ahead (staleness 1) and the server is gone
    at the end."""
    proc = run(BENCHMARKS / "bench_async.py", "--smoke", "--steps", "2", "--warmup", "1", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"server on core \d+, trainer on [\d,]+; 2 timed steps after 1", lines[-4]), lines
    assert lines[-3].startswith("synchronous") and "staleness max 0" in lines[-3]
    assert lines[-2].startswith("async_rollouts") and "staleness max 1" in lines[-2]
    ratio = float(re.fullmatch(r"ratio async_rollouts: ([\d.]+)", lines[-1])[1])
    assert ratio > 0
