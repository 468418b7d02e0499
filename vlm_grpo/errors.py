"""How commands report bad input: one line naming what and where, exit code 1, no traceback.

`--debug` anywhere on a command line keeps the full traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import yaml


class VLMGRPOError(ValueError):
    """Bad input found by `vlm_grpo`'s own validation: a config, data file, reward, model folder or option.

    The message is one line that names what is wrong and where (file, record, key, option) and says what to do.
    Commands print it as one line and exit with status 1; any other exception is a bug and keeps its traceback.
    It subclasses `ValueError` so that code catching TRL's validation errors catches ours too.
    """

# Errors raised for bad input: configs, data, rewards, models. Anything else is a bug and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    KeyError,
    OSError,
    ImportError,
    yaml.YAMLError,
)


def one_line(error: BaseException) -> str:
    """The error's message on one line (TRL and transformers messages often span several)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(text).split()) or type(error).__name__


def run_cli(name: str, main: Callable[[list[str]], None], argv: list[str]) -> None:
    """Run `main(argv)`; on a user error print `vlm-grpo NAME: error: MESSAGE` and exit with status 1.

    Args:
        name (`str`): the command's name, for the message.
        main (`Callable[[list[str]], None]`): the command's entry point.
        argv (`list[str]`): its arguments; `--debug` is removed and turns the clean error off.
    """
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if debug:
        main(argv)
        return
    try:
        main(argv)
    except USER_ERRORS as error:
        print(f"vlm-grpo {name}: error: {one_line(error)} (add --debug for the traceback)", file=sys.stderr)
        raise SystemExit(1) from None
