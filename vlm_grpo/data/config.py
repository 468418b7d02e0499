"""Reading and validating a YAML data config.

The config lists data files and how to sample them::

    image_root: images/                # optional default for every entry
    prompt_template: "{problem} Output the final answer in <answer></answer> tags."   # optional
    system_prompt: "..."               # optional
    on_missing_image: error            # optional: error (default) | skip
    datasets:
      - json_path: rec_train.json      # .json list of records, or .jsonl
        sampling_strategy: first:1000  # first:N | end:N | random:N ; N may be P% ; absent = all
        image_root: coco/              # optional per entry
        name: rec                      # optional; the rows' `source` (default: the path as written)
      - parquet_path: geo3k_train.parquet
        prompt_template: "{problem}"   # per-entry prompt_template / system_prompt / on_missing_image

Relative `json_path`, `parquet_path` and `image_root` values resolve against the YAML file's
folder. An entry's image root is its own `image_root`, else the top-level one, else the data file's
folder. Unknown keys are errors, so a typo is never silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from .errors import DataConfigError, entry_error
from .sampling import SamplingStrategy, parse_sampling_strategy

TOP_LEVEL_KEYS = ("image_root", "prompt_template", "system_prompt", "on_missing_image", "datasets")
ENTRY_KEYS = (
    "json_path",
    "parquet_path",
    "sampling_strategy",
    "image_root",
    "prompt_template",
    "system_prompt",
    "on_missing_image",
    "name",
)
ON_MISSING_IMAGE = ("error", "skip")

ErrorFactory = Callable[[str, str], DataConfigError]
"""Builds the error about a key: `(key, message) -> DataConfigError`."""


@dataclass(frozen=True)
class DataEntry:
    """One validated entry of the `datasets` list.

    Attributes:
        index (`int`): 0-based position in the `datasets` list.
        path (`str`): Absolute path of the data file.
        kind (`str`): `"json"`, `"jsonl"` or `"parquet"`.
        image_root (`str`): Absolute folder that relative image paths of this entry resolve against.
        sampling (`SamplingStrategy | None`): How to pick records; `None` keeps all of them.
        prompt_template (`str | None`): Template applied with `str.format_map` on each record; `None` uses
            the problem text as is.
        system_prompt (`str | None`): System message text, or `None` for no system message.
        on_missing_image (`str`): `"error"` or `"skip"`.
        name (`str`): The `source` value of this entry's rows.
        template_origin (`str`, *optional*, defaults to `"the top-level prompt_template"`): where
            `prompt_template` was written, for messages.
    """

    index: int
    path: str
    kind: str
    image_root: str
    sampling: SamplingStrategy | None
    prompt_template: str | None
    system_prompt: str | None
    on_missing_image: str
    name: str
    template_origin: str = "the top-level prompt_template"


@dataclass(frozen=True)
class DataConfig:
    """A validated data config.

    Attributes:
        path (`str`): Absolute path of the YAML file.
        entries (`tuple[DataEntry, ...]`): The entries, in YAML order.
    """

    path: str
    entries: tuple[DataEntry, ...]


def _resolve(base_dir: str, value: str) -> str:
    return os.path.abspath(os.path.join(base_dir, os.path.expanduser(value)))


def _check_keys(mapping: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise DataConfigError(f"{where}: unknown key {key!r}; allowed keys are: {', '.join(allowed)}")


def _optional_str(mapping: dict, key: str, error: ErrorFactory) -> str | None:
    value = mapping.get(key)
    if value is not None and not isinstance(value, str):
        raise error(
            key, f"expected a string, got {type(value).__name__} ({value!r}); write a (quoted) string"
        )
    return value


def _image_root(mapping: dict, base_dir: str, error: ErrorFactory) -> str | None:
    value = _optional_str(mapping, "image_root", error)
    if value is None:
        return None
    root = _resolve(base_dir, value)
    if not os.path.isdir(root):
        raise error(
            "image_root", f"folder {root} does not exist; fix the path (relative paths start at {base_dir})"
        )
    return root


def _on_missing(mapping: dict, default: str, error: ErrorFactory) -> str:
    value = mapping.get("on_missing_image", default)
    if value not in ON_MISSING_IMAGE:
        raise error("on_missing_image", f"got {value!r}; use one of: {', '.join(ON_MISSING_IMAGE)}")
    return value


def parse_data_config(path: str | os.PathLike) -> DataConfig:
    """Read and validate a YAML data config; reads no data file.

    Args:
        path (`str | os.PathLike`): Path of the YAML file.

    Returns:
        `DataConfig`: The validated config, with all paths absolute.

    Raises:
        DataConfigError: The file is missing or is not valid YAML, a key is unknown, a value has the wrong
            type, a data file or image root does not exist, or a sampling strategy is malformed.
    """
    cfg_path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(cfg_path):
        raise DataConfigError(f"data config {cfg_path} not found; pass the path of an existing YAML file")
    try:
        with open(cfg_path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise DataConfigError(f"{cfg_path}: not valid YAML ({detail}); fix the syntax") from exc
    if not isinstance(raw, dict):
        raise DataConfigError(f"{cfg_path}: expected a mapping with a 'datasets' list at the top level")
    _check_keys(raw, TOP_LEVEL_KEYS, cfg_path)
    base_dir = os.path.dirname(cfg_path)

    def top_error(key: str, message: str) -> DataConfigError:
        return DataConfigError(f"{cfg_path}: key '{key}': {message}")

    top_root = _image_root(raw, base_dir, top_error)
    top_template = _optional_str(raw, "prompt_template", top_error)
    top_system = _optional_str(raw, "system_prompt", top_error)
    top_missing = _on_missing(raw, "error", top_error)
    items = raw.get("datasets")
    if not isinstance(items, list) or not items:
        raise top_error(
            "datasets", "expected a non-empty list of entries, each with a json_path or parquet_path"
        )
    entries = [
        _parse_entry(cfg_path, base_dir, index, item, top_root, top_template, top_system, top_missing)
        for index, item in enumerate(items)
    ]
    return DataConfig(path=cfg_path, entries=tuple(entries))


def _parse_entry(
    cfg_path: str,
    base_dir: str,
    index: int,
    item: object,
    top_root: str | None,
    top_template: str | None,
    top_system: str | None,
    top_missing: str,
) -> DataEntry:
    def error(key: str | None, message: str) -> DataConfigError:
        return entry_error(cfg_path, index, key, message)

    if not isinstance(item, dict):
        raise error(None, f"expected a mapping with a json_path or parquet_path, got {type(item).__name__}")
    _check_keys(item, ENTRY_KEYS, f"{cfg_path}: datasets entry {index}")
    given = [key for key in ("json_path", "parquet_path") if item.get(key) is not None]
    if len(given) != 1:
        raise error(None, "give exactly one of json_path (.json or .jsonl) or parquet_path (.parquet)")
    key = given[0]
    written = _optional_str(item, key, error)
    assert written is not None
    data_path = _resolve(base_dir, written)
    lower = data_path.lower()
    if key == "json_path" and lower.endswith(".jsonl"):
        kind = "jsonl"
    elif key == "json_path" and lower.endswith(".json"):
        kind = "json"
    elif key == "parquet_path" and lower.endswith(".parquet"):
        kind = "parquet"
    else:
        raise error(
            key,
            f"{written!r} has an unsupported extension; json_path takes .json or .jsonl files, "
            "parquet_path takes .parquet files",
        )
    if not os.path.isfile(data_path):
        raise error(
            key, f"data file {data_path} not found; fix the path (relative paths start at {base_dir})"
        )
    sampling = None
    if item.get("sampling_strategy") is not None:
        try:
            sampling = parse_sampling_strategy(item["sampling_strategy"])
        except ValueError as exc:
            raise error("sampling_strategy", str(exc)) from exc
    root = _image_root(item, base_dir, error) or top_root or os.path.dirname(data_path)
    template = _optional_str(item, "prompt_template", error) if "prompt_template" in item else top_template
    system = _optional_str(item, "system_prompt", error) if "system_prompt" in item else top_system
    name = _optional_str(item, "name", error) or written
    return DataEntry(
        index=index,
        path=data_path,
        kind=kind,
        image_root=root,
        sampling=sampling,
        prompt_template=template,
        system_prompt=system,
        on_missing_image=_on_missing(item, top_missing, error),
        name=name,
        template_origin=(
            f"the prompt_template of datasets entry {index}"
            if "prompt_template" in item
            else "the top-level prompt_template"
        ),
    )
