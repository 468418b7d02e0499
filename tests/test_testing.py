"""Tests of ``vlm_grpo.testing``: the tiny offline vision-language models used by the other tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoProcessor

from vlm_grpo.testing import DEFAULT_WORDS, TAG_TOKENS, TINY_FAMILIES, UNK_TOKEN, build_tiny_model

FAMILIES = list(TINY_FAMILIES)
LAYOUT_FAMILIES = [
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "gemma3", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe",
]  # fmt: skip
"""Shapes whose chat layout, tokenizer and processor the per-family tables below describe in detail. The layouts of
gemma4, glm4v, glm46v and glm4v_moe are checked in their own test files (test_families_*.py); every shape, these included, goes
through `test_every_shape_saves_loads_and_trains` and the seed and size tests."""

# Parameters the family's forward never uses (none: Gemma 3's SigLIP tower is built without its pooling head).
KNOWN_UNUSED: dict[str, set[str]] = {family: set() for family in FAMILIES}

# Chat turn end, which must be one of the generation eos ids (the published order: Qwen's first, Gemma 3's after <eos>).
TURN_END = {
    "qwen2_vl": "<|im_end|>",
    "qwen2_5_vl": "<|im_end|>",
    "qwen3_vl": "<|im_end|>",
    "internvl": "<|im_end|>",
    "gemma3": "<end_of_turn>",
    "qwen3_vl_moe": "<|im_end|>",
    "qwen3_5": "<|im_end|>",
    "qwen3_5_moe": "<|im_end|>",
}
# Token repeated once per visual embedding in ``input_ids``.
IMAGE_TOKEN = {
    "qwen2_vl": "<|image_pad|>",
    "qwen2_5_vl": "<|image_pad|>",
    "qwen3_vl": "<|image_pad|>",
    "internvl": "<IMG_CONTEXT>",
    "gemma3": "<image_soft_token>",
    "qwen3_vl_moe": "<|image_pad|>",
    "qwen3_5": "<|image_pad|>",
    "qwen3_5_moe": "<|image_pad|>",
    "gemma4": "<|image|>",
    "glm4v": "<|image|>",
    "glm46v": "<|image|>",
    "glm4v_moe": "<|image|>",
    "internvl_moe": "<IMG_CONTEXT>",
}
# Image tokens of one image at the builder's default `image_size` (56) and at `image_size=112`: one per merged patch
# block (2x2, 4x4), except Gemma 4, whose processor gives every image its fixed soft-token budget.
TOKENS_AT_56 = {family: 4 for family in FAMILIES} | {"gemma4": 64}
TOKENS_AT_112 = {family: 16 for family in FAMILIES} | {"gemma4": 64}
# Module name prefixes of the vision side (tower + projector) in the loaded model.
VISION_PREFIXES = {
    "qwen2_vl": ("model.visual.",),
    "qwen2_5_vl": ("model.visual.",),
    "qwen3_vl": ("model.visual.",),
    "internvl": ("model.vision_tower.", "model.multi_modal_projector."),
    "gemma3": ("model.vision_tower.", "model.multi_modal_projector."),
    "qwen3_vl_moe": ("model.visual.",),
    "qwen3_5": ("model.visual.",),
    "qwen3_5_moe": ("model.visual.",),
}
# Families whose tokenizer is a byte-level BPE (transformers always loads Qwen3.5's as `Qwen3_5Tokenizer`).
BYTE_LEVEL = {"qwen3_5", "qwen3_5_moe"}
ARCHITECTURE = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "internvl": "InternVLForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "gemma4": "Gemma4ForConditionalGeneration",
    "glm4v": "Glm4vForConditionalGeneration",
    "glm46v": "Glm46VForConditionalGeneration",
    "glm4v_moe": "Glm4vMoeForConditionalGeneration",
    "internvl_moe": "InternVLForConditionalGeneration",
}
MODEL_TYPE = {family: family for family in FAMILIES} | {"internvl_moe": "internvl"}


def square_image(color: tuple[int, int, int] = (255, 0, 0), size: int = 56) -> Image.Image:
    """A ``size`` x ``size`` grey RGB image with a centred coloured square of half its side."""
    image = Image.new("RGB", (size, size), (128, 128, 128))
    image.paste(color, (size // 4, size // 4, 3 * size // 4, 3 * size // 4))
    return image


def one_image_conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Answer with one word ."},
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What color is the square?"}],
        },
    ]


def two_image_conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": [{"type": "text", "text": "Output the final answer in tags ."}]},
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "left"},
                {"type": "image"},
                {"type": "text", "text": "right . Which picture is blue?"},
            ],
        },
        {"role": "assistant", "content": "<think> blue </think> <answer> right </answer>"},
        {"role": "user", "content": [{"type": "text", "text": "Why?"}]},
    ]


def count(input_ids: torch.Tensor, token_id: int) -> int:
    return int((input_ids == token_id).sum())


@pytest.fixture(scope="module", params=LAYOUT_FAMILIES)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(family, directory) of a model built once per family for this module."""
    family = request.param
    out = tmp_path_factory.mktemp(family)
    assert build_tiny_model(family, out) == str(out)
    return family, out


@pytest.fixture(scope="module")
def loaded(built: tuple[str, Path]) -> tuple[str, Any, Any]:
    """(family, model, processor) reloaded from disk with the Auto classes."""
    family, out = built
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    return family, model, processor


def test_unknown_family_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny model family 'llava'") as info:
        build_tiny_model("llava", tmp_path)
    for family in TINY_FAMILIES:
        assert family in str(info.value)


def test_saved_files_and_config(built: tuple[str, Path]) -> None:
    family, out = built
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "processor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family
    assert config["architectures"] == [ARCHITECTURE[family]]
    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_shape_saves_loads_and_trains(family: str, tmp_path: Path) -> None:
    """Every registered builder: a float32 model of its model type that the Auto classes load, with 4 image tokens
    per 56x56 image (Gemma 4: its budget), and one image prompt's loss reaching every parameter."""
    out = Path(build_tiny_model(family, tmp_path))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (MODEL_TYPE[family], [ARCHITECTURE[family]])
    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values())
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) < 500_000
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[square_image()], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    assert count(batch["input_ids"], image_token_id) == TOKENS_AT_56[family]
    model.train()
    output = model(**batch, labels=batch["input_ids"].clone())
    assert torch.isfinite(output.loss)
    output.loss.backward()
    no_grad = [name for name, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
    assert no_grad == []


def test_reload_sizes_and_ids(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    tokenizer = processor.tokenizer
    assert type(model).__name__ == ARCHITECTURE[family]
    assert model.config.model_type == family
    assert sum(p.numel() for p in model.parameters()) < 500_000
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)

    config, text_config = model.config, model.config.get_text_config()
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    assert image_token_id != tokenizer.unk_token_id
    assert (getattr(config, "image_token_id", None) or config.image_token_index) == image_token_id
    assert text_config.pad_token_id == tokenizer.pad_token_id
    if getattr(text_config, "eos_token_id", None) is not None:
        eos = text_config.eos_token_id
        assert tokenizer.eos_token_id in (eos if isinstance(eos, list) else [eos])

    generation_config = model.generation_config
    turn_end_id = tokenizer.convert_tokens_to_ids(TURN_END[family])
    assert turn_end_id in generation_config.eos_token_id
    assert tokenizer.eos_token_id in generation_config.eos_token_id
    assert generation_config.pad_token_id == tokenizer.pad_token_id
    if family == "gemma3":
        assert generation_config.bos_token_id == tokenizer.bos_token_id == text_config.bos_token_id
        assert config.boi_token_index == tokenizer.convert_tokens_to_ids("<start_of_image>")
        assert config.eoi_token_index == tokenizer.convert_tokens_to_ids("<end_of_image>")
    if family.startswith("qwen"):
        assert config.video_token_id == tokenizer.convert_tokens_to_ids("<|video_pad|>")
        assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
        assert config.vision_end_token_id == tokenizer.convert_tokens_to_ids("<|vision_end|>")
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl"):
        assert processor.video_processor is not None


def test_chat_template_layout(loaded: tuple[str, Any, Any]) -> None:
    family, _, processor = loaded
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    no_prompt = processor.apply_chat_template(one_image_conversation(), tokenize=False)
    two = processor.apply_chat_template(two_image_conversation(), add_generation_prompt=True, tokenize=False)
    plain = processor.apply_chat_template(
        [{"role": "user", "content": "What is red?"}], add_generation_prompt=True, tokenize=False
    )
    if family == "gemma3":
        assert text == (
            "<bos><start_of_turn>user\nAnswer with one word .\n\n<start_of_image>What color is the square?"
            "<end_of_turn>\n<start_of_turn>model\n"
        )
        assert plain == "<bos><start_of_turn>user\nWhat is red?<end_of_turn>\n<start_of_turn>model\n"
        assert two.count("<start_of_image>") == 2
        assert "<start_of_turn>model\n<think> blue </think> <answer> right </answer><end_of_turn>\n" in two
        assert no_prompt == text.removesuffix("<start_of_turn>model\n")
        return
    image = "<|vision_start|><|image_pad|><|vision_end|>" if family.startswith("qwen") else "<IMG_CONTEXT>\n"
    assert text == (
        "<|im_start|>system\nAnswer with one word .<|im_end|>\n"
        f"<|im_start|>user\n{image}What color is the square?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Qwen2-VL's and Qwen2.5-VL's templates open with a default system turn when the messages give none
    default = "You are a helpful assistant." if family in ("qwen2_vl", "qwen2_5_vl") else None
    system = f"<|im_start|>system\n{default}<|im_end|>\n" if default else ""
    assert plain == f"{system}<|im_start|>user\nWhat is red?<|im_end|>\n<|im_start|>assistant\n"
    assert two.count(image) == 2
    assert "<|im_start|>assistant\n<think> blue </think> <answer> right </answer><|im_end|>\n" in two
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")


def test_tokenizer_words_tags_and_decode(loaded: tuple[str, Any, Any]) -> None:
    family, _, processor = loaded
    tokenizer = processor.tokenizer
    text = "What color is the box? [red], <think> a </think><answer> 3 </answer>"
    ids = tokenizer(text)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    if family in BYTE_LEVEL:  # every word one token, its leading space included; decoding gives the text back
        words = [t.removeprefix("Ġ") for t in tokens if t.removeprefix("Ġ")]
        assert words == ["What", "color", "is", "the", "box", "?", "[", "red", "]", ",", *TAG_TOKENS[:1], "a",
                         TAG_TOKENS[1], TAG_TOKENS[2], "3", TAG_TOKENS[3]]  # fmt: skip
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
        assert all(len(tokenizer(tag)["input_ids"]) == 1 for tag in TAG_TOKENS)
        return
    assert tokens == [
        "What", "color", "is", "the", "box", "?", "[", "red", "]", ",",
        "<think>", "a", "</think>", "<answer>", "3", "</answer>",
    ]  # fmt: skip
    assert tokenizer.unk_token_id not in ids
    for tag in TAG_TOKENS:
        assert len(tokenizer(tag)["input_ids"]) == 1
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == "What color is the box ? [ red ] , <think> a </think> <answer> 3 </answer>"
    assert tokenizer.convert_tokens_to_ids("zebra") == tokenizer.unk_token_id
    assert tokenizer.unk_token == UNK_TOKEN


def check_image_token_count(family: str, processor: Any, batch: Any, num_images: int) -> int:
    """Check that the image tokens in ``batch.input_ids`` match what the processor reports; return their count."""
    image_token_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    n = count(batch["input_ids"], image_token_id)
    if family.startswith("qwen"):
        # one token per merged 2x2 block of patches: grid t * h * w / 4
        assert batch["image_grid_thw"].shape[0] == num_images
        assert n == int(batch["image_grid_thw"].prod(-1).sum()) // processor.image_processor.merge_size**2
    elif family == "internvl":
        # pixel_values: (total tiles, 3, side, side); image_seq_length tokens per tile
        assert n == batch["pixel_values"].shape[0] * processor.image_seq_length
    else:
        # pixel_values: (num_images, 3, side, side); token_type_ids marks the image tokens
        assert n == num_images * processor.image_seq_length
        assert int(batch["token_type_ids"].sum()) == n
    per_image = processor._get_num_multimodal_tokens(image_sizes=[(56, 56)] * num_images)["num_image_tokens"]
    # InternVL counts its <img> and </img> wrappers too
    assert n == sum(per_image) - (2 * num_images if family == "internvl" else 0)
    return n


def test_forward_backward_reaches_every_parameter(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[square_image()], return_tensors="pt")
    assert check_image_token_count(family, processor, batch, num_images=1) == 4

    model.train()
    model.zero_grad(set_to_none=True)
    try:
        output = model(**batch, labels=batch["input_ids"].clone())
        assert torch.isfinite(output.loss)
        output.loss.backward()
    finally:
        model.eval()
    names = [name for name, _ in model.named_parameters()]
    vision = [name for name in names if name.startswith(VISION_PREFIXES[family])]
    assert vision and any(name.startswith("model.language_model.") for name in names)
    no_grad = {
        name for name, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0).item()
    }
    assert no_grad == KNOWN_UNUSED[family]
    model.zero_grad(set_to_none=True)


def test_two_images_batched_with_padding(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    texts = [
        processor.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        for conv in (one_image_conversation(), two_image_conversation())
    ]
    images = [[square_image((255, 0, 0))], [square_image((0, 0, 255)), square_image((0, 255, 0), size=64)]]
    batch = processor(text=texts, images=images, return_tensors="pt", padding=True, padding_side="left")
    assert check_image_token_count(family, processor, batch, num_images=3) == 12
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][:, -1].all()
    with torch.no_grad():
        logits = model(**batch).logits  # (batch, seq, vocab)
    assert logits.shape == (*batch["input_ids"].shape, len(processor.tokenizer))
    assert torch.isfinite(logits).all()


def test_tokenizing_chat_template_with_embedded_images(loaded: tuple[str, Any, Any]) -> None:
    """The trainer's path: images inside the messages, one batched ``apply_chat_template(tokenize=True)``."""
    family, model, processor = loaded
    conversations = []
    for conversation, n_images in ((one_image_conversation(), 1), (two_image_conversation(), 2)):
        images = iter([square_image((255, 0, 0)), square_image((0, 0, 255))][:n_images])
        for message in conversation:
            if isinstance(message["content"], list):
                for part in message["content"]:
                    if part["type"] == "image":
                        part["image"] = next(images)
        conversations.append(conversation)
    unpadded = processor.apply_chat_template(
        conversations, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    batch = processor.apply_chat_template(
        conversations,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"padding": True, "padding_side": "left"},
    )
    lengths = [len(ids) for ids in unpadded["input_ids"]]
    assert batch["attention_mask"].sum(-1).tolist() == lengths
    assert lengths[0] < lengths[1]  # the first row is left-padded
    assert batch["input_ids"][0, -lengths[0] :].tolist() == unpadded["input_ids"][0]
    assert check_image_token_count(family, processor, batch, num_images=3) == 12
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()


def test_generate_and_decode(loaded: tuple[str, Any, Any]) -> None:
    _, model, processor = loaded
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    # nested per sample: Gemma3Processor reads a flat list as the images of ONE sample
    images = [[square_image()], [square_image((0, 0, 255))]]
    batch = processor(text=[text, text], images=images, return_tensors="pt")
    prompt_len = batch["input_ids"].shape[1]
    with torch.no_grad():
        sequences = model.generate(**batch, max_new_tokens=4, do_sample=True)
    assert sequences.shape[0] == 2 and prompt_len < sequences.shape[1] <= prompt_len + 4
    completions = processor.batch_decode(sequences[:, prompt_len:], skip_special_tokens=True)
    assert len(completions) == 2 and all(isinstance(c, str) for c in completions)


def test_text_only_prompt(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    conversation = [{"role": "user", "content": [{"type": "text", "text": "What is the color of the box?"}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], return_tensors="pt")
    assert "pixel_values" not in batch
    assert count(batch["input_ids"], processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])) == 0
    output = model(**batch, labels=batch["input_ids"].clone())
    assert torch.isfinite(output.loss)


def test_video_prompt(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    if family == "gemma3":  # Gemma 3 takes no video: its processor has no video processor
        assert getattr(processor, "video_processor", None) is None
        return
    conversation = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What color?"}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(
        0, 256, (4, 56, 56, 3), dtype=torch.uint8, generator=generator
    ).numpy()  # (T, H, W, C)
    # pre-sampled frames: Qwen3-VL would otherwise try to sample them again from video metadata
    kwargs = {"do_sample_frames": False} if family == "qwen3_vl" else {}
    batch = processor(text=[text], videos=[frames], return_tensors="pt", **kwargs)
    assert processor.tokenizer.unk_token_id not in batch["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()


def test_large_image_keeps_prompt_short(loaded: tuple[str, Any, Any]) -> None:
    family, _, processor = loaded
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[square_image(size=224)], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    assert count(batch["input_ids"], image_token_id) == 4


def test_extra_words_extend_vocabulary(tmp_path: Path) -> None:
    out = build_tiny_model("qwen2_vl", tmp_path, words=["zebra", "Acme", "red", "zebra", "Coca-Cola"])
    tokenizer = AutoProcessor.from_pretrained(out).tokenizer
    base = AutoProcessor.from_pretrained(build_tiny_model("qwen2_vl", tmp_path / "base")).tokenizer
    assert len(tokenizer) == len(base) + 3
    for word in ("zebra", "Acme", "Coca-Cola"):
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] != tokenizer.unk_token_id
        assert tokenizer.decode(ids) == word
    assert base("zebra")["input_ids"] == [base.unk_token_id]
    assert tokenizer.tokenize("the Coca-Cola box, red") == ["the", "Coca-Cola", "box", ",", "red"]
    assert set(DEFAULT_WORDS) <= set(tokenizer.get_vocab())


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_weights(family: str, tmp_path: Path) -> None:
    rng_state = torch.random.get_rng_state()
    a = load_file(Path(build_tiny_model(family, tmp_path / "a", seed=3)) / "model.safetensors")
    b = load_file(Path(build_tiny_model(family, tmp_path / "b", seed=3)) / "model.safetensors")
    c = load_file(Path(build_tiny_model(family, tmp_path / "c", seed=4)) / "model.safetensors")
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # caller's RNG untouched
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("family", FAMILIES)
def test_other_sizes(family: str, tmp_path: Path) -> None:
    out = build_tiny_model(family, tmp_path, hidden_size=32, num_hidden_layers=1, image_size=112)
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert model.config.get_text_config().hidden_size == 32
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[square_image(size=112)], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    assert count(batch["input_ids"], image_token_id) == TOKENS_AT_112[family]
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()


def test_bad_sizes_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        build_tiny_model("qwen2_vl", tmp_path, hidden_size=30)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        build_tiny_model("gemma3", tmp_path, num_hidden_layers=0)
