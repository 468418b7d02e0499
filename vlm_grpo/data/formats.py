"""Record formats: turning one record of a data file into a problem, a solution, images and extra fields.

Detection rule, applied to each record on its own:

1. A record with a `conversations` field is a *conversation* record (VLM-R1 JSONL): `conversations` is
   `[{"from": "human", "value": "<image>\\nWhat ..."}, {"from": "gpt", "value": "..."}]` (`user` and
   `assistant` are accepted as role names); the human value becomes `problem` and the gpt value becomes
   `solution`.
2. Otherwise the record must have `problem` and is a *problem* record: VLM-R1 JSON (`problem` +
   `solution`) or verl/EasyR1 parquet (`problem` + `answer`). `solution` is used when present, else
   `answer` (which is then not kept as a separate field).

In both, images come from `image` or `images` (at most one of them): `None`, a path, raw bytes, a
`{"bytes", "path"}` mapping, or a list of these (see `vlm_grpo.data.images`). Videos come from `video` (one: a video
file path, or a list of frame file paths) or `videos` (a list of such videos), at most one of them (see
`vlm_grpo.data.videos`). Audio is not read: a record whose `audio` or `audios` field holds anything
(`UNSUPPORTED_MEDIA_FIELDS`) is an error, never a prompt trained without it.

`solution` is always a string: strings are kept as is, other JSON values (numbers, box lists such as
`[x1, y1, x2, y2]`, mappings) become their `json.dumps` text, e.g. `"[10, 20, 30, 40]"`.

All other fields are kept unchanged for the reward functions, together with `problem`: every dataset column
reaches each reward as a keyword argument (a field named like one of the rewards' own arguments, `REWARD_ARGUMENTS`,
is an error). The consumed fields `image`, `images`, `conversations`, `solution`
(replaced by its text form) and, when it became the solution, `answer` are not kept as they were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import record_error
from .images import ImageRef, image_refs_from_value
from .readers import Record
from .videos import VideoRef, video_refs_from_value

RESERVED_FIELDS = ("prompt", "image_paths", "source")
"""Output columns that a record may not bring itself (they would be overwritten)."""

REWARD_ARGUMENTS = (
    "prompts",
    "completions",
    "completion",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
)
"""Names TRL 1.16 gives a reward's arguments itself, or keeps from the rewards (`completion`, `completion_ids`): a
record field of one of these names would never reach a reward, so a record may not bring one."""

UNSUPPORTED_MEDIA_FIELDS = {"audio": "audio", "audios": "audio"}
"""Media fields the loader does not read, with their kind: a record that fills one is refused, since its prompt would
otherwise be trained without that input (an empty value, `null` or `[]`, is accepted and passed on like any field)."""

HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "assistant")


@dataclass
class ParsedRecord:
    """A record in the loader's common shape.

    Attributes:
        problem (`str`): The problem text; may hold `<image>` and `<video>` placeholders.
        solution (`str`): The reference solution as a string.
        images (`list[ImageRef]`): The record's images, resolved; empty for text-only records.
        image_field (`str | None`): The field the images came from (`"image"` or `"images"`), for messages.
        videos (`list[VideoRef]`): The record's videos, resolved; empty for records without video.
        video_field (`str | None`): The field the videos came from (`"video"` or `"videos"`), for messages.
        extras (`dict`): Fields kept in the output row, including `problem`.
        template_fields (`dict`): Fields a prompt template may name: all of the record's fields plus `problem`.
    """

    problem: str
    solution: str
    images: list[ImageRef] = field(default_factory=list)
    image_field: str | None = None
    videos: list[VideoRef] = field(default_factory=list)
    video_field: str | None = None
    extras: dict = field(default_factory=dict)
    template_fields: dict = field(default_factory=dict)


def solution_to_text(value: object) -> str:
    """Turn a solution value into the string stored in the `solution` column.

    Args:
        value (`object`): A string, or any JSON value (number, bool, list, mapping).

    Returns:
        `str`: `value` itself for a string, else `json.dumps(value, ensure_ascii=False)`.

    Raises:
        TypeError: `value` is not JSON serialisable.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _conversation(file: str, record: Record) -> tuple[str, str]:
    turns = record.fields["conversations"]
    shape = "a list of two turns [{'from': 'human', 'value': ...}, {'from': 'gpt', 'value': ...}]"
    if not isinstance(turns, list) or len(turns) != 2:
        got = f"{len(turns)} turns" if isinstance(turns, list) else type(turns).__name__
        raise record_error(
            file, record.where, "conversations", f"expected {shape}, got {got}; fix the record"
        )
    for k, (turn, roles) in enumerate(zip(turns, (HUMAN_ROLES, GPT_ROLES))):
        if (
            not isinstance(turn, dict)
            or turn.get("from") not in roles
            or not isinstance(turn.get("value"), str)
        ):
            raise record_error(
                file,
                record.where,
                "conversations",
                f"turn {k} must be {{'from': one of {list(roles)}, 'value': <string>}}, got {turn!r:.80}; "
                f"expected {shape}",
            )
    return turns[0]["value"], turns[1]["value"]


def _media(file: str, record: Record, names: tuple[str, str], resolve) -> tuple[str | None, list]:
    """`(field, references)` of one kind of media, from the one of its two fields (`names`, e.g. `image`/`images`)
    that the record fills; `(None, [])` when it fills neither.

    Args:
        resolve (`Callable[[object, str], list]`): the references of a field's value, given the value and the field.

    Raises:
        DataConfigError: the record fills both fields, or a value is malformed.
    """
    present = [name for name in names if record.fields.get(name) is not None]
    if len(present) > 1:
        raise record_error(
            file, record.where, names[1], f"record has both '{names[0]}' and '{names[1]}'; keep only one"
        )
    if not present:
        return None, []
    try:
        return present[0], resolve(record.fields[present[0]], present[0])
    except ValueError as exc:
        raise record_error(file, record.where, present[0], f"{exc}") from exc


def parse_record(file: str, record: Record, image_root: str) -> ParsedRecord:
    """Detect a record's format and bring it into the common shape.

    Args:
        file (`str`): Path of the data file, for messages.
        record (`Record`): The record.
        image_root (`str`): Absolute folder that relative image paths resolve against.

    Returns:
        `ParsedRecord`: The record's problem, solution, images and kept fields.

    Raises:
        DataConfigError: A needed field is missing, a field has the wrong type, the record brings one of
            `RESERVED_FIELDS` or `REWARD_ARGUMENTS`, or it fills one of `UNSUPPORTED_MEDIA_FIELDS`.
    """
    fields = record.fields
    for name in RESERVED_FIELDS:
        if name in fields:
            raise record_error(
                file,
                record.where,
                name,
                f"'{name}' is an output column the loader builds; rename the field in the data",
            )
    for name in REWARD_ARGUMENTS:
        if name in fields:
            raise record_error(
                file,
                record.where,
                name,
                f"'{name}' is a name the trainer gives the rewards' own arguments, so this field would never reach a "
                "reward; rename the field in the data",
            )
    for name, kind in UNSUPPORTED_MEDIA_FIELDS.items():
        if fields.get(name) not in (None, "", [], {}):
            raise record_error(
                file,
                record.where,
                name,
                f"{kind} input is not supported, only images and videos, so this record would train without its "
                f"{kind}; remove the field or the record",
            )
    consumed = {"image", "images", "video", "videos", "solution"}
    if fields.get("conversations") is not None:
        problem, solution = _conversation(file, record)
        consumed.add("conversations")
        if "problem" in fields or "solution" in fields:
            raise record_error(
                file,
                record.where,
                "conversations",
                "record has both conversations and problem/solution; keep only one of the two forms",
            )
    elif "problem" in fields:
        problem = fields["problem"]
        if not isinstance(problem, str):
            raise record_error(
                file,
                record.where,
                "problem",
                f"expected a string, got {type(problem).__name__} ({problem!r:.60})",
            )
        if fields.get("solution") is not None:
            solution_field = "solution"
        elif fields.get("answer") is not None:
            solution_field = "answer"
            consumed.add("answer")
        else:
            raise record_error(
                file,
                record.where,
                "solution",
                "record has a problem but no 'solution' (or 'answer'); add the reference solution",
            )
        try:
            solution = solution_to_text(fields[solution_field])
        except (TypeError, ValueError) as exc:
            raise record_error(
                file, record.where, solution_field, f"cannot store it as text ({exc})"
            ) from exc
    else:
        raise record_error(
            file,
            record.where,
            "problem",
            "record has neither 'problem' (with 'solution' or 'answer') nor 'conversations'; "
            f"found fields {sorted(fields)}",
        )

    image_field, images = _media(
        file, record, ("image", "images"), lambda v, f: image_refs_from_value(v, image_root)
    )
    video_field, videos = _media(
        file,
        record,
        ("video", "videos"),
        lambda v, f: video_refs_from_value(v, image_root, many=f == "videos"),
    )

    extras = {key: value for key, value in fields.items() if key not in consumed}
    extras["problem"] = problem
    return ParsedRecord(
        problem=problem,
        solution=solution,
        images=images,
        image_field=image_field,
        videos=videos,
        video_field=video_field,
        extras=extras,
        template_fields={**fields, "problem": problem},
    )
