"""The options of `vlm-grpo train`: what to train on (`ScriptArguments`), the parser over it and TRL's configs, the
training YAML, and the checks of its keys and flags (one line naming the key or flag, with the closest option).

`vlm-grpo plan` reads the same YAML and flags, so both commands share these.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import VLMGRPOError, did_you_mean, one_line

if TYPE_CHECKING:
    from trl import TrlParser


USAGE = "vlm-grpo train CONFIG.yaml [--option value ...]"


CONFIG_FILE_KEYS = ("env",)


@dataclass
class ScriptArguments:
    """What to train on.

    Parameters:
        data_config (`str`): YAML data config (see `vlm_grpo.data.load_data_config`).
        rewards (`list`, defaults to `["format"]`): reward names, dotted paths to the user's functions, or (in
            YAML) mappings `{name: iou, weight: 1.0, ...}`; other keys are options passed to the reward, and each
            must be a keyword the reward function takes (a user function with `**kwargs` takes any).
        eval_data_config (`str | None`): optional YAML data config for evaluation during training.
        tools (`list`, defaults to `[]`): dotted paths `package.module.function` to tools the model may call
            (TRL's `tools`; see docs/tools.md).
        environment_factory (`str | None`): dotted path `package.module.Class` to an environment built once per
            row, whose public methods are that row's tools (TRL's `environment_factory`; see docs/tools.md).
    """

    data_config: str | None = field(default=None, metadata={"help": "YAML data config to train on."})
    rewards: list[str] = field(
        default_factory=lambda: ["format"],
        metadata={"help": "Reward names or dotted paths; in YAML also {name, weight, options...} mappings."},
    )
    eval_data_config: str | None = field(default=None, metadata={"help": "YAML data config for evaluation."})
    tools: list[str] = field(
        default_factory=list,
        metadata={"help": "Dotted paths package.module.function of tools the model may call."},
    )
    environment_factory: str | None = field(
        default=None,
        metadata={"help": "Dotted path package.module.Class of a per-row environment (its tools)."},
    )


def build_parser() -> TrlParser:
    """The parser of `vlm-grpo train`: our own options first in `--help`, then TRL's and transformers' ones."""
    from trl import GRPOConfig, TrlParser

    from ..config import VLMGRPOConfig, VLMModelConfig

    parser = TrlParser(
        (ScriptArguments, VLMGRPOConfig, VLMModelConfig),
        prog="vlm-grpo train",
        usage=USAGE,
        description="Train a vision-language model with GRPO. CONFIG.yaml gives a value to any option below; "
        "a flag on the command line overrides it.",
        allow_abbrev=False,
    )
    grpo_fields = {f.name for f in fields(GRPOConfig)}
    own_fields = [f.name for f in fields(VLMGRPOConfig) if f.name not in grpo_fields]
    script_fields = [f.name for f in fields(ScriptArguments)]
    _group_first(parser, "what to train", ["help", "model_name_or_path", *script_fields])
    _group_first(parser, "vision-language options (VLMGRPOConfig)", own_fields)
    parser._optionals.title = (
        "TRL and transformers options (trl.GRPOConfig, TrainingArguments, trl.ModelConfig)"
    )
    return parser


def _group_first(parser: argparse.ArgumentParser, title: str, dests: list[str]) -> None:
    """Move the options of `dests` into a new help section shown before the default options section."""
    group = parser.add_argument_group(title)
    parser._action_groups.remove(group)
    parser._action_groups.insert(parser._action_groups.index(parser._optionals), group)
    moved = [a for a in parser._optionals._group_actions if a.dest in dests]
    for action in sorted(moved, key=lambda a: dests.index(a.dest)):
        parser._optionals._group_actions.remove(action)
        group._group_actions.append(action)


def read_config(path: str) -> dict[str, Any]:
    """Read a training YAML; a missing file, a syntax error or a non-mapping is a `VLMGRPOError` naming it."""
    if not Path(path).is_file():
        raise VLMGRPOError(f"training config {path} not found; pass the path of an existing YAML file.")
    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise VLMGRPOError(f"{path}: not valid YAML ({one_line(error)}); fix the syntax.") from error
    if not isinstance(config, dict):
        raise VLMGRPOError(
            f"{path}: expected a mapping of option names to values, got {type(config).__name__}."
        )
    return config


def parser_options(parser: TrlParser) -> dict[str, Any]:
    """The parser's YAML keys, flags, help texts, defaults and our own options in order, as
    `vlm_grpo.cli.option_help.read_options` reads them from the source."""
    actions = [a for a in parser._actions if a.dest != "help"]
    own_group = [
        g for g in parser._action_groups if g.title and g.title.startswith(("what to", "vision-language"))
    ]
    return {
        "names": sorted({a.dest for a in actions}),
        "flags": sorted(flag for a in actions for flag in a.option_strings if flag.startswith("--")),
        "help": {a.dest: a.help or "" for a in actions},
        "defaults": {a.dest: parser.get_default(a.dest) for a in actions},
        "own": [a.dest for g in own_group for a in g._group_actions if a.dest != "help"],
    }


def check_config_keys(config: dict[str, Any], path: str, names: Iterable[str]) -> None:
    """Refuse top-level keys that name no option, each with the closest valid name."""
    valid = set(names) | set(CONFIG_FILE_KEYS)
    unknown = [str(key) for key in config if key not in valid]
    if unknown:
        named = ", ".join(f"{key!r}{did_you_mean(key, valid)}" for key in unknown)
        raise VLMGRPOError(
            f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {named}; fix or remove "
            f"{'them' if len(unknown) > 1 else 'it'} (`vlm-grpo train --help-all` lists every option)."
        )


def check_flags(argv: list[str], flags: Iterable[str]) -> None:
    """Refuse command-line flags that name no option, with the closest valid flag."""
    valid = list(flags)
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and flag not in valid:
            raise VLMGRPOError(
                f"unknown option {flag}{did_you_mean(flag, valid)}; `vlm-grpo train --help-all` lists every option."
            )


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(model: str) -> bool:
    """Whether a model path that names nothing here is read as a Hugging Face hub id rather than a local path.

    The one rule of every command that takes a model (`vlm-grpo train`'s `model_name_or_path`, `vlm-grpo eval`'s
    `--model`, a LoRA adapter's base model): a hub id is `owner/name`, one `/` between two names of letters, digits,
    `-`, `_` and `.` (each starting with a letter or digit), whose `owner` is no folder in the working directory.
    Anything else is a local path: one starting with `.`, `/` or `~`, one with a further `/` (or a `\\`), a bare
    name, or `runs/tiny` when a `runs/` folder is here.

    Args:
        model (`str`): the model path or hub id as given.
    """
    return bool(_HUB_ID.match(model)) and not Path(model.split("/", 1)[0]).is_dir()


def check_model_path(model: str, where: str) -> None:
    """Refuse a model path that names no saved model here and is no hub id (see `is_hub_id`), before any heavy import.

    A folder must hold a saved model (`config.json`) or a LoRA adapter (`adapter_config.json`); a hub id is left to
    `from_pretrained`.

    Args:
        model (`str`): the model path or hub id as given.
        where (`str`): the option it came from, for the message (`"--model"`, `"train.yaml: model_name_or_path"`).

    Raises:
        VLMGRPOError: a local path that is missing, a file, or a folder without a saved model; the message names
            `where` and the path.
    """
    folder = Path(model)
    if folder.is_dir():
        if not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):
            raise VLMGRPOError(
                f"{where}: {model} holds no config.json (nor a LoRA adapter); point it at a saved model."
            )
        return
    if folder.exists():
        raise VLMGRPOError(
            f"{where}: {model} is a file; point it at a model folder (or a hub id owner/name)."
        )
    if is_hub_id(model):
        return
    if model.startswith("~") and folder.expanduser().exists():
        raise VLMGRPOError(
            f"{where}: model folder {model} not found: `~` is not expanded there; write the full path."
        )
    relative = "" if folder.is_absolute() else f" (relative to the working directory {Path.cwd()})"
    raise VLMGRPOError(
        f"{where}: model folder {model} not found{relative}; fix the path, or give a hub id as owner/name."
    )
