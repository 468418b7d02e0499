"""How commands report bad input: one line naming what and where, exit status 1, no traceback.

Only `VLMGRPOError`, raised by `vlm_grpo`'s own validation, is reported that way; any other exception is a bug
and keeps its traceback. Usage errors of a command line (argparse's own) exit with status 1 as well.
`--debug` anywhere on a command line keeps the full traceback of a `VLMGRPOError` too.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable

EXIT_USER_ERROR = 1
"""The exit status of every command on bad input: a `VLMGRPOError` or a command-line usage error."""

_ARGPARSE_USAGE_ERROR = 2  # what `argparse.ArgumentParser.error` exits with


class VLMGRPOError(ValueError):
    """Bad input found by `vlm_grpo`'s own validation: a config, data file, reward, model folder or option.

    The message is one line that names what is wrong and where (file, record, key, option) and says what to do.
    Commands print it as one line and exit with status 1; any other exception is a bug and keeps its traceback.
    It subclasses `ValueError` so that code catching TRL's validation errors catches ours too.
    """


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the valid name closest to `name`, or "" when none is near."""
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_line(error: BaseException) -> str:
    """The error's message on one line (TRL and transformers messages often span several)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(text).split()) or type(error).__name__


def run_cli(name: str, main: Callable[[list[str]], None], argv: list[str]) -> None:
    """Run `main(argv)`; on a `VLMGRPOError` print `vlm-grpo NAME: error: MESSAGE` and exit with status 1.

    Args:
        name (`str`): the command's name, for the message.
        main (`Callable[[list[str]], None]`): the command's entry point.
        argv (`list[str]`): its arguments; `--debug` is removed and turns the one-line report off.
    """
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        main(argv)
    except SystemExit as error:
        if error.code == _ARGPARSE_USAGE_ERROR:  # argparse printed its usage and message already
            raise SystemExit(EXIT_USER_ERROR) from None
        raise
    except VLMGRPOError as error:
        if debug:
            raise
        # One write of the whole line: processes of one launch share stderr, and a separate newline write (print,
        # unbuffered) lets another process's line land in between.
        sys.stderr.write(f"vlm-grpo {name}: error: {one_line(error)} (add --debug for the traceback)\n")
        sys.stderr.flush()
        raise SystemExit(EXIT_USER_ERROR) from None
