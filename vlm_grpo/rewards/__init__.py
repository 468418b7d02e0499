"""Reward functions for GRPO on vision-language tasks, and the registry that builds them from config.

Every reward is called as TRL calls rewards, `fn(completions, solution, **kwargs) -> list[float | None]`:
`completions` holds plain strings or conversational messages, every dataset column arrives as a keyword
list aligned with them, and unknown keyword arguments are ignored. `None` means "this reward does not apply
to this sample" (TRL turns it into NaN and leaves it out of the weighted sum); the accuracy rewards return it
only for a record whose `solution` is `None`, the format rewards never.

Built-in rewards (`REWARDS`): `format`, `rec_format`, `iou`, `choice_accuracy`,
`math_accuracy`, `geo3k` and `accuracy`; and `judge` (`REWARD_BUILDERS`), a model's verdict, built once per
spec with its options. `get_reward` returns one by name (or dotted path) with options bound; `build_rewards` turns
the YAML list of specs into TRL's `reward_funcs` and `reward_weights`, and `connect_rewards` reaches the judges
before training.
"""

from .accuracy import ACCURACY_METHODS, METHOD_ALIASES, accuracy
from .choice import choice_accuracy
from .formatting import format_reward
from .grounding import box_iou, iou, rec_format
from .judge import JudgeReward
from .mathematics import geo3k, math_accuracy, math_equal
from .registry import (
    REWARD_BUILDERS,
    REWARDS,
    AsyncNamedReward,
    BuiltReward,
    NamedReward,
    build_rewards,
    connect_rewards,
    get_reward,
)

__all__ = [
    "ACCURACY_METHODS",
    "METHOD_ALIASES",
    "REWARDS",
    "REWARD_BUILDERS",
    "AsyncNamedReward",
    "BuiltReward",
    "JudgeReward",
    "NamedReward",
    "accuracy",
    "box_iou",
    "build_rewards",
    "choice_accuracy",
    "connect_rewards",
    "format_reward",
    "geo3k",
    "get_reward",
    "iou",
    "math_accuracy",
    "math_equal",
    "rec_format",
]
