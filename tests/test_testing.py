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

from vlm_grpo.testing import (
    DEFAULT_FAMILY,
    DEFAULT_WORDS,
    TAG_TOKENS,
    TINY_FAMILIES,
    UNK_TOKEN,
    ChatLayout,
    a_family_with,
    build_tiny_model,
    tiny_family,
)

FAMILIES = list(TINY_FAMILIES)
LAYOUT_FAMILIES = [family for family in FAMILIES if tiny_family(family).layout is not None]
"""Shapes whose chat layout, tokenizer and processor their record's `ChatLayout` describes in detail. The others' layouts
are checked in their own test files (test_families_*.py); every shape goes through
`test_every_shape_saves_loads_and_trains` and the seed and size tests."""


def layout(family: str) -> ChatLayout:
    """The family's `ChatLayout` (only `LAYOUT_FAMILIES` have one)."""
    described = tiny_family(family).layout
    assert described is not None
    return described


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
    assert config["model_type"] == tiny_family(family).model_type
    assert config["architectures"] == [tiny_family(family).architecture]
    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_shape_saves_loads_and_trains(family: str, tmp_path: Path) -> None:
    """Every registered builder: a float32 model of its model type that the Auto classes load, with 4 image tokens
    per 56x56 image (Gemma 4: its budget), and one image prompt's loss reaching every parameter."""
    record = tiny_family(family)
    out = Path(build_tiny_model(family, tmp_path))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (record.model_type, [record.architecture])
    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values())
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) < 500_000
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == record.tied_embeddings
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[square_image()], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(record.image_token)
    assert count(batch["input_ids"], image_token_id) == record.image_tokens(56)
    model.train()
    output = model(**batch, labels=batch["input_ids"].clone())
    assert torch.isfinite(output.loss)
    output.loss.backward()
    no_grad = {name for name, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)}
    assert no_grad == record.unused_parameters


def test_reload_sizes_and_ids(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    record, described = tiny_family(family), layout(family)
    tokenizer = processor.tokenizer
    assert type(model).__name__ == record.architecture
    assert model.config.model_type == record.model_type
    assert sum(p.numel() for p in model.parameters()) < 500_000
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)

    config, text_config = model.config, model.config.get_text_config()
    image_token_id = tokenizer.convert_tokens_to_ids(record.image_token)
    assert image_token_id != tokenizer.unk_token_id
    assert record.image_token in described.config_tokens.values()
    config_values = config.to_dict()
    for attribute, token in described.config_tokens.items():
        assert config_values[attribute] == tokenizer.convert_tokens_to_ids(token), attribute
    assert text_config.pad_token_id == tokenizer.pad_token_id
    eos = text_config.to_dict().get("eos_token_id")
    if eos is not None:
        assert tokenizer.eos_token_id in (eos if isinstance(eos, list) else [eos])

    generation_config = model.generation_config
    turn_end_id = tokenizer.convert_tokens_to_ids(described.turn_end)
    assert turn_end_id in generation_config.eos_token_id
    assert tokenizer.eos_token_id in generation_config.eos_token_id
    assert generation_config.pad_token_id == tokenizer.pad_token_id
    if described.bos:
        assert generation_config.bos_token_id == tokenizer.bos_token_id == text_config.bos_token_id
        assert tokenizer.bos_token == described.bos
    if described.video:
        assert processor.video_processor is not None


def test_chat_template_layout(loaded: tuple[str, Any, Any]) -> None:
    family, _, processor = loaded
    described = layout(family)
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    no_prompt = processor.apply_chat_template(one_image_conversation(), tokenize=False)
    two = processor.apply_chat_template(two_image_conversation(), add_generation_prompt=True, tokenize=False)
    plain = processor.apply_chat_template(
        [{"role": "user", "content": "What is red?"}], add_generation_prompt=True, tokenize=False
    )
    question = f"{described.image}What color is the square?"
    if described.system_turn:
        first = described.turn("system", "Answer with one word .") + described.turn("user", question)
    else:  # the system text opens the first user turn
        first = described.turn("user", f"Answer with one word .\n\n{question}")
    assert text == described.bos + first + described.generation_prompt()
    # some templates open with a default system turn when the messages give none
    default = described.turn("system", described.default_system) if described.default_system else ""
    assert (
        plain
        == described.bos + default + described.turn("user", "What is red?") + described.generation_prompt()
    )
    assert two.count(described.image) == 2
    assert described.turn("assistant", "<think> blue </think> <answer> right </answer>") in two
    assert no_prompt == text.removesuffix(described.generation_prompt())


def test_tokenizer_words_tags_and_decode(loaded: tuple[str, Any, Any]) -> None:
    family, _, processor = loaded
    tokenizer = processor.tokenizer
    text = "What color is the box? [red], <think> a </think><answer> 3 </answer>"
    ids = tokenizer(text)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    if tiny_family(
        family
    ).byte_level:  # every word one token, its leading space included; decoding gives the text back
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
    record = tiny_family(family)
    image_token_id = processor.tokenizer.convert_tokens_to_ids(record.image_token)
    n = count(batch["input_ids"], image_token_id)
    if record.image_rule == "grid":
        # one token per merged 2x2 block of patches: grid t * h * w / 4
        assert batch["image_grid_thw"].shape[0] == num_images
        assert n == int(batch["image_grid_thw"].prod(-1).sum()) // processor.image_processor.merge_size**2
    elif record.image_rule == "tiles":
        # pixel_values: (total tiles, 3, side, side); image_seq_length tokens per tile
        assert n == batch["pixel_values"].shape[0] * processor.image_seq_length
    else:
        # pixel_values: (num_images, 3, side, side); token_type_ids marks the image tokens
        assert n == num_images * processor.image_seq_length
        assert int(batch["token_type_ids"].sum()) == n
    per_image = processor._get_num_multimodal_tokens(image_sizes=[(56, 56)] * num_images)["num_image_tokens"]
    # InternVL counts its <img> and </img> wrappers too
    assert n == sum(per_image) - (2 * num_images if record.image_rule == "tiles" else 0)
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
    vision = [name for name in names if name.startswith(layout(family).vision_prefixes)]
    assert vision and any(name.startswith("model.language_model.") for name in names)
    no_grad = {
        name for name, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0).item()
    }
    assert no_grad == tiny_family(family).unused_parameters
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
    assert (
        count(batch["input_ids"], processor.tokenizer.convert_tokens_to_ids(tiny_family(family).image_token))
        == 0
    )
    output = model(**batch, labels=batch["input_ids"].clone())
    assert torch.isfinite(output.loss)


def test_video_prompt(loaded: tuple[str, Any, Any]) -> None:
    family, model, processor = loaded
    described = layout(family)
    if not described.video:  # the processor has no video processor (Gemma 3 takes no video)
        assert "video_processor" not in processor.get_attributes()
        return
    conversation = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What color?"}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(
        0, 256, (4, 56, 56, 3), dtype=torch.uint8, generator=generator
    ).numpy()  # (T, H, W, C)
    # pre-sampled frames: Qwen3-VL would otherwise try to sample them again from video metadata
    batch = processor(text=[text], videos=[frames], return_tensors="pt", **described.presampled_video_kwargs)
    assert processor.tokenizer.unk_token_id not in batch["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()


def test_large_image_keeps_prompt_short(loaded: tuple[str, Any, Any]) -> None:
    family, _, processor = loaded
    text = processor.apply_chat_template(one_image_conversation(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[square_image(size=224)], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(tiny_family(family).image_token)
    assert count(batch["input_ids"], image_token_id) == 4


def test_extra_words_extend_vocabulary(tmp_path: Path) -> None:
    family = a_family_with(byte_level=False)  # a word-level tokenizer
    out = build_tiny_model(family, tmp_path, words=["zebra", "Acme", "red", "zebra", "Coca-Cola"])
    tokenizer = AutoProcessor.from_pretrained(out).tokenizer
    base = AutoProcessor.from_pretrained(build_tiny_model(family, tmp_path / "base")).tokenizer
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
    image_token_id = processor.tokenizer.convert_tokens_to_ids(tiny_family(family).image_token)
    assert count(batch["input_ids"], image_token_id) == tiny_family(family).image_tokens(112)
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()


def test_bad_sizes_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        build_tiny_model(DEFAULT_FAMILY, tmp_path, hidden_size=30)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        build_tiny_model(a_family_with(image_rule="fixed"), tmp_path, num_hidden_layers=0)
