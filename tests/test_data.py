"""Tests of the YAML data loader (vlm_grpo.data): record formats, prompts, sampling, images and errors."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from datasets import Image as DsImage
from datasets import List
from PIL import Image

from vlm_grpo.data import DataConfigError, build_prompt, load_data_config, load_image, parse_sampling_strategy

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


# ----------------------------------------------------------------------------------------------- helpers


def make_image(path: Path, size=(4, 3), color=RED, mode="RGB") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return str(path)


def image_bytes(size=(4, 3), color=RED, mode="RGB", fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, fmt)
    return buffer.getvalue()


def write_json(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return path


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path: Path, columns: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def write_yaml(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def user_content(row) -> list:
    """The user message's content parts, without the None keys Arrow adds to image parts."""
    user = [m for m in row["prompt"] if m["role"] == "user"]
    assert len(user) == 1
    return [{k: v for k, v in part.items() if v is not None} for part in user[0]["content"]]


def rec_records(n: int, image: str = "a.png") -> list[dict]:
    return [{"image": image, "problem": f"q{i}", "solution": f"s{i}"} for i in range(n)]


def load_one(tmp_path: Path, records, name="data.json", seed=42, **entry_and_top) -> object:
    """Write records (+ a red image a.png) and a one-entry YAML; load it."""
    make_image(tmp_path / "a.png")
    writer = write_jsonl if name.endswith(".jsonl") else write_json
    writer(tmp_path / name, records)
    top = {k: entry_and_top.pop(k) for k in list(entry_and_top) if k.startswith("top_")}
    config = {k[4:]: v for k, v in top.items()}
    config["datasets"] = [{"json_path": name, **entry_and_top}]
    return load_data_config(write_yaml(tmp_path / "cfg.yaml", config), seed=seed)


def error_of(tmp_path: Path, records, name="data.json", **kwargs) -> str:
    with pytest.raises(DataConfigError) as info:
        load_one(tmp_path, records, name=name, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------------------------- formats


def test_vlm_r1_json_format(tmp_path):
    make_image(tmp_path / "imgs" / "b.png", color=BLUE)
    records = [
        {
            "image": "a.png",
            "problem": "Find the dog.",
            "solution": [1, 2, 3, 4],
            "accu_reward_method": "iou",
            "image_size": [4, 3],
        },
        {"image": ["a.png", "imgs/b.png"], "problem": "Which?", "solution": "B", "options": ["A", "B"]},
        {"image": None, "problem": "2+2?", "solution": 4},
        {"problem": "text only", "solution": "x"},
    ]
    ds = load_one(tmp_path, records)
    assert len(ds) == 4
    assert ds[0]["solution"] == "[1, 2, 3, 4]"
    assert ds[2]["solution"] == "4"
    assert ds[0]["image_paths"] == [str(tmp_path / "a.png")]
    assert ds[1]["image_paths"] == [str(tmp_path / "a.png"), str(tmp_path / "imgs" / "b.png")]
    assert ds[0]["accu_reward_method"] == "iou" and ds[1]["accu_reward_method"] is None
    assert ds[0]["image_size"] == [4, 3]
    assert ds[1]["options"] == ["A", "B"] and ds[0]["options"] is None
    assert ds[0]["problem"] == "Find the dog."
    assert "image" not in ds.column_names
    assert [im.getpixel((0, 0)) for im in ds[1]["images"]] == [RED, BLUE]
    for i in (2, 3):
        assert ds[i]["images"] == [] and ds[i]["image_paths"] == []
        assert user_content(ds[i]) == [{"type": "text", "text": ds[i]["problem"]}]
    assert set(ds["source"]) == {"data.json"}


def test_vlm_r1_conversation_jsonl_format(tmp_path):
    make_image(tmp_path / "b.png", color=GREEN)
    records = [
        {
            "id": 7,
            "image": "a.png",
            "conversations": [
                {"from": "human", "value": "<image>\nWhat colour?"},
                {"from": "gpt", "value": "red"},
            ],
            "accu_reward_method": "default",
        },
        {
            "id": 8,
            "image": ["a.png", "b.png"],
            "conversations": [
                {"from": "human", "value": "<image><image>Same?"},
                {"from": "gpt", "value": "no"},
            ],
        },
    ]
    ds = load_one(tmp_path, records, name="conv.jsonl")
    assert ds["solution"] == ["red", "no"]
    assert ds["problem"] == ["<image>\nWhat colour?", "<image><image>Same?"]
    assert ds["id"] == [7, 8]
    assert ds["accu_reward_method"] == ["default", None]
    assert "conversations" not in ds.column_names
    assert user_content(ds[0]) == [{"type": "image"}, {"type": "text", "text": "What colour?"}]
    assert user_content(ds[1]) == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Same?"}]
    assert [im.getpixel((0, 0)) for im in ds[1]["images"]] == [RED, GREEN]


def test_geo3k_parquet_format(tmp_path):
    make_image(tmp_path / "pics" / "p.png", size=(2, 2), color=GREEN)
    columns = {
        "problem": ["<image>Find x.", "<image>Find y.", "Area of <image>?"],
        "answer": ["3", "4", "5"],
        "images": [
            [image_bytes(size=(5, 6), color=BLUE)],
            [image_bytes(size=(3, 3), color=RED)],
            ["pics/p.png"],
        ],
    }
    write_parquet(tmp_path / "geo_bytes.parquet", {k: v[:2] for k, v in columns.items()})
    write_parquet(tmp_path / "geo_path.parquet", {k: v[2:] for k, v in columns.items()})
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    as_dict = [[{"bytes": image_bytes(size=(7, 1), color=GREEN), "path": "orig.png"}]]
    write_parquet(
        tmp_path / "geo_dict.parquet",
        {"problem": ["<image>Find z."], "answer": ["6"], "images": pa.array(as_dict, pa.list_(struct))},
    )
    cfg = {
        "datasets": [
            {"parquet_path": "geo_bytes.parquet"},
            {"parquet_path": "geo_path.parquet"},
            {"parquet_path": "geo_dict.parquet"},
        ]
    }
    ds = load_data_config(write_yaml(tmp_path / "cfg.yaml", cfg))
    assert ds["solution"] == ["3", "4", "5", "6"]
    assert "answer" not in ds.column_names
    assert ds["image_paths"] == [[""], [""], [str(tmp_path / "pics" / "p.png")], [""]]
    assert [ds[i]["images"][0].size for i in range(4)] == [(5, 6), (3, 3), (2, 2), (7, 1)]
    assert ds[3]["images"][0].getpixel((0, 0)) == GREEN
    assert user_content(ds[2]) == [
        {"type": "text", "text": "Area of "},
        {"type": "image"},
        {"type": "text", "text": "?"},
    ]
    assert ds["source"] == ["geo_bytes.parquet", "geo_bytes.parquet", "geo_path.parquet", "geo_dict.parquet"]


# ----------------------------------------------------------------------------------------------- prompts


def test_placeholders_interleave_images_and_text():
    prompt = build_prompt("Compare <image> and <image>.", 2)
    assert prompt == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare "},
                {"type": "image"},
                {"type": "text", "text": " and "},
                {"type": "image"},
                {"type": "text", "text": "."},
            ],
        }
    ]
    assert build_prompt("<image>\n<image>\nWhich?", 2)[0]["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "Which?"},
    ]


def test_images_first_without_placeholder_and_system_prompt(tmp_path):
    ds = load_one(
        tmp_path,
        [{"image": ["a.png", "a.png"], "problem": "Which is red?", "solution": "both"}],
        top_system_prompt="Think first.",
    )
    prompt = ds[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert prompt[0]["content"] == [{"type": "text", "text": "Think first."}]
    assert user_content(ds[0]) == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "Which is red?"},
    ]
    assert len(ds[0]["images"]) == 2


def test_prompt_template_with_problem_and_other_field(tmp_path):
    records = [{"image": "a.png", "problem": "<image>Pick one.", "solution": "A", "options": ["A", "B"]}]
    ds = load_one(
        tmp_path,
        records,
        top_prompt_template="{problem} Options: {options}. Answer in <answer></answer>.",
    )
    assert user_content(ds[0]) == [
        {"type": "image"},
        {"type": "text", "text": "Pick one. Options: A, B. Answer in <answer></answer>."},
    ]
    assert ds[0]["problem"] == "<image>Pick one."
    # a per-entry template overrides the top-level one; null disables it
    ds = load_one(tmp_path, records, top_prompt_template="X {problem}", prompt_template=None)
    assert user_content(ds[0])[-1]["text"] == "Pick one."


def test_template_naming_a_missing_field(tmp_path):
    message = error_of(tmp_path, rec_records(2), top_prompt_template="{problem} {choices}")
    assert "data.json" in message and "record 1" in message and "'choices'" in message


def test_placeholder_count_mismatch(tmp_path):
    records = rec_records(2) + [{"image": "a.png", "problem": "<image> vs <image>", "solution": "x"}]
    message = error_of(tmp_path, records)
    assert "data.json: record 3" in message and "'image'" in message
    assert "2 <image> placeholder(s)" in message and "1 image(s)" in message
    # placeholders in a text-only record are a mismatch too
    message = error_of(tmp_path, [{"problem": "<image> what?", "solution": "x"}])
    assert "record 1" in message and "0 image(s)" in message


# ----------------------------------------------------------------------------------------------- sampling


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("first:3", ["q0", "q1", "q2"]),
        ("end:2", ["q8", "q9"]),
        ("first:50%", ["q0", "q1", "q2", "q3", "q4"]),
        ("end:25%", ["q8", "q9"]),  # 2.5 rounds down
        ("first:1%", ["q0"]),  # at least one record
        ("end:100%", [f"q{i}" for i in range(10)]),
        ("first:1000", [f"q{i}" for i in range(10)]),  # more than the file: all
    ],
)
def test_first_and_end_sampling(tmp_path, strategy, expected):
    ds = load_one(tmp_path, rec_records(10), sampling_strategy=strategy)
    assert ds["problem"] == expected


def test_random_sampling_is_reproducible_and_seeded(tmp_path):
    records = rec_records(40)
    picks = load_one(tmp_path, records, sampling_strategy="random:8")["problem"]
    assert len(picks) == 8 and len(set(picks)) == 8
    assert picks == sorted(picks, key=lambda p: int(p[1:]))  # file order is kept
    assert load_one(tmp_path, records, sampling_strategy="random:8")["problem"] == picks
    assert load_one(tmp_path, records, sampling_strategy="random:8", seed=7)["problem"] != picks
    assert len(load_one(tmp_path, records, sampling_strategy="random:10%")["problem"]) == 4
    cfg = tmp_path / "cfg.yaml"
    fingerprints = [load_data_config(cfg, seed=s)._fingerprint for s in (1, 1, 2)]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]  # cheap, without hashing the table


def test_random_sampling_is_the_same_in_another_process():
    strategy = parse_sampling_strategy("random:5")
    here = strategy.select(100, seed=3, entry_index=1)
    code = (
        "from vlm_grpo.data.sampling import parse_sampling_strategy as p;"
        "print(p('random:5').select(100, seed=3, entry_index=1))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=Path(__file__).parents[1],
    )
    assert out.stdout.strip() == str(here)
    assert strategy.select(100, seed=3, entry_index=2) != here  # entries draw independently


@pytest.mark.parametrize(
    "bad", ["foo:10", "first:abc", "first:-1", "random:150%", "first:0", "first", "end:0%"]
)
def test_malformed_sampling_strategy(tmp_path, bad):
    make_image(tmp_path / "a.png")
    write_json(tmp_path / "data.json", rec_records(3))
    cfg = {"datasets": [{"json_path": "data.json"}, {"json_path": "data.json", "sampling_strategy": bad}]}
    with pytest.raises(DataConfigError) as info:
        load_data_config(write_yaml(tmp_path / "cfg.yaml", cfg))
    message = str(info.value)
    assert "cfg.yaml" in message and "datasets entry 1" in message and "sampling_strategy" in message
    assert repr(bad) in message and "first:N, end:N or random:N" in message


def test_sampling_strategy_must_be_a_string(tmp_path):
    message = error_of(tmp_path, rec_records(2), sampling_strategy=10)
    assert "cfg.yaml" in message and "entry 0" in message and "first:N" in message


# ----------------------------------------------------------------------------------------------- paths and mixtures


def test_relative_path_resolution(tmp_path):
    make_image(tmp_path / "top_imgs" / "x.png", color=RED)
    make_image(tmp_path / "coco" / "x.png", color=GREEN)
    make_image(tmp_path / "data" / "x.png", color=BLUE)
    abs_image = make_image(tmp_path / "elsewhere" / "y.png", size=(9, 9))
    record = [{"image": "x.png", "problem": "p", "solution": "s"}]
    write_json(tmp_path / "data" / "one.json", record)
    write_json(
        tmp_path / "data" / "two.json", record + [{"image": abs_image, "problem": "p", "solution": "s"}]
    )
    config = {
        "image_root": "../top_imgs",
        "datasets": [
            {"json_path": "../data/one.json"},
            {"json_path": "../data/two.json", "image_root": "../coco"},
        ],
    }
    ds = load_data_config(write_yaml(tmp_path / "configs" / "cfg.yaml", config))
    colours = [row["images"][0].getpixel((0, 0)) for row in ds]
    assert colours[:2] == [RED, GREEN]
    assert ds[2]["image_paths"] == [abs_image] and ds[2]["images"][0].size == (9, 9)
    assert ds["source"] == ["../data/one.json", "../data/two.json", "../data/two.json"]
    # without any image_root, paths resolve against the data file's folder
    ds = load_data_config(
        write_yaml(tmp_path / "configs" / "cfg2.yaml", {"datasets": [{"json_path": "../data/one.json"}]})
    )
    assert ds[0]["images"][0].getpixel((0, 0)) == BLUE


def test_mixture_of_three_formats(tmp_path):
    make_image(tmp_path / "a.png", size=(8, 8), color=RED)
    write_json(
        tmp_path / "rec.json",
        [{"image": "a.png", "problem": "box?", "solution": [0, 0, 1, 1], "accu_reward_method": "iou"}] * 3,
    )
    conversation = [{"from": "human", "value": "<image>What?"}, {"from": "gpt", "value": "a"}]
    write_jsonl(tmp_path / "conv.jsonl", [{"id": "c1", "image": "a.png", "conversations": conversation}])
    write_parquet(
        tmp_path / "geo.parquet",
        {"problem": ["<image>x?"], "answer": ["1"], "images": [[image_bytes()]], "options": [["1", "2"]]},
    )
    config = {
        "system_prompt": "sys",
        "datasets": [
            {"json_path": "rec.json", "sampling_strategy": "first:2", "name": "rec"},
            {"json_path": "conv.jsonl", "system_prompt": None},
            {"parquet_path": "geo.parquet"},
        ],
    }
    ds = load_data_config(write_yaml(tmp_path / "cfg.yaml", config))
    assert ds["source"] == ["rec", "rec", "conv.jsonl", "geo.parquet"]
    assert ds.column_names[:6] == ["prompt", "images", "image_paths", "videos", "solution", "source"]
    assert set(ds.column_names) == {
        "prompt", "images", "image_paths", "videos", "solution", "source", "problem", "accu_reward_method", "id", "options",
    }  # fmt: skip
    assert ds["accu_reward_method"] == ["iou", "iou", None, None]
    assert ds["id"] == [None, None, "c1", None]
    assert ds["options"] == [None, None, None, ["1", "2"]]
    assert ds["solution"] == ["[0, 0, 1, 1]", "[0, 0, 1, 1]", "a", "1"]
    assert [len(row["prompt"]) for row in ds] == [2, 2, 1, 2]
    assert [len(images) for images in ds[0:4]["images"]] == [1, 1, 1, 1]


def test_field_with_conflicting_types_across_entries(tmp_path):
    make_image(tmp_path / "a.png")
    write_json(tmp_path / "one.json", [{"image": "a.png", "problem": "p", "solution": "s", "id": 3}])
    write_json(tmp_path / "two.json", [{"image": "a.png", "problem": "p", "solution": "s", "id": "x"}])
    cfg = {"datasets": [{"json_path": "one.json"}, {"json_path": "two.json"}]}
    with pytest.raises(
        DataConfigError, match=r"cfg.yaml: field 'id' has values of different types.*one.json: int64"
    ):
        load_data_config(write_yaml(tmp_path / "cfg.yaml", cfg))


# ----------------------------------------------------------------------------------------------- images


def test_images_are_decoded_lazily_to_rgb(tmp_path):
    make_image(tmp_path / "gray.png", size=(6, 5), color=77, mode="L")
    make_image(tmp_path / "rgba.png", size=(2, 7), color=(0, 0, 255, 100), mode="RGBA")
    records = [
        {"image": "gray.png", "problem": "p", "solution": "s"},
        {"image": "rgba.png", "problem": "p", "solution": "s"},
    ]
    ds = load_one(tmp_path, records)
    stored = ds.data.column("images").to_pylist()
    assert stored[0] == [{"bytes": None, "path": str(tmp_path / "gray.png")}]  # a path, not pixels
    first = ds[0]["images"][0]
    assert isinstance(first, Image.Image) and first.mode == "RGB"
    assert first.size == (6, 5) and first.getpixel((0, 0)) == (77, 77, 77)
    batch = ds[0:2]["images"]
    assert [im[0].mode for im in batch] == ["RGB", "RGB"]
    assert batch[1][0].size == (2, 7) and batch[1][0].getpixel((1, 1)) == BLUE
    assert ds.shuffle(seed=0).select([0])[0]["images"][0].mode == "RGB"


def test_text_only_dataset(tmp_path):
    ds = load_one(tmp_path, [{"problem": "2+3?", "solution": 5}], top_system_prompt="Be brief.")
    assert ds.features["images"] == List(DsImage(mode="RGB"))
    assert ds[0]["images"] == [] and ds[0]["image_paths"] == [] and ds[0]["solution"] == "5"
    assert ds[0]["prompt"] == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
    ]


def test_load_image_sources(tmp_path):
    path = make_image(tmp_path / "g.png", size=(3, 2), color=10, mode="L")
    for source in (path, Path(path), Path(path).read_bytes(), {"bytes": None, "path": path}):
        image = load_image(source)
        assert image.mode == "RGB" and image.size == (3, 2) and image.getpixel((0, 0)) == (10, 10, 10)
    jpeg = load_image({"bytes": image_bytes(size=(5, 5), color=GREEN, fmt="JPEG"), "path": "x.jpg"})
    assert jpeg.size == (5, 5) and jpeg.mode == "RGB"
    with pytest.raises(TypeError):
        load_image(12)


# ----------------------------------------------------------------------------------------------- bad data


def test_missing_data_file(tmp_path):
    cfg = write_yaml(tmp_path / "cfg.yaml", {"datasets": [{"json_path": "nope.json"}]})
    with pytest.raises(
        DataConfigError, match=r"cfg.yaml: datasets entry 0, key 'json_path': data file .*nope.json not found"
    ):
        load_data_config(cfg)


def test_missing_image(tmp_path):
    message = error_of(tmp_path, rec_records(2) + rec_records(1, image="missing.png"))
    assert "data.json: record 3, field 'image'" in message
    assert "missing.png" in message and "file not found" in message and "on_missing_image: skip" in message


def test_corrupt_image_file(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    message = error_of(tmp_path, rec_records(1) + rec_records(1, image="bad.png"))
    assert (
        "data.json: record 2, field 'image'" in message and "bad.png" in message and "unreadable" in message
    )


def test_corrupt_embedded_image_bytes(tmp_path):
    write_parquet(
        tmp_path / "geo.parquet",
        {
            "problem": ["<image>a", "<image>b"],
            "answer": ["1", "2"],
            "images": [[image_bytes()], [b"garbage"]],
        },
    )
    cfg = write_yaml(tmp_path / "cfg.yaml", {"datasets": [{"parquet_path": "geo.parquet"}]})
    with pytest.raises(
        DataConfigError, match=r"geo.parquet: record 2, field 'images': image 0 \(embedded bytes\)"
    ):
        load_data_config(cfg)


@pytest.mark.parametrize(
    ("record", "field", "words"),
    [
        ({"image": "a.png", "solution": "s"}, "problem", "neither 'problem'"),
        ({"image": "a.png", "problem": "p"}, "solution", "no 'solution'"),
        ({"image": 5, "problem": "p", "solution": "s"}, "image", "type int"),
        ({"image": ["a.png", 3.5], "problem": "p", "solution": "s"}, "image", "item 1 has type float"),
        ({"image": "", "problem": "p", "solution": "s"}, "image", "empty path"),
        ({"problem": 3, "solution": "s"}, "problem", "expected a string"),
        ({"image": "a.png", "images": ["a.png"], "problem": "p", "solution": "s"}, "images", "both"),
        ({"prompt": "x", "problem": "p", "solution": "s"}, "prompt", "rename"),
        ({"conversations": [{"from": "human", "value": "q"}]}, "conversations", "got 1 turns"),
        (
            {"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
            "conversations",
            "turn 0",
        ),
    ],
)
def test_bad_record_fields(tmp_path, record, field, words):
    message = error_of(tmp_path, rec_records(3) + [record])
    assert f"data.json: record 4, field '{field}'" in message
    assert words in message


def test_bad_json_line(tmp_path):
    make_image(tmp_path / "a.png")
    lines = [json.dumps(r) for r in rec_records(2)] + ["", '{"problem": "p", "solution": ']
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    cfg = write_yaml(tmp_path / "cfg.yaml", {"datasets": [{"json_path": "data.jsonl"}]})
    with pytest.raises(DataConfigError, match=r"data.jsonl: record 3 \(line 4\): invalid JSON"):
        load_data_config(cfg)


@pytest.mark.parametrize(
    "bad",
    [
        '{"image": "a.png", "problem": "Which brand is this product?", "solution": "Acme"',  # no closing brace
        '{"image": "a.png", "problem": "p" "solution": "s"}',  # a missing comma mid-line
    ],
)
def test_bad_json_line_names_the_column_python_names(tmp_path, bad):
    make_image(tmp_path / "a.png")
    (tmp_path / "data.jsonl").write_text(json.dumps(rec_records(1)[0]) + "\n" + bad + "\n")
    with pytest.raises(json.JSONDecodeError) as python:
        json.loads(bad)
    cfg = write_yaml(tmp_path / "cfg.yaml", {"datasets": [{"json_path": "data.jsonl"}]})
    with pytest.raises(DataConfigError) as info:
        load_data_config(cfg)
    assert f"record 2 (line 2): invalid JSON ({python.value.msg} at column {python.value.colno})" in str(
        info.value
    )
    assert python.value.colno > 1


def test_flat_records_in_a_jsonl_file(tmp_path):
    records = [
        {"image": "a.png", "problem": "Which brand?", "solution": "Acme", "options": ["Acme", "Globex"]},
        {"image": ["a.png"], "problem": "Which one?", "solution": [1, 2, 3, 4]},
    ]
    ds = load_one(tmp_path, records, name="data.jsonl")
    assert ds["solution"] == ["Acme", "[1, 2, 3, 4]"]
    assert ds["image_paths"] == [[str(tmp_path / "a.png")]] * 2
    assert user_content(ds[0]) == [{"type": "image"}, {"type": "text", "text": "Which brand?"}]
    assert ds["options"] == [["Acme", "Globex"], None]


@pytest.mark.parametrize("name", ["audio", "audios"])
@pytest.mark.parametrize("with_image", [True, False])
def test_unsupported_media_field_is_an_error(tmp_path, name, with_image):
    record = {"problem": "What happens?", "solution": "s", name: ["clip.wav"]}
    if with_image:
        record["image"] = "a.png"
    message = error_of(tmp_path, rec_records(2) + [record], name="data.jsonl")
    assert f"data.jsonl: record 3 (line 3), field '{name}': " in message
    assert "audio input is not supported, only images and videos" in message and "remove the field" in message


def test_empty_media_field_is_kept_as_a_column(tmp_path):
    ds = load_one(
        tmp_path, [{"image": "a.png", "problem": "p", "solution": "s", "audios": []}], name="data.jsonl"
    )
    assert ds["audios"] == [[]] and ds["image_paths"] == [[str(tmp_path / "a.png")]]
    ds = load_one(
        tmp_path, [{"image": "a.png", "problem": "p", "solution": "s", "videos": []}], name="v.jsonl"
    )
    assert ds["videos"] == [[]]  # no video: the loader's column, empty


@pytest.mark.parametrize("name", ["completion", "completions", "trainer_state"])
def test_field_named_like_a_reward_argument_is_an_error(tmp_path, name):
    message = error_of(tmp_path, rec_records(1) + [{"problem": "p", "solution": "s", name: "x"}])
    assert f"data.json: record 2, field '{name}'" in message and "never reach a reward" in message


def test_unknown_field_reaches_the_rewards_as_a_column(tiny_model, tmp_path):
    from conftest import grpo_args, square_image

    from vlm_grpo import VLMGRPOTrainer
    from vlm_grpo.testing import DEFAULT_FAMILY

    square_image("red").save(tmp_path / "a.png")
    colours = ["red", "green", "blue", "yellow"]
    records = [
        {"image": "a.png", "problem": "Colour?", "solution": c, "difficulty": f"hard-{c}"} for c in colours
    ]
    dataset = load_one(tmp_path, records, name="data.jsonl")
    seen = []

    def reads_difficulty(completions, solution, difficulty, **kwargs):
        seen.append((list(solution), list(difficulty)))
        return [0.0] * len(completions)

    args = grpo_args(tmp_path / "run", max_steps=1, no_signal_warning_steps=0)
    VLMGRPOTrainer(tiny_model(DEFAULT_FAMILY), reads_difficulty, args=args, train_dataset=dataset).train()
    (solutions, difficulties), *_ = seen
    assert len(difficulties) == args.per_device_train_batch_size  # one value per completion
    assert difficulties == [f"hard-{s}" for s in solutions]


def test_json_top_level_must_be_a_list(tmp_path):
    message = error_of(tmp_path, {"problem": "p", "solution": "s"})
    assert "data.json" in message and "JSON list" in message


def test_record_that_is_not_an_object(tmp_path):
    message = error_of(tmp_path, [*rec_records(1), "oops"], name="data.jsonl")
    assert "data.jsonl: record 2 (line 2)" in message and "JSON object" in message


@pytest.mark.parametrize(
    ("config", "where", "key"),
    [
        ({"datasets": [{"json_path": "data.json"}], "image_rot": "x"}, "cfg.yaml:", "image_rot"),
        ({"datasets": [{"json_path": "data.json", "sampling": "first:1"}]}, "datasets entry 0", "sampling"),
    ],
)
def test_unknown_yaml_key(tmp_path, config, where, key):
    write_json(tmp_path / "data.json", [{"problem": "p", "solution": "s"}])
    with pytest.raises(DataConfigError) as info:
        load_data_config(write_yaml(tmp_path / "cfg.yaml", config))
    message = str(info.value)
    assert where in message and f"unknown key {key!r}" in message
    assert "allowed keys are:" in message and "image_root" in message


def test_bad_config_values(tmp_path):
    write_json(tmp_path / "data.json", [{"problem": "p", "solution": "s"}])
    cases = [
        ({"datasets": []}, "key 'datasets'"),
        ({"datasets": [{"json_path": "data.json", "parquet_path": "x.parquet"}]}, "exactly one of json_path"),
        ({"datasets": [{"json_path": "data.csv"}]}, "unsupported extension"),
        ({"datasets": [{"json_path": "data.json"}], "on_missing_image": "ignore"}, "use one of: error, skip"),
        ({"datasets": [{"json_path": "data.json", "image_root": "nowhere"}]}, "nowhere does not exist"),
    ]
    for config, words in cases:
        with pytest.raises(DataConfigError, match=words):
            load_data_config(write_yaml(tmp_path / "cfg.yaml", config))


def test_on_missing_image_skip_drops_and_logs(tmp_path, caplog):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    records = rec_records(2) + rec_records(1, image="gone.png") + rec_records(1, image="bad.png")
    with caplog.at_level(logging.WARNING, logger="vlm_grpo.data"):
        ds = load_one(tmp_path, records, top_on_missing_image="skip")
    assert ds["problem"] == ["q0", "q1"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "data.json" in warnings[0] and "dropped 2 of 4 records" in warnings[0]
    # skipping does not hide other errors
    message = error_of(
        tmp_path, [*records, {"image": 5, "problem": "p", "solution": "s"}], top_on_missing_image="skip"
    )
    assert "record 5, field 'image'" in message


def test_empty_result_is_an_error(tmp_path):
    message = error_of(tmp_path, rec_records(2, image="gone.png"), on_missing_image="skip")
    assert "data.json" in message and "no records left" in message
    message = error_of(tmp_path, [])
    assert "data.json" in message and "no records" in message
