"""The single error type of the data loader and helpers that word its messages."""

from __future__ import annotations

from ..errors import VLMGRPOError


class DataConfigError(VLMGRPOError):
    """A data config or a data file is invalid (a `VLMGRPOError`: commands report it in one line).

    The message is one line that names the file (YAML config or data file), the entry or record and the
    field at fault, and says what to change.
    """


def record_error(file: str, where: str, field: str | None, message: str) -> DataConfigError:
    """Build a `DataConfigError` about one record of a data file.

    Args:
        file (`str`): Path of the data file.
        where (`str`): The record's position, e.g. `"record 3"` or `"record 3 (line 5)"`.
        field (`str | None`): The field at fault, or `None` when the whole record is.
        message (`str`): What is wrong and what to do, without a trailing period.

    Returns:
        `DataConfigError`: The error, to be raised by the caller.
    """
    field_part = f", field '{field}'" if field is not None else ""
    return DataConfigError(f"{file}: {where}{field_part}: {message}")


def entry_error(config_file: str, entry_index: int, key: str | None, message: str) -> DataConfigError:
    """Build a `DataConfigError` about one `datasets` entry of a YAML data config.

    Args:
        config_file (`str`): Path of the YAML config.
        entry_index (`int`): 0-based position of the entry in the `datasets` list.
        key (`str | None`): The key at fault, or `None` when the whole entry is.
        message (`str`): What is wrong and what to do, without a trailing period.

    Returns:
        `DataConfigError`: The error, to be raised by the caller.
    """
    key_part = f", key '{key}'" if key is not None else ""
    return DataConfigError(f"{config_file}: datasets entry {entry_index}{key_part}: {message}")
