"""Objects named in a config by dotted path (`package.module.name`): a user's reward, tool or environment."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import VLMGRPOError


def import_dotted(path: str, what: str, expected: str) -> Any:
    """Import `package.module.name` and return the object it names.

    Args:
        path (`str`): the dotted path.
        what (`str`): what the path names, for the messages (`"Reward"`, `"Tool"`, `"environment_factory"`).
        expected (`str`): what it should point to, for the message of a path with no dot
            (`"package.module.function"`).

    Raises:
        VLMGRPOError: a path with no dot, a module that cannot be found, or a module without that name. A missing
            dependency inside the user's module is re-raised as it is.
    """
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise VLMGRPOError(f"{what} {path!r} is not a dotted path '{expected}'.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the module of the path itself (or a parent package) being absent is the user's path error;
        # a missing dependency inside the user's module is re-raised as is.
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise
        raise VLMGRPOError(
            f"{what} {path!r}: cannot import module {module_name!r} ({exc}). Check the spelling and that the "
            "module is importable (installed, or its folder on PYTHONPATH)."
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise VLMGRPOError(
            f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}. Check the name."
        ) from None
