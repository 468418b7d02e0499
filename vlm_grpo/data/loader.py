"""Loading a YAML data config into one `datasets.Dataset` of GRPO prompts.

Each row has the columns

* `prompt` (list of messages): an optional system message, then one user message whose content
  interleaves `{"type": "image"}` and `{"type": "text", "text": ...}` parts (TRL conversational style);
* `images` (list of PIL images): decoded lazily to RGB on access; `[]` for text-only rows;
* `image_paths` (list of str): resolved absolute paths, `""` for images embedded in the data file;
* `videos` (list of `{"path", "frames"}`): each video's resolved file path, or its frame files' paths; `[]` for rows
  without video (decoded when a row is encoded, see `vlm_grpo.data.video_frames`);
* `solution` (str): the reference solution (non-string values as JSON text);
* `source` (str): the entry's `name`, else its data path as written in the YAML file;
* `problem` (str) and every other field of the records, `None` where an entry lacks it.

Entries are concatenated in YAML order and are not shuffled.
"""

from __future__ import annotations

import hashlib
import logging
import os

import pyarrow as pa
from datasets import Dataset, DatasetInfo, Features, Image, List

from .config import DataConfig, DataEntry, parse_data_config
from .errors import DataConfigError, record_error
from .formats import ParsedRecord, parse_record
from .images import check_image, check_images
from .prompts import PlaceholderCountError, TemplateFieldError, apply_template, build_prompt
from .readers import Record, read_records
from .videos import check_video

logger = logging.getLogger(__name__)

_TEXT_PART = pa.struct([("type", pa.string()), ("text", pa.string())])
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.list_(_TEXT_PART))])
_IMAGE_STORAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
_VIDEO_STORAGE = pa.struct([("path", pa.string()), ("frames", pa.list_(pa.string()))])
FIXED_COLUMNS = {
    "prompt": pa.list_(_MESSAGE),
    "images": pa.list_(_IMAGE_STORAGE),
    "image_paths": pa.list_(pa.string()),
    "videos": pa.list_(_VIDEO_STORAGE),
    "solution": pa.string(),
    "source": pa.string(),
}
"""Output columns the loader builds, with their Arrow types (`images` is then cast to `List(Image)`)."""


def load_data_config(path: str | os.PathLike, seed: int = 42) -> Dataset:
    """Load the data files of a YAML data config into one dataset.

    Args:
        path (`str | os.PathLike`): Path of the YAML data config (see `vlm_grpo.data.config`).
        seed (`int`, *optional*, defaults to `42`): Seed of `random:` sampling strategies; the same seed picks the
            same records in every call and process.

    Returns:
        `datasets.Dataset`: One row per kept record, columns as described in `vlm_grpo.data.loader`.

    Raises:
        DataConfigError: The config or a data file is invalid; the message names the file, the entry or
            record and the field, and says what to do.
    """
    config = parse_data_config(path)
    cache: dict[str, str | None] = {}
    parts = [(entry, load_entry(entry, seed, cache, config.path)) for entry in config.entries]
    return build_dataset(parts, config.path, fingerprint=_fingerprint(config, seed))


def _fingerprint(config: DataConfig, seed: int) -> str:
    """A cheap dataset fingerprint from the config text, the seed and the data files' sizes and times.

    Hashing the loaded table instead (the `datasets` default) reads every stored image byte.
    """
    hasher = hashlib.sha256(f"vlm_grpo.data:1:{seed}".encode())
    with open(config.path, "rb") as handle:
        hasher.update(handle.read())
    for entry in config.entries:
        stat = os.stat(entry.path)
        hasher.update(f"{entry.path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return hasher.hexdigest()[:16]


def load_entry(entry: DataEntry, seed: int, cache: dict[str, str | None], config_file: str) -> list[dict]:
    """Read, sample, check and convert the records of one entry.

    Args:
        entry (`DataEntry`): The entry.
        seed (`int`): Seed of `random:` sampling.
        cache (`dict[str, str | None]`): Results of image and video file checks, shared between entries; updated.
        config_file (`str`): Path of the YAML config, for messages.

    Returns:
        `list[dict]`: The entry's rows, in file order, each with the fixed columns and the record's kept fields.

    Raises:
        DataConfigError: A record is invalid, or no record is left.
    """
    file = entry.path
    records = read_records(file, entry.kind)
    if not records:
        raise DataConfigError(
            f"{file}: the file holds no records; add records or remove datasets entry {entry.index}"
        )
    total = len(records)
    if entry.sampling is not None:
        indices = entry.sampling.select(total, seed, entry.index, file)
        records = [records[i] for i in indices]
    parsed = [(record, parse_record(file, record, entry.image_root)) for record in records]
    check_images([ref for _, item in parsed for ref in item.images], cache)

    rows: list[dict] = []
    skipped: list[str] = []
    for record, item in parsed:
        failure = None
        field = item.image_field
        for k, ref in enumerate(item.images):
            reason = cache[ref.path] if ref.path is not None else check_image(ref)
            if reason is not None:
                failure = f"image {k} ({ref.path or 'embedded bytes'}): {reason}"
                break
        for k, video in enumerate(item.videos if failure is None else ()):
            key = video.path or "\n".join(video.frames)
            if key not in cache:
                cache[key] = check_video(video)
            if cache[key] is not None:
                failure, field = f"video {k} ({video.display_path}): {cache[key]}", item.video_field
                break
        if failure is not None:
            if entry.on_missing_image == "skip":
                skipped.append(f"{record.where}: {failure}")
                continue
            raise record_error(
                file,
                record.where,
                field,
                f"{failure}; fix the path or image_root, or set on_missing_image: skip in {config_file} "
                "to drop such records",
            )
        rows.append(_row(entry, record, item, config_file))

    if skipped:
        logger.warning(
            "%s: dropped %d of %d records whose image or video is missing or unreadable, or whose video is cut short or "
            "of one frame (on_missing_image: skip); first: %s",
            file,
            len(skipped),
            len(parsed),
            skipped[0],
        )
    if not rows:
        raise DataConfigError(
            f"{file}: no records left after sampling and skipping ({total} in the file, {len(parsed)} sampled, "
            f"{len(skipped)} skipped); fix the images or the sampling_strategy of datasets entry {entry.index}"
        )
    logger.info("%s: %d rows (%d records in the file)", file, len(rows), total)
    return rows


def _row(entry: DataEntry, record: Record, item: ParsedRecord, config_file: str) -> dict:
    file = entry.path
    try:
        text = apply_template(entry.prompt_template, item.template_fields)
    except TemplateFieldError as exc:
        name = exc.args[0]
        raise record_error(
            file,
            record.where,
            name,
            f"prompt_template names field '{name}', which this record lacks; add it to the records or change "
            f"{entry.template_origin} in {config_file}",
        ) from exc
    except ValueError as exc:
        raise DataConfigError(f"{config_file}: {entry.template_origin}: {exc}") from exc
    try:
        prompt = build_prompt(text, len(item.images), entry.system_prompt, len(item.videos))
    except PlaceholderCountError as exc:
        field = item.video_field if exc.kind == "video" else item.image_field
        raise record_error(file, record.where, field or "problem", str(exc)) from exc
    return {
        "prompt": prompt,
        "images": [ref.storage() for ref in item.images],
        "image_paths": [ref.display_path for ref in item.images],
        "videos": [video.storage() for video in item.videos],
        "solution": item.solution,
        "source": entry.name,
        **item.extras,
    }


def _column(name: str, parts: list[tuple[DataEntry, list[dict]]], config_file: str) -> pa.Array:
    values = [row.get(name) for _, rows in parts for row in rows]
    try:
        return pa.array(values, type=FIXED_COLUMNS.get(name))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as first_error:
        found = []
        for entry, rows in parts:
            present = [row[name] for row in rows if row.get(name) is not None]
            if present:
                try:
                    found.append(f"{entry.name}: {pa.array(present).type}")
                except (pa.ArrowInvalid, pa.ArrowTypeError):
                    found.append(f"{entry.name}: mixed types")
        raise DataConfigError(
            f"{config_file}: field '{name}' has values of different types ({'; '.join(found)}); "
            "give the field one type in every record of every data file"
        ) from first_error


def build_dataset(
    parts: list[tuple[DataEntry, list[dict]]], config_file: str = "", fingerprint: str | None = None
) -> Dataset:
    """Concatenate the rows of all entries into one dataset with one schema.

    Args:
        parts (`list[tuple[DataEntry, list[dict]]]`): Each entry with its rows, in YAML order.
        config_file (`str`, *optional*, defaults to `""`): Path of the YAML config, for messages.
        fingerprint (`str | None`, *optional*, defaults to `None`): The dataset's fingerprint; `None` lets
            `datasets` hash the whole table.

    Returns:
        `datasets.Dataset`: The rows; `images` has the feature `List(Image(mode="RGB"))` so that it decodes
        on access; fields missing from some rows are `None` there.

    Raises:
        DataConfigError: A field has incompatible types across records.
    """
    names = list(FIXED_COLUMNS)
    for _, rows in parts:
        for row in rows:
            names.extend(key for key in row if key not in names)
    table = pa.table({name: _column(name, parts, config_file) for name in names})
    features = Features.from_arrow_schema(table.schema)
    features["images"] = List(Image(mode="RGB"))
    return Dataset(table, info=DatasetInfo(features=features), fingerprint=fingerprint)
