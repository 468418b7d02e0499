"""Reading the records of one data file (.json, .jsonl or .parquet) into Python dicts."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import DataConfigError, record_error


@dataclass(frozen=True)
class Record:
    """One record of a data file.

    Attributes:
        index (`int`): 0-based position of the record in the file (blank JSONL lines are not counted).
        fields (`dict`): The record's fields.
        line (`int | None`, *optional*, defaults to `None`): 1-based line number, for JSONL files.
    """

    index: int
    fields: dict
    line: int | None = None

    @property
    def where(self) -> str:
        """Position for messages, 1-based: `"record 3"` (the third) or `"record 3 (line 5)"`."""
        return (
            f"record {self.index + 1}" if self.line is None else f"record {self.index + 1} (line {self.line})"
        )


def read_records(path: str, kind: str) -> list[Record]:
    """Read all records of a data file.

    Args:
        path (`str`): Path of the data file.
        kind (`str`): `"json"` (a JSON list of objects), `"jsonl"` (one JSON object per line; blank lines
            are skipped) or `"parquet"`.

    Returns:
        `list[Record]`: The records, in file order.

    Raises:
        DataConfigError: The file cannot be read or parsed, or a record is not a JSON object.
    """
    if kind == "json":
        return _read_json(path)
    if kind == "jsonl":
        return _read_jsonl(path)
    if kind == "parquet":
        return _read_parquet(path)
    raise ValueError(f"unknown data file kind {kind!r}; expected json, jsonl or parquet")


def _check_object(path: str, record: Record) -> Record:
    if not isinstance(record.fields, dict):
        raise record_error(
            path,
            record.where,
            None,
            f"expected a JSON object, got {type(record.fields).__name__}; fix the record",
        )
    return record


def _read_json(path: str) -> list[Record]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataConfigError(
            f"{path}: cannot read the file ({exc}); check its permissions and encoding"
        ) from exc
    except json.JSONDecodeError as exc:
        raise DataConfigError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}); fix the file "
            "(a file with one object per line must be named .jsonl)"
        ) from exc
    if not isinstance(data, list):
        raise DataConfigError(
            f"{path}: expected a JSON list of records at the top level, got {type(data).__name__}; "
            "wrap the records in [...] or store one object per line in a .jsonl file"
        )
    return [_check_object(path, Record(index=i, fields=fields)) for i, fields in enumerate(data)]


def _read_jsonl(path: str) -> list[Record]:
    records: list[Record] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    # without its line break: an error at the end of the line (a missing brace) is then at the
                    # column after its last character, not at column 1 of a second line
                    fields = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as exc:
                    raise DataConfigError(
                        f"{path}: record {len(records) + 1} (line {line_number}): invalid JSON ({exc.msg} at column "
                        f"{exc.colno}); fix or remove the line"
                    ) from exc
                records.append(
                    _check_object(path, Record(index=len(records), fields=fields, line=line_number))
                )
    except (OSError, UnicodeDecodeError) as exc:
        raise DataConfigError(
            f"{path}: cannot read the file ({exc}); check its permissions and encoding"
        ) from exc
    return records


def _read_parquet(path: str) -> list[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        detail = " ".join(str(exc).split())
        raise DataConfigError(
            f"{path}: cannot read the parquet file ({detail}); check that it is a valid parquet file"
        ) from exc
    return [Record(index=i, fields=fields) for i, fields in enumerate(table.to_pylist())]
