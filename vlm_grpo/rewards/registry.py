"""The reward registry: built-in rewards by name, user rewards by dotted path, and YAML reward specs."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..dotted import import_dotted
from ..errors import VLMGRPOError, did_you_mean
from .accuracy import accuracy
from .choice import choice_accuracy
from .formatting import format_reward
from .grounding import iou, rec_format
from .judge import JudgeReward
from .mathematics import geo3k, math_accuracy

RewardFunc = Callable[..., list[float | None]]

REWARDS: dict[str, RewardFunc] = {
    "format": format_reward,
    "rec_format": rec_format,
    "iou": iou,
    "choice_accuracy": choice_accuracy,
    "math_accuracy": math_accuracy,
    "geo3k": geo3k,
    "accuracy": accuracy,
}
"""Built-in rewards by name. Each is called as TRL calls rewards: `fn(completions, solution, **kwargs)`."""

REWARD_BUILDERS: dict[str, Callable[..., Any]] = {
    "judge": JudgeReward,
}
"""Built-in rewards that hold state for a run (a client, a cache): `builder(**options)` is built once per spec and
awaited as TRL awaits async rewards, with `reward_name=` the name it is logged under (see `BuiltReward`). Each has
`connect()`, which `connect_rewards` calls before training."""

TRL_CALL_ARGUMENTS = ("completions", "prompts", "completion_ids", "trainer_state", "log_metric", "log_extra")
"""Keywords TRL passes to every reward call; never options of a reward spec."""


class NamedReward:
    """A reward function with bound options and the name TRL logs it under.

    TRL logs each reward's metrics under `reward_func.__name__` (`rewards/<name>/mean`); this wrapper
    carries that name as an attribute. It is picklable when the wrapped function is (module-level functions
    are). Bound options take precedence over keyword arguments of the same name given at call time.

    Args:
        func (`Callable`): the reward function.
        name (`str`): the name to log under (`__name__`).
        options (`Mapping[str, Any] | None`, *optional*, defaults to `None`): keyword arguments bound to every
            call.
    """

    def __init__(self, func: Callable[..., Any], name: str, options: Mapping[str, Any] | None = None) -> None:
        self.func = func
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = getattr(func, "__doc__", None)
        self.options = dict(options or {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **{**kwargs, **self.options})

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"NamedReward({self.__name__!r}{options})"


class AsyncNamedReward(NamedReward):
    """`NamedReward` for an `async` reward function; TRL awaits it (it checks `__call__`)."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self.func(*args, **{**kwargs, **self.options})


class BuiltReward(AsyncNamedReward):
    """`AsyncNamedReward` for a reward of `REWARD_BUILDERS`: the object built from the spec's options, called with
    the name it is logged under (`reward_name=`), so that its metrics and columns follow a renamed spec (`judge_2`)."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self.func(*args, **kwargs, reward_name=self.__name__)


def connect_rewards(funcs: Iterable[NamedReward]) -> None:
    """Reach what the rewards need outside the process (a judge's endpoint or model) once, before training.

    Args:
        funcs (`Iterable[NamedReward]`): the rewards `build_rewards` built.

    Raises:
        VLMGRPOError: one line naming the judge that cannot be reached or loaded.
    """
    for func in funcs:
        if isinstance(func, BuiltReward):
            func.func.connect()


def _is_async(func: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def _import_reward(path: str) -> tuple[Callable[..., Any], str]:
    """Import `package.module.attr` and return the callable and its name."""
    func = import_dotted(path, "Reward", "package.module.function")
    attr = path.rpartition(".")[2]
    module_name = path.rpartition(".")[0]
    if not callable(func):
        raise VLMGRPOError(
            f"Reward {path!r}: {attr!r} in {module_name!r} is a {type(func).__name__}, not a callable. "
            "Point to a function fn(completions, **kwargs) -> list[float | None]."
        )
    name = getattr(func, "__name__", None) or attr
    return func, name


def get_reward(name: str, **kwargs: Any) -> NamedReward:
    """Return the reward called `name`, with `kwargs` bound as its options.

    Args:
        name (`str`): a key of `REWARDS` (`format`, `rec_format`, `iou`, `choice_accuracy`,
            `math_accuracy`, `geo3k`, `accuracy`) or of `REWARD_BUILDERS` (`judge`), or a dotted path
            `package.module.function` to a user reward, imported with `importlib`.
        **kwargs (`Any`): options bound to every call, e.g. `coords="norm1000"` for `iou`. Each must be a
            keyword the function names in its signature; a user function that takes `**kwargs` accepts any.

    Returns:
        `NamedReward`: a callable `fn(completions, solution, **kwargs)` whose `__name__` is `name` for a
        built-in and the function's own `__name__` for a dotted path. An `async` user function gives an
        `AsyncNamedReward`, a `REWARD_BUILDERS` one a `BuiltReward`.

    Raises:
        VLMGRPOError: an unknown name without a dot (the message lists the built-in names), a dotted path
            whose module or attribute is missing or is not callable, or an option the reward does not take.
    """
    return _make_reward(name, kwargs)


def _make_reward(name: Any, options: Mapping[str, Any], spec_keys: tuple[str, ...] = ()) -> NamedReward:
    """`get_reward`; `spec_keys` are the other keys valid where the options came from (`name`, `weight`)."""
    if not isinstance(name, str) or not name.strip():
        raise VLMGRPOError(
            f"Reward name must be a non-empty string, got {name!r}. Built-in rewards: {_builtins()}."
        )
    name = name.strip()
    if name in REWARDS:
        _check_options(name, REWARDS[name], options, spec_keys, any_keyword=False)
        return NamedReward(REWARDS[name], name, options)
    if name in REWARD_BUILDERS:
        _check_options(name, REWARD_BUILDERS[name], options, spec_keys, any_keyword=False)
        return BuiltReward(REWARD_BUILDERS[name](**options), name)
    if "." not in name:
        raise VLMGRPOError(
            f"Unknown reward {name!r}{did_you_mean(name, [*REWARDS, *REWARD_BUILDERS])}. Built-in rewards: "
            f"{_builtins()}; or give a dotted path 'package.module.function' to your own reward."
        )
    func, func_name = _import_reward(name)
    _check_options(name, func, options, spec_keys, any_keyword=True)
    wrapper = AsyncNamedReward if _is_async(func) else NamedReward
    return wrapper(func, func_name, options)


def reward_options(func: Callable[..., Any]) -> tuple[list[str], bool] | None:
    """The options a reward takes: the keywords its signature names (not `completions` nor TRL's call
    arguments), and whether it also takes `**kwargs`; None when Python cannot read its signature."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # some C callables have no readable signature
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [p.name for p in parameters if p.kind in kinds and p.name not in TRL_CALL_ARGUMENTS]
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _check_options(
    name: str,
    func: Callable[..., Any],
    options: Mapping[str, Any],
    spec_keys: tuple[str, ...],
    any_keyword: bool,
) -> None:
    """Refuse an option the reward does not take, naming the closest valid key.

    Built-in rewards take `**kwargs` only to receive the dataset columns, so their options are the keywords
    they name; a user reward that takes `**kwargs` (`any_keyword`) accepts any option.
    """
    accepted = reward_options(func)
    if accepted is None:
        return
    named, takes_kwargs = accepted
    if takes_kwargs and any_keyword:
        return
    for key in options:
        if key not in named:
            valid = [*spec_keys, *named]
            raise VLMGRPOError(
                f"reward {name!r}: unknown key {key!r}{did_you_mean(str(key), valid)}; valid keys: {', '.join(valid) or 'none'}."
            )


def _builtins() -> str:
    return ", ".join([*REWARDS, *REWARD_BUILDERS])


def build_rewards(specs: Iterable[str | Mapping[str, Any]] | None) -> tuple[list[NamedReward], list[float]]:
    """Build TRL's `reward_funcs` and `reward_weights` from the YAML list of reward specs.

    Each spec is either a name (weight 1.0) or a mapping with `name`, an optional `weight` (a number,
    default 1.0) and any other keys, which are bound as options of the reward::

        rewards:
          - {name: iou, weight: 1.0, coords: norm1000}
          - {name: rec_format, weight: 0.5}
          - {name: my_pkg.rewards.length_penalty}
          - format

    When two specs give the same logged name (`iou` twice with different options), the later ones are
    logged as `iou_2`, `iou_3`, ... so that their metrics stay apart.

    Args:
        specs (`Iterable[str | Mapping[str, Any]] | None`): the specs; `None` or empty gives no rewards.

    Returns:
        `tuple[list[NamedReward], list[float]]`: the reward callables and their weights, in spec order.

    Raises:
        VLMGRPOError: a spec that is neither a string nor a mapping, a mapping without `name`, a weight that
            is not a number, or a name `get_reward` rejects.
    """
    if specs is None:
        return [], []
    if isinstance(specs, (str, Mapping)):
        raise VLMGRPOError(
            f"Reward specs must be a list of names or mappings, got {type(specs).__name__}: {specs!r}."
        )
    funcs: list[NamedReward] = []
    weights: list[float] = []
    taken: set[str] = set()
    for position, spec in enumerate(specs):
        if isinstance(spec, str):
            name, weight, options = spec, 1.0, {}
        elif isinstance(spec, Mapping):
            if "name" not in spec:
                raise VLMGRPOError(
                    f"Reward spec #{position} {dict(spec)!r} has no 'name'; write e.g. {{name: iou, weight: 1.0}}."
                )
            options = {k: v for k, v in spec.items() if k not in ("name", "weight")}
            name, weight = spec["name"], spec.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
                raise VLMGRPOError(
                    f"Reward spec #{position} ({name}): weight must be a finite number, got {type(weight).__name__} {weight!r}."
                )
        else:
            raise VLMGRPOError(
                f"Reward spec #{position} must be a name or a mapping with 'name', got {type(spec).__name__}: {spec!r}."
            )
        reward = _make_reward(name, options, spec_keys=("name", "weight"))
        logged, count = reward.__name__, 1
        while logged in taken:
            count += 1
            logged = f"{reward.__name__}_{count}"
        taken.add(logged)
        reward.__name__ = reward.__qualname__ = logged
        funcs.append(reward)
        weights.append(float(weight))
    return funcs, weights
