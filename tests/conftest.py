"""Shared fixtures: tiny locally built models (one per family, built once per session) and tiny image datasets."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from PIL import Image

from vlm_grpo.testing import families_with

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(
    prefix="vlm_grpo_cache_"
)  # the option cache, per test session

FAMILIES = families_with(indexable_cache=True)
"""Families whose cache the shared prefix indexes from groups to rows; the per-family tests run on each."""
FULL_ROW_FAMILIES = families_with(indexable_cache=False)
"""Families that declare `indexable_cache = False` (linear-attention state): every pass runs full rows.
`test_families_full_rows` runs the `FAMILIES` tests on them through the trainer, which honours the fallback."""
COLORS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}

_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under pytest-xdist
if _WORKER and os.cpu_count():
    # vLLM's CPU engines bind their threads to cores; each xdist worker's engines get a core of their own (by default
    # every engine would take the same one, and the workers would wait on each other there)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(int(_WORKER[2:]) % os.cpu_count()))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's `--dist loadgroup` (`make test-vllm`), the tests that read one vLLM run share a worker:
    each family's run in `test_vllm.py` (its `family_run`), and the server module's runs."""
    for item in items:
        if item.get_closest_marker("vllm") is None:
            continue
        if "family_run" in item.fixturenames:  # parametrized by the family alone: its id is the family
            item.add_marker(pytest.mark.xdist_group(f"vllm-{item.name.partition('[')[2].rstrip(']')}"))
        elif "server_runs" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("vllm-server"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """`tiny_model(family) -> path`: builds each family's tiny model once per test session."""
    from vlm_grpo.testing import build_tiny_model

    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = build_tiny_model(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


def square_image(color: str, size: int = 56) -> Image.Image:
    """A `size`x`size` grey image with a coloured square in the middle."""
    image = Image.new("RGB", (size, size), (128, 128, 128))
    q = size // 4
    image.paste(Image.new("RGB", (2 * q, 2 * q), COLORS[color]), (q, q))
    return image


def color_rows(n: int, images_per_prompt: int = 1, text_only_every: int = 0) -> list[dict]:
    """Rows of a colour question: `prompt` (conversational), `images`, `solution`.

    Args:
        n (`int`): number of rows.
        images_per_prompt (`int`, defaults to 1): image entries per prompt.
        text_only_every (`int`, defaults to 0): when > 0, every k-th row has no image at all.
    """
    names = list(COLORS)
    rows = []
    for i in range(n):
        color = names[i % len(names)]
        k = 0 if text_only_every and i % text_only_every == text_only_every - 1 else images_per_prompt
        content = [{"type": "image"} for _ in range(k)] + [
            {"type": "text", "text": "What color is the square ?"}
        ]
        rows.append(
            {
                "prompt": [{"role": "user", "content": content}],
                "images": [square_image(names[(i + j) % len(names)]) for j in range(k)],
                "solution": color,
            }
        )
    return rows


def color_dataset(n: int = 8, **kwargs) -> Dataset:
    """`color_rows` as a `datasets.Dataset` (images stored as image features)."""
    return Dataset.from_list(color_rows(n, **kwargs))


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that varies between samples of a group: the completion's length in characters."""
    return [float(len(c[0]["content"])) for c in completions]


def grpo_args(output_dir, **overrides):
    """A `VLMGRPOConfig` for 2 fast CPU steps; `overrides` replace any field."""
    from vlm_grpo import VLMGRPOConfig

    values = dict(
        output_dir=str(output_dir),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        use_cpu=True,
    )
    values.update(overrides)
    return VLMGRPOConfig(**values)


def write_color_data(folder: Path, n: int = 8) -> Path:
    """A VLM-R1 style JSON colour-choice dataset with its YAML data config; returns the YAML path."""
    (folder / "images").mkdir(parents=True)
    records = []
    for i in range(n):
        color = list(COLORS)[i % len(COLORS)]
        square_image(color).save(folder / "images" / f"{i}.png")
        records.append(
            {
                "image": f"{i}.png",
                "problem": "What color is the square ?",
                "solution": color,
                "options": list(COLORS),
            }
        )
    (folder / "train.json").write_text(json.dumps(records))
    config = folder / "data.yaml"
    config.write_text("image_root: images/\ndatasets:\n  - json_path: train.json\n")
    return config


def write_train_yaml(folder: Path, model: str, data_config: Path, **overrides) -> Path:
    """A training YAML for 2 quick CPU steps on `data_config`; `overrides` replace or add fields."""
    config = {
        "model_name_or_path": model,
        "dtype": "float32",
        "data_config": str(data_config),
        "rewards": ["choice_accuracy"],
        "output_dir": str(folder / "run"),
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 4,
        "learning_rate": 1e-3,
        "bf16": False,
        "use_cpu": True,
        "gradient_checkpointing": False,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
        "log_samples_steps": 0,
    }
    config.update(overrides)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
